"""Chaos, long: ~100 batch ends at a steady pace through a seeded schedule of SIGKILLs of
`dyngen serve`'s process group, of the Prefect server (restarted on its port and
database) and of the trainer (restarted from its checkpoint, re-sending its last two
steps); then everything healed (tests/e2e/chaos.py).

It prints each fault, what must hold (tests/e2e/test_chaos.py's checks), the emit → commit
latency of the steps no fault touched (median, p95) against the same run's steps a fault
did touch, and the recovery time after each fault (restart → the next version committed).

    python benchmarks/chaos.py [--steps 100] [--seed 7] [--pace 1.0] [--serve 4]
        [--server 3] [--emitter 1] [--keep FOLDER]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.chaos import run_chaos, schedule, summary  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--pace", type=float, default=1.0, help="seconds between batch ends")
    ap.add_argument("--serve", type=int, default=4)
    ap.add_argument("--server", type=int, default=3)
    ap.add_argument("--emitter", type=int, default=1)
    ap.add_argument("--keep", type=Path, default=None,
                    help="run in this folder and keep it (the processes' logs, the store)")
    args = ap.parse_args()
    counts = {"serve": args.serve, "server": args.server, "emitter": args.emitter}
    print("faults:", ", ".join(f"{f.kind} at step {f.at_step} (down {f.down} s)"
                               for f in schedule(args.seed, args.steps, counts)), flush=True)
    with (contextlib.nullcontext(str(args.keep)) if args.keep
          else tempfile.TemporaryDirectory(prefix="dyngen-chaos-")) as tmp:
        started = time.monotonic()
        chaos = run_chaos(Path(tmp), args.seed, args.steps, counts, args.pace,
                          heal_seconds=600)
        try:
            healed = time.monotonic() - started
            problems = chaos.problems()
            clean, recoveries = chaos.latencies()
            touched = chaos.touched_latencies()
        finally:
            chaos.stop()
    print(f"\n{args.steps} steps, {len(chaos.log)} faults, healed after {healed:.0f} s")
    print("| fault | at step | down (s) | recovery (s) |\n|---|---|---|---|")
    for fault in chaos.log:
        recovery = fault.get("recovery")
        print(f"| {fault['kind']} | {fault['at_step']} | {fault['down']} | "
              f"{'-' if recovery is None else f'{recovery:.1f}'} |")
    print(f"emit → commit, steps no fault touched: {summary(clean)}")
    print(f"emit → commit, steps a fault touched (baseline for the above): {summary(touched)}")
    print(f"recovery after a fault: {summary(recoveries)}")
    print("what must hold: " + ("all holds" if not problems else "; ".join(problems)))
    if problems:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
