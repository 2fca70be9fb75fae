"""Chaos, small: 12 batch ends at one a second into the store's inbox, and 4 seeded faults
(a SIGKILL of `dyngen serve`'s process group, of the Prefect server, of the trainer, and a
second `dyngen serve` started while one serves); then everything healed.

What must hold (tests/e2e/chaos.py, read from the store): every step covered by exactly one
version, in step order; nothing pending; `verify` and `dyngen verify` clean; the trainer's
retry queue empty; every flow run ended; the second serve refused at once, the first
serving on. About 1-2 minutes per seed; benchmarks/chaos.py runs every kind of fault and
prints the latencies and the backlog.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.chaos import run_chaos, summary
from tests.support import processes_mentioning

STEPS = 12
FAULTS = {"serve": 1, "server": 1, "emitter": 1, "twice": 1}


# CI runs one seed; DYNGEN_CHAOS_SEEDS=1,2,3 runs more, one after another.
SEEDS = [int(s) for s in os.environ.get("DYNGEN_CHAOS_SEEDS", "1").split(",") if s.strip()]


@pytest.mark.parametrize("seed", SEEDS)
def test_every_batch_end_is_covered_once_in_order_through_faults(
        tmp_path: Path, seed: int) -> None:
    chaos = run_chaos(tmp_path / "chaos", seed, STEPS, FAULTS, pace=1.0, heal_seconds=240)
    try:
        problems = chaos.problems()
        clean, touched = chaos.latencies()
        pending = chaos.pending_report()
        runs = chaos.describe_runs() if problems else ""
    finally:
        chaos.stop()
    print(f"\nchaos seed {seed}: faults "
          f"{[(f['kind'], f['at_step'], f['note']) for f in chaos.log]}; emit → covered, "
          f"untouched {summary(clean)}, touched {summary(touched)}; recoveries "
          f"{[round(r, 1) for r in chaos.recoveries()]} s; pending max {pending['max']}")
    assert problems == [], "\n".join(problems) + "\nruns:\n" + runs
    assert processes_mentioning(str(tmp_path)) == [], "the chaos run left processes running"
