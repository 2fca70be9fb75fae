"""Proposer rounds on a served model (a real llama.cpp server), through the Prefect flow: what
they commit and record, what happens when a request, or the server, fails, and that the key
and torch stay out of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dyngen.errors import ModelUnavailableError
from dyngen.flows.generation_round import generation_round
from dyngen.server.processes import free_port
from dyngen.store import Store, verify
from tests.generators.proposer_tasks import HARD, task_dataset
from tests.llm.llama_server import MODEL_ALIAS, LlamaServer
from tests.llm.support import KEY, KEY_ENV, Records, key_set_and_every_log_kept, served

pytestmark = pytest.mark.usefixtures("prefect_server")

REPO = Path(__file__).resolve().parents[2]
HUGE = "Count the words: " + "word " * 1500  # longer than a slot's 1024 tokens
FEW = {"proposals_per_seed": 2, "max_new_tokens": 24, "max_passes": 1, "seed": 5}


def write_rollouts(path: Path, questions: list[str]) -> Path:
    """A batch in which `questions` scored lowest, in that order."""
    lines = [{"prompt": [{"role": "user", "content": q}], "score": i / 10}
             for i, q in enumerate(questions)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def round_config(store: Store, rollouts: Path, datagen: dict[str, Any],
                 **round_cfg: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config, trigger) of a proposer round on `store` seeded from `rollouts`."""
    cfg = {"store": {"root": str(store.root)},
           "data": {"filter_overlong_prompts": False,
                    "datagen": {"path": "pkg://dyngen.generators.proposer",
                                "name": "ProposerGenerator", **FEW, **datagen}},
           "round": {"retries": 0, "rollouts_dirs": [str(rollouts.parent)], **round_cfg}}
    return cfg, {"event_id": "batch-7", "step": 7, "rollouts": str(rollouts)}


def seeded_store(folder: Path) -> Store:
    store = Store(folder / "store")
    store.create("gsm", task_dataset(provenance=False))
    return store


@pytest.fixture(scope="module")
def served_round(llama: LlamaServer, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[tuple[Any, Store, Records]]:
    """One committed round: 3 seeds, one of them longer than the server's context."""
    folder = tmp_path_factory.mktemp("served-round")
    store = seeded_store(folder)
    rollouts = write_rollouts(folder / "batch.jsonl", [HARD[0][0], HUGE, HARD[1][0]])
    cfg, trigger = round_config(store, rollouts, served(llama, hard_k=3))
    with key_set_and_every_log_kept() as records:
        state = generation_round("gsm", cfg, trigger, return_state=True)
    yield state, store, records


def test_a_proposer_round_on_a_served_model_commits_and_records_the_model(
        served_round: tuple[Any, Store, Records], llama: LlamaServer) -> None:
    state, store, _ = served_round
    assert state.is_completed(), state.message
    assert store.head_version("gsm") == 1 and verify(store, "gsm") == []
    stats = store.head("gsm").lineage["generator"]["stats"]
    model = stats["model"]
    assert model["backend"] == "served" and model["model"] == MODEL_ALIAS
    assert model["endpoint"] == f"http://127.0.0.1:{llama.port}"
    assert model["requests"] == 3 and model["retries"] == 0
    assert model["prompt_tokens"] > 0 and model["completion_tokens"] > 0
    assert model["wait_seconds"] > 0
    assert stats["seeds"] == 3 and stats["proposed"] == 6
    rows = Store(store.root).load("gsm", 1).to_list()[len(task_dataset()):]
    assert len(rows) == store.head("gsm").lineage["counts"]["kept"]
    assert all(row["extra_info"]["model"] == MODEL_ALIAS for row in rows)


def test_a_prompt_longer_than_the_context_drops_its_seeds_proposals_as_model_error(
        served_round: tuple[Any, Store, Records]) -> None:
    _, store, _ = served_round
    stats = store.head("gsm").lineage["generator"]["stats"]
    assert stats["model"]["failures"] == 1 and stats["model"]["errors"] == {"bad_request": 1}
    assert stats["methods"]["none"] == {"proposed": 2, "kept": 0,
                                        "dropped": {"model_error": 2}}


def test_the_key_is_in_nothing_the_round_wrote(served_round: tuple[Any, Store, Records]) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        LogFilter,
        LogFilterFlowRunId,
    )

    state, store, records = served_round
    run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        parameters = json.dumps(client.read_flow_run(run_id).parameters)
        logs = [log.message for log in client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))]
        artifacts = [json.dumps([a.key, a.data, a.description], default=str)
                     for a in client.read_artifacts(artifact_filter=ArtifactFilter(
                         flow_run_id=ArtifactFilterFlowRunId(any_=[run_id])))]
    assert KEY_ENV in parameters  # the config travelled, with the variable's name only
    assert KEY not in parameters
    assert artifacts and not any(KEY in text for text in artifacts + logs)
    assert any("HTTP Request: POST" in line and "/chat/completions" in line
               for line in records.lines)  # the model client's own log is among them
    assert any("gsm: v0 → v1" in line for line in records.lines)  # and the round's
    assert not any(KEY in line for line in records.lines)
    files = [p for p in Path(store.root).rglob("*") if p.is_file()]
    assert files and not any(KEY.encode() in p.read_bytes() for p in files)


