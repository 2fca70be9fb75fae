"""A round and its trigger's rollouts file, as real flow runs: the file reaches the generator
only from an allowed folder; a refused path fails before the generator runs; an error that
cannot pass is not retried; nothing the file holds is echoed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from typer.testing import CliRunner

from dyngen.cli import app
from dyngen.flows.generation_round import generation_round
from dyngen.store import Store
from dyngen.trainers.rollouts import rollouts_dir
from tests.rows import verl_rows

pytestmark = pytest.mark.usefixtures("prefect_server")

SECRET = "SECRET_TOKEN=sk-live-93be0c1d5a7f2e64"


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "store")
    store.create("ds", verl_rows(4))
    return store


def config(store: Store, calls: Path) -> dict[str, Any]:
    """ReadsRollouts with the default rollouts folder and retries that would show."""
    return {"store": {"root": str(store.root)},
            "data": {"datagen": {"path": "pkg://tests.flows.gens", "name": "ReadsRollouts",
                                 "calls": str(calls)}},
            "round": {"retries": 2, "retry_delay_seconds": 0}}


def generate_run_counts(state: Any, timeout: float = 60.0) -> list[int]:
    """How many times each generate task run of the flow run ran, once the server has them
    (task runs reach it as events, a moment after the flow run ends)."""
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            runs = [r for r in client.read_task_runs(flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
                if r.name.startswith("generate") and r.state and r.state.is_final()]
            if runs or time.monotonic() > deadline:
                return [r.run_count for r in runs]
            time.sleep(0.5)


def test_rollouts_in_the_default_folder_reach_the_generator(store: Store, tmp_path: Path) -> None:
    path = rollouts_dir(store.root, "ds", "run-1") / "batch-1.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps({"prompt": f"What is {i} + 1?", "score": 0.5}) + "\n"
                            for i in range(2)))
    generation_round("ds", config(store, tmp_path / "calls"),
                     {"step": 1, "rollouts": str(path)})
    assert [e["index"] for e in store.load("ds")["extra_info"]][4:] == [601, 602, 501]
    assert store.head("ds").lineage["trigger"]["rollouts"] == str(path)


def test_a_path_outside_the_allowed_folders_fails_before_the_generator_runs(
        store: Store, tmp_path: Path) -> None:
    secret = tmp_path / "secret.env"
    secret.write_text(SECRET + "\n")
    state = generation_round("ds", config(store, tmp_path / "calls"),
                             {"step": 2, "rollouts": str(secret)}, return_state=True)
    assert state.is_failed()
    assert "is outside the allowed directories" in state.message
    assert str(store.root / "rollouts") in state.message
    assert not (tmp_path / "calls").exists(), "the generator ran"
    assert store.head_version("ds") == 0


def test_a_bad_rollouts_file_fails_the_round_once_and_echoes_nothing(
        store: Store, tmp_path: Path) -> None:
    leaked = rollouts_dir(store.root, "ds", "run-1") / "leaked.env"  # allowed, but not rollouts
    leaked.parent.mkdir(parents=True)
    leaked.write_text(SECRET + "\n")
    state = generation_round("ds", config(store, tmp_path / "calls"),
                             {"step": 3, "rollouts": str(leaked)}, return_state=True)
    assert state.is_failed()
    assert "line 1: expected a JSON object" in state.message
    assert "sk-live" not in state.message and "SECRET" not in state.message
    # Two retries are configured; an error that fails the same way again is not retried.
    assert (tmp_path / "calls").read_text() == "1"
    assert generate_run_counts(state) == [1]
    assert store.head_version("ds") == 0


def test_cli_round_allows_the_named_files_folder_but_keeps_the_bound(store: Store,
                                                                    tmp_path: Path) -> None:
    batch = tmp_path / "elsewhere" / "batch.jsonl"
    batch.parent.mkdir()
    batch.write_text(json.dumps({"prompt": "What is 5 + 5?", "score": 0.1}) + "\n")
    args = ["--root", str(store.root), "round", "ds", "data.datagen.path=pkg://tests.flows.gens",
            "data.datagen.name=ReadsRollouts", "round.retries=0", "--rollouts", str(batch)]
    over = CliRunner().invoke(app, [*args, "round.max_rollouts_bytes=8", "--step", "4"])
    assert over.exit_code == 2 and "over the bound round.max_rollouts_bytes=8" in over.output
    ok = CliRunner().invoke(app, [*args, "--step", "5"])
    assert ok.exit_code == 0, ok.output
    assert [e["index"] for e in store.load("ds")["extra_info"]][4:] == [601, 501]
