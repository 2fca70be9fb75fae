"""The order `dyngen serve` claims waiting rounds in: each dataset's by step, datasets
first come, first served (the served test in tests/e2e/test_triggered_rounds.py shows the
step order end to end)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from dyngen.runtime.warm_runner import _in_line

T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)


def waiting(dataset: str, step: object, second: int) -> SimpleNamespace:
    """A waiting run as the Prefect client reads it: its rendered trigger parameters."""
    return SimpleNamespace(parameters={"dataset": dataset, "trigger": {"step": step}},
                           expected_start_time=T0 + timedelta(seconds=second),
                           name=f"{dataset}@{step}")


def test_a_datasets_rounds_go_in_step_order_whatever_order_their_runs_were_made_in() -> None:
    runs = [waiting("a", 4, 0), waiting("a", 2, 1), waiting("a", 3, 2)]
    assert [r.name for r in _in_line(runs)] == ["a@2", "a@3", "a@4"]


def test_datasets_keep_their_places_in_line_so_none_waits_behind_anothers_lower_steps(
        ) -> None:
    runs = [waiting("a", 100, 0), waiting("b", 5, 1), waiting("a", 99, 2),
            waiting("b", 3, 3), waiting("a", None, 4), waiting("b", 4, 5)]
    # a's first place goes to its lowest step; b's lower steps do not jump ahead of a.
    assert [r.name for r in _in_line(runs)] == ["a@99", "b@3", "a@100", "b@4", "a@None",
                                                 "b@5"]


def test_runs_without_a_numeric_step_come_after_a_datasets_stepped_ones() -> None:
    runs = [waiting("a", None, 0), waiting("a", "x", 1), waiting("a", True, 2),
            waiting("a", 7, 3)]
    assert [r.name for r in _in_line(runs)] == ["a@7", "a@None", "a@x", "a@True"]
