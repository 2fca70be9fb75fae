"""A round of CodeTaskProposer as a real flow run (real model, real sandbox) on the shipped
seed tasks, imported as `dyngen import` does: its rows are committed, read back from the
store, and every label comes back from a fresh sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest

from dyngen.flows.generation_round import generation_round
from dyngen.generators.code_tasks import ABDUCTION, DEDUCTION
from dyngen.generators.code_tasks.reward import compute_score
from dyngen.generators.code_tasks.seed_tasks import PROGRAMS, SEED_FILE
from dyngen.generators.code_tasks.tasks import literal
from dyngen.sandbox import run_python, same_value
from dyngen.store import Store
from dyngen.trainers.verl_format import import_files

pytestmark = pytest.mark.usefixtures("prefect_server")
CACHE = str(Path(__file__).resolve().parents[2] / ".dyngen" / "models")


def test_a_round_commits_code_tasks_whose_labels_re_execute(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    store = Store(tmp_path / "store")
    import_files(store, "code", [SEED_FILE])
    datagen = {"path": "pkg://dyngen.generators.code_tasks", "name": "CodeTaskProposer",
               "cache_dir": CACHE, "hard_k": 2, "proposals_per_seed": 3, "max_new_tokens": 80,
               "max_passes": 2, "min_rows": 1, "tasks": [DEDUCTION, ABDUCTION], "seed": 5}
    config = {"store": {"root": str(store.root)},
              "data": {"filter_overlong_prompts": False, "datagen": datagen},
              "round": {"retries": 0}}
    state = generation_round("code", config, {"event_id": "code-1", "step": 1},
                             return_state=True)
    assert state.is_completed(), state.message

    head = store.head("code")
    stats = head.lineage["generator"]["stats"]
    assert stats["kept"] >= 1 and stats["sandbox"] == "bwrap", stats
    assert stats["proposed"] == stats["kept"] + sum(stats["dropped"].values())
    assert head.lineage["counts"]["kept"] == 2 * stats["kept"]  # a task of each kind

    rows = store.load("code")
    new = rows.select(range(len(PROGRAMS), len(rows))).to_list()
    assert {r["extra_info"]["task"] for r in new} == {DEDUCTION, ABDUCTION}
    for row in new:
        info, truth = row["extra_info"], row["reward_model"]["ground_truth"]
        assert info["verification"] == "execution" and row["_dyngen_version"] == 1
        rerun = run_python(info["program"], info["function"], literal(info["input"])[1])
        assert rerun.ok and same_value(rerun.value or "", truth), (info, rerun)
        answer = info["input"] if info["task"] == ABDUCTION else truth
        assert compute_score(row["data_source"], f"Answer: {answer}", truth, info) == 1.0