def test_a_round_whose_endpoint_is_unreachable_fails_fast_and_commits_nothing(
        tmp_path: Path) -> None:
    store = seeded_store(tmp_path)
    rollouts = write_rollouts(tmp_path / "batch.jsonl", [q for q, _ in HARD[:2]])
    url = f"http://127.0.0.1:{free_port()}/v1"
    cfg, trigger = round_config(store, rollouts, {"endpoint": url, "api_key_env": KEY_ENV})
    started = time.monotonic()
    state = generation_round("gsm", cfg, trigger, return_state=True)
    assert state.is_failed() and time.monotonic() - started < 30
    with pytest.raises(ModelUnavailableError, match="unreachable") as err:
        state.result()
    assert url in str(err.value) and KEY not in str(err.value)
    assert store.head_version("gsm") == 0 and verify(store, "gsm") == []


def kill_once_busy(server: LlamaServer) -> threading.Thread:
    """Kill the server (SIGKILL, by PID) as soon as one of its slots is decoding."""
    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                slots = httpx.get(f"http://127.0.0.1:{server.port}/slots", timeout=2,
                                  headers={"Authorization": f"Bearer {KEY}"}).json()
            except (httpx.HTTPError, ValueError):
                slots = []
            if any(s.get("is_processing") for s in slots if isinstance(s, dict)):
                os.kill(server.pid, 9)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_server_killed_mid_round_fails_the_round_and_its_retry_commits_nothing(
        tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    server = LlamaServer(tmp_path, parallel=1, ctx=1024, key=KEY).start()
    try:
        store = seeded_store(tmp_path)
        before = sorted(p.relative_to(store.root) for p in Path(store.root).rglob("*"))
        rollouts = write_rollouts(tmp_path / "batch.jsonl", [q for q, _ in HARD[:4]])
        cfg, trigger = round_config(
            store, rollouts, {"endpoint": server.url, "api_key_env": KEY_ENV, "hard_k": 4,
                              "max_concurrency": 1, "max_retries": 1, "max_new_tokens": 48},
            retries=1, retry_delay_seconds=0)
        killer = kill_once_busy(server)
        state = generation_round("gsm", cfg, trigger, return_state=True)
        killer.join(timeout=1)
        assert server.process is not None and server.process.poll() is not None, "not killed"
    finally:
        server.stop()
    assert state.is_failed()
    # The generate task's second attempt (the round's retry) found the server gone at once.
    with pytest.raises(ModelUnavailableError, match="unreachable") as err:
        state.result()
    assert server.url in str(err.value)
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(
            id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
    assert [r.run_count for r in runs if r.name.startswith("generate")] == [2]
    assert store.head_version("gsm") == 0 and verify(store, "gsm") == []
    after = sorted(p.relative_to(store.root) for p in Path(store.root).rglob("*"))
    assert after == before  # no shard, no quarantine, no record


def test_each_partition_asks_the_endpoint_for_its_own_seeds(
        llama: LlamaServer, tmp_path: Path) -> None:
    store = seeded_store(tmp_path)
    rollouts = write_rollouts(tmp_path / "batch.jsonl", [q for q, _ in HARD[:4]])
    cfg, trigger = round_config(store, rollouts, served(llama, hard_k=4, max_concurrency=2),
                                partitions=2)
    state = generation_round("gsm", cfg, trigger, return_state=True)
    assert state.is_completed(), state.message
    parts = store.head("gsm").lineage["generator"]["partition_stats"]
    assert [p["seeds"] for p in parts] == [2, 2]
    assert [p["model"]["requests"] for p in parts] == [2, 2]
    assert {p["model"]["endpoint"] for p in parts} == {f"http://127.0.0.1:{llama.port}"}


_NO_TORCH = r"""
import json, sys
from dyngen.flows.generation_round import generation_round
cfg, trigger = json.loads(sys.argv[1])
result = generation_round("gsm", cfg, trigger)
print(json.dumps({"version": result["version"], "torch": "torch" in sys.modules,
                  "in_process": "dyngen.llm.in_process" in sys.modules,
                  "models": [m for m in sys.modules if m.startswith("transformers.models.")]}))
"""


def test_a_served_round_imports_no_torch_and_no_transformers_model(
        llama: LlamaServer, tmp_path: Path) -> None:
    from prefect.settings import PREFECT_API_URL

    store = seeded_store(tmp_path)
    rollouts = write_rollouts(tmp_path / "batch.jsonl", [HARD[0][0]])
    cfg, trigger = round_config(store, rollouts, served(llama, hard_k=1))
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()),
           "PYTHONPATH": str(REPO), KEY_ENV: KEY}
    out = subprocess.run([sys.executable, "-c", _NO_TORCH, json.dumps([cfg, trigger])],
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"version": 1, "torch": False, "in_process": False, "models": []}
