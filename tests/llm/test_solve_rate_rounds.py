"""Rounds with round.solve_rate on, through the Prefect flow, against a real llama.cpp server:
what they keep, quarantine and record, and that the record is honest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dyngen.flows.generation_round import generation_round
from dyngen.store import Store, verify
from tests.llm.llama_server import MODEL_ALIAS, LlamaServer
from tests.llm.support import KEY, KEY_ENV, Records, key_set_and_every_log_kept
from tests.llm.support_solve_rate import (
    key_found_in,
    recorded,
    recording_reward,
    solve_round_config,
    sums_store,
)

pytestmark = pytest.mark.usefixtures("prefect_server")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def graded_round(llama: LlamaServer, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[tuple[Any, Store, Path, Records]]:
    """One committed arithmetic round of 9 tasks, each graded 4 times by the recording reward."""
    folder = tmp_path_factory.mktemp("solve-rate-round")
    store = sums_store(folder)
    reward, records = recording_reward(folder)
    cfg = solve_round_config(store, {"endpoint": llama.url, "api_key_env": KEY_ENV,
                                     "reward": {"path": str(reward), "name": "compute_score"}},
                             tasks=9)
    with key_set_and_every_log_kept() as log:
        state = generation_round("sums", cfg, {"event_id": "batch-1", "step": 1},
                                 return_state=True)
    yield state, store, records, log


def _new_rows(store: Store) -> list[dict[str, Any]]:
    return store.load("sums", 1).to_list()[4:]


def _quarantined(store: Store) -> list[dict[str, Any]]:
    return store.load_rejected("sums", 1, round_only=True).to_list()


def passes_by_index(records: Path) -> dict[int, int]:
    """How many of each row's 4 samples the recording reward passed. Rows with index % 3 ==
    0 always pass and == 1 never do; the others pass on an even-length reply, which
    llama.cpp's sampling decides (its batching across slots can change a reply's length)."""
    out: dict[int, int] = {}
    for s in recorded(records):
        out[s["index"]] = out.get(s["index"], 0) + (s["score"] >= 1.0)
    return out


def band_counts(records: Path) -> Counter[str]:
    """The verdicts the band [0.25, 0.75] gives at 4 samples, from what the reward returned."""
    return Counter("too_easy" if n == 4 else "too_hard" if n == 0 else "kept"
                   for n in passes_by_index(records).values())


def test_committed_rows_carry_their_solve_rate_and_quarantined_ones_their_rate(
        graded_round: tuple[Any, Store, Path, Records]) -> None:
    state, store, records, _ = graded_round
    assert state.is_completed(), state.message
    assert verify(store, "sums") == []
    rows, rejected = _new_rows(store), _quarantined(store)
    assert rows, "the band kept nothing"
    for row in rows:
        rate = row["extra_info"]["solve_rate"]
        assert rate["samples"] == 4 and 1 <= rate["passed"] <= 3
        assert rate["model"] == MODEL_ALIAS and rate["version"]
    reasons = Counter(r["reason"] for r in rejected)
    expected = band_counts(records)
    assert reasons["too_easy"] == expected["too_easy"] >= 3  # index % 3 == 0, and any 4/4
    assert reasons["too_hard"] == expected["too_hard"] >= 3  # index % 3 == 1, and any 0/4
    assert len(rows) == expected["kept"]
    for r in rejected:
        assert r["reason"] in ("too_easy", "too_hard")
        assert r["detail"] == ("4/4 passed" if r["reason"] == "too_easy" else "0/4 passed")


def test_each_rows_passed_is_what_the_reward_function_returned_for_it(
        graded_round: tuple[Any, Store, Path, Records]) -> None:
    _, store, records, _ = graded_round
    scores = recorded(records)
    by_index: dict[int, list[float]] = {}
    for s in scores:
        by_index.setdefault(s["index"], []).append(s["score"])
    assert len(by_index) == 9 and all(len(v) == 4 for v in by_index.values())
    for row in _new_rows(store):
        index = row["extra_info"]["index"]
        assert row["extra_info"]["solve_rate"]["passed"] == sum(
            1 for s in by_index[index] if s >= 1.0)
    for r in _quarantined(store):
        index = json.loads(r["row"])["extra_info"]["index"]
        passed = sum(1 for s in by_index[index] if s >= 1.0)
        assert r["detail"] == f"{passed}/4 passed"


def test_lineage_records_the_policy_band_tokens_and_histogram_without_the_key(
        graded_round: tuple[Any, Store, Path, Records], llama: LlamaServer) -> None:
    state, store, records, log = graded_round
    lineage = store.head("sums").lineage
    stage = lineage["solve_rate"]
    assert stage["endpoint"] == f"127.0.0.1:{llama.port}"
    assert stage["samples"] == 4 and stage["keep"] == [0.25, 0.75]
    assert stage["graded"] == 9 and sum(stage["histogram"]) == 9
    passes = list(passes_by_index(records).values())
    assert stage["histogram"] == [passes.count(k) for k in range(5)]
    expected = band_counts(records)
    assert stage["too_easy"] == expected["too_easy"] and stage["too_hard"] == expected["too_hard"]
    assert stage["kept"] == lineage["counts"]["kept"]
    assert stage["completion_tokens"] > 0 and stage["seconds"] > 0
    # llama.cpp answers n choices but counts one's tokens: dyngen asks n one-sample requests.
    assert stage["n_in_one_request"] is False and stage["requests"] == 9
    assert stage["http_requests"] >= 36
    assert lineage["counts"]["rejected"] == {"too_easy": expected["too_easy"],
                                             "too_hard": expected["too_hard"]}
    # The solve-rate filter is the filter stage's last: its seconds are part of the stage's.
    assert lineage["timings"]["filter"] >= stage["seconds"]
    _assert_key_nowhere(state, store, log.lines)


def _assert_key_nowhere(state: Any, store: Store, lines: list[str]) -> None:
    from prefect.client.orchestration import get_client

    assert key_found_in(state, store, KEY) == []  # parameters, logs, artifacts, the store
    with get_client(sync_client=True) as client:
        assert KEY_ENV in json.dumps(client.read_flow_run(
            state.state_details.flow_run_id).parameters)  # named, by its variable
    assert not any(KEY in line for line in lines)
    assert any("/chat/completions" in line for line in lines)  # the client's log is there
    assert any(p.is_file() for p in Path(store.root).rglob("*"))


def test_partitions_each_grade_their_own_share(llama: LlamaServer, tmp_path: Path) -> None:
    store = sums_store(tmp_path)
    cfg = solve_round_config(store, {"endpoint": llama.url, "api_key_env": KEY_ENV,
                                     "samples": 2, "keep": [0.0, 1.0], "max_tokens": 4},
                             tasks=5, partitions=2)
    state = generation_round("sums", cfg, {"event_id": "batch-2", "step": 2},
                             return_state=True)
    assert state.is_completed(), state.message
    stage = store.head("sums").lineage["solve_rate"]
    assert stage["partitions"] == 2 and stage["graded"] == 5 and stage["requests"] == 5
    assert len(stage["share_seconds"]) == 2
    assert all(r["extra_info"]["solve_rate"]["samples"] == 2 for r in _new_rows(store))
    _, task_names = _task_runs(state)
    assert sorted(n for n in task_names if n.startswith("solve-rate")) == [
        "solve-rate-0-of-2", "solve-rate-1-of-2"]
    # A second round on a dataset whose rows already carry a solve rate.
    state = generation_round("sums", cfg, {"event_id": "batch-3", "step": 3},
                             return_state=True)
    assert state.is_completed(), state.message
    rows = store.load("sums", 2).to_list()
    assert all(r["extra_info"]["solve_rate"] is None for r in rows[:4])  # the seed rows
    assert all(r["extra_info"]["solve_rate"]["samples"] == 2 for r in rows[4:])
    assert verify(store, "sums") == []


def _task_runs(state: Any) -> tuple[Any, list[str]]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(
            id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
    return runs, [r.name for r in runs]


_NO_TORCH = r"""
import json, sys
from dyngen.flows.generation_round import generation_round
cfg = json.loads(sys.argv[1])
result = generation_round("sums", cfg, {"event_id": "no-torch", "step": 1})
print(json.dumps({"version": result["version"], "torch": "torch" in sys.modules,
                  "in_process": "dyngen.llm.in_process" in sys.modules}))
"""


def test_a_served_solve_rate_round_imports_no_torch(llama: LlamaServer, tmp_path: Path) -> None:
    from prefect.settings import PREFECT_API_URL

    store = sums_store(tmp_path)
    cfg = solve_round_config(store, {"endpoint": llama.url, "api_key_env": KEY_ENV,
                                     "samples": 2, "keep": [0.0, 1.0], "max_tokens": 4},
                             tasks=2)
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()),
           "PYTHONPATH": str(REPO), KEY_ENV: KEY}
    out = subprocess.run([sys.executable, "-c", _NO_TORCH, json.dumps(cfg)], env=env,
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"version": 1, "torch": False, "in_process": False}
