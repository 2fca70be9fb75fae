"""benchmarks/closed_loop.py at its smallest: 3 GRPO steps of each arm (SmolLM2-135M, one
prompt of two 4-token completions a step, its top layer training), the dyngen arm's rounds
inline. Every step's spread metrics are recorded, each reaches the lineage of the version
its batch end asked for, with the policy step that measured the round's candidates, and
the report draws them."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from dyngen.report import report_html
from dyngen.report.history import history_of
from dyngen.store import Store
from dyngen.trainers.spread import REWARD_SPREAD, ZERO_SPREAD_SHARE

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "closed_loop.py"


def bench() -> Any:
    spec = importlib.util.spec_from_file_location("closed_loop_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_both_arms_record_every_step_and_the_dyngen_versions_carry_it(
        tmp_path: Path, prefect_server: None) -> None:
    import torch

    closed_loop = bench()
    torch.set_num_threads(1)
    # band [0, 1]: every candidate is kept, so rows flow after 4 tokens a completion; no
    # held-out evaluation (the benchmark's, not what this test is about).
    sizes = closed_loop.Sizes(steps=3, prompts=1, generations=2, max_tokens=4, save_every=2,
                              round_every=1, candidates=2, pool=4, eval_size=0,
                              band=(0.0, 1.0), trainable_layers=1)
    static = closed_loop.run_static(tmp_path, sizes)
    dyngen = closed_loop.run_dyngen(tmp_path, sizes, mode="inline")

    for arm in (static, dyngen):
        assert [s["step"] for s in arm.steps] == [1, 2, 3]
        for s in arm.steps:
            assert 0.0 <= s["zero_spread"] <= 1.0
            assert s["zero_spread"] == pytest.approx(s["zero_spread_from_rewards"])
            assert s["step_time"] > 0 and s["wall"] > 0 and s["completion_tokens"] > 0

    # A round before step 1 (trigger step 0), then one per step, in order.
    store = Store(tmp_path / "store")
    history = store.history("closed-loop")
    rounds = [r for r in history if r.lineage.get("trigger")]
    assert [r.lineage["trigger"]["step"] for r in rounds] == [0, 1, 2, 3]
    for rec, step in zip(rounds[1:], dyngen.steps, strict=True):
        metrics = rec.lineage["trigger"]["metrics"]
        assert metrics[ZERO_SPREAD_SHARE] == pytest.approx(step["zero_spread"])
        assert metrics["frac_reward_zero_std"] == pytest.approx(step["zero_spread"])
        assert REWARD_SPREAD in metrics and metrics[REWARD_SPREAD] >= 0
    # The policy that measured each round's candidates: checkpoint-0 until step 2's
    # checkpoint lands, which it does after step 2's batch end asked for its round.
    assert [r.lineage["solve_rate"]["policy_step"] for r in rounds] == [0, 0, 0, 2]
    assert [r.lineage["solve_rate"]["model"] for r in rounds] == [
        "checkpoint-0", "checkpoint-0", "checkpoint-0", "checkpoint-2"]
    # The trainer drew rows of the rounds' versions, one committed while it trained.
    drawn = [v for s in dyngen.steps for v in s["versions"]]
    assert set(drawn) <= {r.version for r in history} and max(drawn) >= 2, drawn
    assert [v["policy_step"] for v in dyngen.versions] == [0, 0, 0, 2]

    # The report: per version, the trainer's effective share beside the band's kept share.
    points = history_of(history).rounds
    assert [p.effective_share for p in points[1:]] == pytest.approx(
        [1.0 - s["zero_spread"] for s in dyngen.steps])
    assert all(p.solve_rate is not None and p.solve_rate.kept_share == 1.0 for p in points)
    page = report_html(store, "closed-loop")
    assert re.search(r'<figure class="chart" data-chart="effective"><svg', page)
    assert Path(dyngen.report).read_text(encoding="utf-8").count('data-chart="effective"') == 1


def test_the_dynamic_sampling_and_frontier_arms_count_what_they_spend(
        tmp_path: Path, prefect_server: None) -> None:
    """The two arms issue 51 adds, at their smallest: the dynamic-sampling arm screens each
    prompt with the live policy and counts every screening completion; the frontier arm
    records every step's batch end (a round every second step covers both), so each
    trained group becomes an observation, and the summary table has a row per arm."""
    import torch

    from dyngen.difficulty.record import DifficultyBook

    closed_loop = bench()
    torch.set_num_threads(1)
    sizes = closed_loop.Sizes(steps=2, prompts=1, generations=2, max_tokens=4, save_every=2,
                              round_every=2, candidates=2, pool=4, eval_size=0,
                              band=(0.0, 1.0), trainable_layers=1, screen_cap=2)
    dynamic = closed_loop.run_static(tmp_path, sizes, dynamic=True)
    # Each slot screened 1 or 2 candidates (the cap) of 2 completions each.
    assert all(s["extra_rollouts"] == 2 * s["screened"] and 1 <= s["screened"] <= 2
               for s in dynamic.steps)
    frontier = closed_loop.run_dyngen(tmp_path, sizes, mode="inline", frontier=True)
    store = Store(tmp_path / "store")
    name = closed_loop.DATASETS["frontier"]
    trained = {e.step for e in store.batch_ends(name) if e.run != "default"}
    assert trained == {1, 2}  # step 1 recorded too ("default": the round before step 1)
    head = store.head(name)
    book = DifficultyBook.at(store, name, head.version)
    assert book.now == 2 and sum(len(v) for v in book.evidence.values()) >= 2
    assert all(s["last_measured"] is not None for s in frontier.steps)
    table = closed_loop.summary([dynamic, frontier], sizes)
    assert [line.split(" | ")[0] for line in table[2:]] == ["| dynamic", "| frontier"]
