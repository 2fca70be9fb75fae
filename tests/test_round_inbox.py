"""A round's side of the inbox, without Prefect: the trigger's training run, the context of
the batch ends a round covers (their rollouts read from the store and checked), the
lineage that says what a version covers, and its words."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from dyngen.errors import RolloutsError, TriggerError
from dyngen.filters.base import FilterOutcome
from dyngen.rollout_format import Rollout
from dyngen.round import round_inputs
from dyngen.round.context import FIELDS, RoundBatchEnd, RoundContext, Trigger
from dyngen.round.inbox import covers_text, pending_batch_ends
from dyngen.round.lineage import round_lineage
from dyngen.round.rollouts import RolloutsPolicy
from dyngen.store import Store
from tests.rows import verl_rows

SECRET = "sk-live-93be0c1d5a7f2e64"


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "store")
    store.create("ds", verl_rows(2))
    return store


def test_a_trigger_names_its_training_run_checked_as_the_store_checks_it() -> None:
    assert "run" in FIELDS
    trig = Trigger.parse({"event_id": "e1", "step": 3, "run": "exp/7 α"})
    assert (trig.run, trig.batch_end) == ("exp/7 α", ("exp/7 α", 3))
    assert Trigger.parse({"step": 3}).run is None and Trigger.parse({"step": 3}).batch_end is None
    assert Trigger.parse({"run": "r"}).batch_end is None  # no step: no inbox key
    for bad, says in [("", "non-empty"), (7, "found int"), ("a\x00b", "control character"),
                      ("x" * 300, "at most 200 bytes")]:
        with pytest.raises(TriggerError, match=f"trigger.run: .*{says}"):
            Trigger.parse({"step": 1, "run": bad})


def test_a_run_and_step_without_an_event_id_is_a_key_of_its_own() -> None:
    assert Trigger(step=3, run="a").idempotency_key("ds") == "ds:run:a:step:3"
    assert Trigger(step=3).idempotency_key("ds") == "ds:step:3"  # as before
    assert Trigger(event_id="e", step=3, run="a").idempotency_key("ds") == "event:e"


def batch_end(run: str, step: int, score: float, *prompts: str) -> RoundBatchEnd:
    rollouts = tuple(Rollout(i + 1, p, 0.5) for i, p in enumerate(prompts))
    return RoundBatchEnd(run, step, {"score": score}, f"2025-01-01T00:00:0{step}", "e", rollouts)


def test_the_context_goes_by_the_triggers_batch_end_else_the_newest_written() -> None:
    ends = (batch_end("a", 1, 0.1, "p1"), batch_end("a", 2, 0.2, "p2"),
            batch_end("b", 3, 0.3, "p3"))
    own = RoundContext("ds", 1, 0, Trigger(step=2, run="a", metrics={"score": 9.0}),
                       batch_ends=ends)
    assert (own.run, own.step, own.metrics) == ("a", 2, {"score": 0.2})  # as stored
    other = RoundContext("ds", 1, 0, Trigger(), batch_ends=ends)
    assert (other.run, other.step, other.metrics) == ("b", 3, {"score": 0.3})
    assert [r.prompt for r in other.read_rollouts()] == ["p1", "p2", "p3"]
    alone = RoundContext("ds", 1, 0, Trigger(step=4, metrics={"score": 1.0}))
    assert (alone.run, alone.step, alone.metrics, alone.read_rollouts()) == (
        None, 4, {"score": 1.0}, [])


def test_a_triggers_file_is_read_only_when_the_trigger_names_no_run(tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    path.write_text(json.dumps({"prompt": "from the file", "score": 1}) + "\n")
    policy = RolloutsPolicy((str(tmp_path),))
    ends = (batch_end("a", 1, 0.1, "stored"),)
    for step in (1, 2):  # its own batch end covered here, or not (its rollouts: the store's)
        own = RoundContext("ds", 1, 0, Trigger(step=step, run="a", rollouts=str(path)),
                           rollouts_policy=policy, batch_ends=ends)
        assert [r.prompt for r in own.read_rollouts()] == ["stored"]
    no_run = RoundContext("ds", 1, 0, Trigger(step=2, rollouts=str(path)),
                          rollouts_policy=policy, batch_ends=ends)
    assert [r.prompt for r in no_run.read_rollouts()] == ["stored", "from the file"]
    # Nor is it checked before the round: on the worker's host it may not even exist.
    cfg, trig, _ = round_inputs("ds", None, {"step": 1, "run": "a",
                                             "rollouts": str(tmp_path / "elsewhere.jsonl")})
    assert trig.rollouts is not None
    with pytest.raises(RolloutsError, match="outside the allowed directories"):
        round_inputs("ds", None, {"step": 1, "rollouts": str(tmp_path / "elsewhere.jsonl")})


def test_pending_batch_ends_are_read_oldest_first_and_bad_rollouts_are_left_out_with_why(
        store: Store) -> None:
    store.write_batch_end("ds", "b", 7, {"score": 0.7},
                          [{"prompt": "ok", "score": 1}, {"prompt": "big" * 20_000, "score": 0}])
    time.sleep(0.01)  # written_at counts milliseconds: b's is the oldest
    store.write_batch_end("ds", "a", 9, {}, [{"prompt": SECRET}])  # no score
    store.write_batch_end("ds", "a", 10, None, [{"prompt": "small", "score": 0.5}])
    store.write_batch_end("ds", "a", 11)
    got = pending_batch_ends(store, "ds", 0, RolloutsPolicy(max_bytes=10_000))
    assert [b.key for b in got] == [("b", 7), ("a", 9), ("a", 10), ("a", 11)]
    too_big, no_score, fine, none = got
    assert too_big.rollouts == () and "over the bound round.max_rollouts_bytes=10000" in \
        str(too_big.rollouts_error)
    assert no_score.rollouts == () and "rollouts of run 'a' step 9, line 1: field 'score' is " \
        "missing" in str(no_score.rollouts_error)
    assert SECRET not in str(no_score.rollouts_error)
    assert [r.prompt for r in fine.rollouts] == ["small"] and fine.rollouts_error is None
    assert (none.rollouts, none.rollouts_error, none.metrics) == ((), None, {})
    # A version covering some of them: the rest stay pending for the next round.
    store.append("ds", verl_rows(1, start=5), covers=[("b", 7)])
    assert [b.key for b in pending_batch_ends(store, "ds", 1, RolloutsPolicy())] == [
        ("a", 9), ("a", 10), ("a", 11)]
    assert [b.key for b in pending_batch_ends(store, "ds", 0, RolloutsPolicy())][0] == ("b", 7)


def test_a_rounds_lineage_says_what_it_covers_and_the_trigger_run_only_when_named() -> None:
    outcome = FilterOutcome(kept=[], rejected=[])
    ends = (batch_end("a", 3, 0.1), batch_end("a", 4, 0.1),
            RoundBatchEnd("b", 1, {}, "t", "e", rollouts_error="no score"))
    context = RoundContext("ds", 2, 1, Trigger(event_id="e", step=4, run="a"), batch_ends=ends)
    lin = round_lineage(context, {"class": "G"}, 0, outcome, {}).to_dict()
    assert lin["trigger"]["run"] == "a"
    assert lin["batch_ends"] == {"a": [3, 4], "b": [1]}
    assert lin["rollouts_errors"] == [{"run": "b", "step": 1, "error": "no score"}]
    plain = round_lineage(RoundContext("ds", 2, 1, Trigger(step=4)), {}, 0, outcome,
                          {}).to_dict()
    assert "run" not in plain["trigger"] and "batch_ends" not in plain \
        and "rollouts_errors" not in plain


def test_covers_in_words() -> None:
    assert covers_text([("run-a", 3), ("run-a", 4), ("run-a", 5), ("run-b", 1)]) == \
        "run-a steps 3–5 · run-b step 1"
    assert covers_text({"a": [1, 3, 4, 9]}) == "a steps 1, 3–4, 9"
    assert covers_text({"a": list(range(0, 20, 2))}) == "a steps 0, 2, 4, 6, 8, 10, … (4 more)"
    assert covers_text([]) == covers_text({}) == covers_text({"a": "junk"}) == ""
