"""Chaos, long: trainers writing batch ends into the store's inbox at a steady pace through a
seeded schedule of every kind of fault (tests/e2e/chaos.py: SIGKILLs of `dyngen serve`'s
process group, of the Prefect server, of a trainer; the server SIGSTOPped; its PostgreSQL
postmaster killed; a second serve at once; a serve killed during start-up; a serve killed
while a round runs and the next one while it ends that dead run); then everything healed.

It prints each fault, what must hold (tests/e2e/test_chaos.py's checks), the emit → covered
latency (median, p95) of the batch ends no fault touched and of those a fault did, the
recovery after each fault, the round durations, the inbox's pending count over time, and
PASS/FAIL of:
- latency: p95 ≤ 2 × the median round duration + 5 s, over the batch ends no fault
  touched and those already waiting longer than that when a fault touched them (at least
  MIN_JUDGED of them);
- pending bounded: of the samples taken while the trainer sent and outside the faults'
  windows, the most pending over the later half of their steps is at most the earlier
  half's plus one round's worth of batch ends, and at most what the latency bound allows
  (2 × round + 5 s of batch ends per training run): the backlog does not grow with steps.

No fault comes before step --quiet-steps + 1 (default: half the steps): a fault and its
recovery take from a few seconds to a minute on a loaded machine, and a trainer keeps its
pace through them, so without a steady stretch few batch ends would be left untouched to
measure. Faults that come due after the trainer has finished still check the guarantee.

--fast: a trainer faster than rounds, batch ends every 0.5 s and rounds of about 3 s (a
generator that sleeps, tests/e2e/slow_generator.py). --runs 2: a second training run
(another run id, its own trainer process) beside the first.

    python benchmarks/chaos.py [--steps 40] [--seed 7] [--pace 1.0] [--fast] [--runs 1]
        [--quiet-steps N] [--serve 2] [--server 1] [--emitter 1] [--stop 1] [--postgres 1]
        [--twice 1] [--startup 2] [--round 1] [--catch-up-seconds 10] [--keep FOLDER]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.chaos import (  # noqa: E402
    ROUND,
    percentile,
    run_chaos,
    schedule,
    slow_round,
    summary,
)

MIN_JUDGED = 10  # batch ends the latency verdict needs
DEFAULT_COUNTS = {"serve": 2, "server": 1, "emitter": 1, "stop": 1, "postgres": 1,
                  "twice": 1, "startup": 2, "round": 1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--pace", type=float, default=None,
                    help="seconds between batch ends (default 1.0; 0.5 with --fast)")
    ap.add_argument("--fast", action="store_true",
                    help="batch ends every 0.5 s, rounds of about 3 s (a slow generator)")
    ap.add_argument("--generate-seconds", type=float, default=2.0,
                    help="--fast: the generator's sleep per round")
    ap.add_argument("--runs", type=int, default=1, help="training runs, one trainer each")
    ap.add_argument("--catch-up-seconds", type=float, default=10.0,
                    help="the serve's catch-up interval")
    ap.add_argument("--quiet-steps", type=int, default=None,
                    help="no fault before this step (default: half the steps): a steady "
                         "stretch whose latencies and backlog are measured undisturbed")
    for kind, count in DEFAULT_COUNTS.items():
        ap.add_argument(f"--{kind}", type=int, default=count, help=f"{kind} faults")
    ap.add_argument("--keep", type=Path, default=None,
                    help="run in this folder and keep it (the processes' logs, the store)")
    args = ap.parse_args()
    pace = args.pace if args.pace is not None else (0.5 if args.fast else 1.0)
    round_args = slow_round(args.generate_seconds) if args.fast else ROUND
    counts = {kind: getattr(args, kind) for kind in DEFAULT_COUNTS}
    quiet = args.steps // 2 if args.quiet_steps is None else args.quiet_steps
    faults = schedule(args.seed, args.steps, counts, quiet)
    rounds_are = (f"slow rounds (the generator sleeps {args.generate_seconds} s)" if args.fast
                  else "quick rounds")
    planned = ", ".join(f"{f.kind}{'/' + f.variant if f.variant else ''} at step "
                        f"{f.at_step} ({f.down} s)" for f in faults)
    print(f"{args.steps} steps every {pace} s, {args.runs} training run(s), {rounds_are}; "
          f"no fault before step {quiet + 1}; faults: {planned}", flush=True)
    with (contextlib.nullcontext(str(args.keep)) if args.keep
          else tempfile.TemporaryDirectory(prefix="dyngen-chaos-")) as tmp:
        started = time.monotonic()
        chaos = run_chaos(Path(tmp), args.seed, args.steps, counts, pace, heal_seconds=600,
                          runs=args.runs, round_args=round_args,
                          catch_up_seconds=args.catch_up_seconds, quiet_steps=quiet)
        try:
            healed = time.monotonic() - started
            problems = chaos.problems()
            clean, touched, waited = chaos.latency_parts()
            recoveries = chaos.recoveries()
            rounds, source = chaos.round_durations()
            pending = chaos.pending_report()
            series = chaos.pending_series()
        finally:
            chaos.stop()
    print(f"\nhealed after {healed:.0f} s; {len(chaos.log)} faults")
    print("| fault | at step | down (s) | recovery (s) | what happened |\n|---|---|---|---|---|")
    for fault in chaos.log:
        recovery = fault.get("recovery")
        kind = fault["kind"] + (f"/{fault['variant']}" if fault["variant"] else "")
        print(f"| {kind} | {fault['at_step']} | {fault['down']} | "
              f"{'-' if recovery is None else f'{recovery:.1f}'} | {fault['note'] or '-'} |")
    print(f"round durations ({source}): {summary(rounds)}")
    print(f"emit → covered, batch ends no fault touched: {summary(clean)}")
    print(f"emit → covered, batch ends a fault touched: {summary(touched)}; of them "
          f"waiting uncovered when the fault began: {summary(waited)}")
    print(f"recovery after a fault: {summary(recoveries)}")
    print("pending over time (seconds since the trainers started: step sent, most pending):")
    for i in range(0, len(series), 8):
        print("  " + " | ".join(f"{t:.0f}s: step {s}, {p}" for t, s, p in series[i:i + 8]))
    print(f"pending: max {pending['max']}; over the first half of the steps max "
          f"{pending['first_half']}, the second half {pending['second_half']}")
    first, second = pending["steady_first"], pending["steady_second"]
    print(f"pending while the trainer sent, outside the faults' windows "
          f"({pending['steady_samples']} of {pending['samples']} samples): "
          + " then ".join(f"max {p} over steps {lo}-{hi}" for p, lo, hi in
                          (x for x in (first, second) if x is not None)))
    verdicts = []
    if rounds:
        round_s = statistics.median(rounds)
        bound = 2 * round_s + 5
        # Judged: the batch ends no fault touched, and those a fault touched that had
        # waited longer than the bound before it began (overdue whatever the fault did;
        # their wait so far stands in for their latency). Touched ones not yet overdue
        # when the fault began say nothing either way and are left out.
        overdue = [w for w in waited if w > bound]
        judged = clean + overdue
        if len(judged) >= MIN_JUDGED:
            p95 = percentile(judged, 0.95)
            verdicts.append((p95 <= bound, f"latency: p95 {p95:.2f} s ≤ 2 × median round "
                                           f"{round_s:.2f} s + 5 s = {bound:.2f} s (of "
                                           f"{len(clean)} untouched batch ends and "
                                           f"{len(overdue)} overdue before a fault touched "
                                           "them)"))
        else:
            verdicts.append((False, f"latency not judged: {len(clean)} untouched batch ends "
                                    f"and {len(overdue)} overdue before a fault, fewer than "
                                    f"{MIN_JUDGED} (give more --quiet-steps)"))
    else:
        verdicts.append((False, "latency not judged: no round committed a version"))
    if rounds and first is not None and second is not None:
        # Growth past one round's worth of batch ends (the saw-tooth of rounds that each
        # cover everything pending), or past what the latency bound allows, is a backlog
        # that grows with the steps.
        one_round = math.ceil(statistics.median(rounds) / pace) * args.runs
        allowed = min(first[0] + one_round,
                      math.ceil((2 * statistics.median(rounds) + 5) / pace) * args.runs)
        verdicts.append((second[0] <= allowed,
                         f"pending bounded (not growing with step count): {second[0]} over "
                         f"steps {second[1]}-{second[2]} ≤ {allowed} (the first stretch's "
                         f"{first[0]} + one round's {one_round} batch ends, at most "
                         "what the latency bound allows)"))
    else:
        verdicts.append((False, "pending growth not judged: too few steady samples (give more "
                                "--quiet-steps)"))
    verdicts.append((not problems, "what must hold: " + ("all holds" if not problems
                                                         else "; ".join(problems))))
    for ok, text in verdicts:
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    if not all(ok for ok, _ in verdicts):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
