"""ReasoningGymCurriculum: rows per second for a round of 1,000 rows across 10 families, and
the generator's share of the round's time.

All in one run, on CPU:
  generator  `generate` alone, 1,000 rows at each family's level (labels checked by the
             scorers, entries encoded), against the baseline measured in the same run:
             reasoning-gym's own `create_dataset` making the same entries (nothing checked,
             nothing stored); the ratio is what dyngen's rows and checks cost
  round      one round (the second; the first loads everything) through the flow, at the
             families' starting levels (`run_round`: load → generate → filter → concat →
             version on a fresh store, a temporary Prefect server if PREFECT_API_URL is not
             set), rows kept per second and each stage's share of the round's time

    python benchmarks/reasoning_gym.py [--rows 1000] [--level 1] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# Run as a script, this file's folder leads sys.path, and this file is named like the
# package it measures: `import reasoning_gym` would import it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

FAMILIES = ["basic_arithmetic", "chain_sum", "leg_counting", "propositional_logic", "gcd",
            "letter_counting", "number_sorting", "family_relationships", "graph_color",
            "word_sorting"]


def timed(call: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = call()
    return time.perf_counter() - start, out


def generator_speed(rows: int, level: int, repeat: int) -> None:
    """`generate` against reasoning-gym making the same entries, interleaved, medians."""
    from dyngen.generators.reasoning_gym import ReasoningGymCurriculum
    from dyngen.generators.reasoning_gym.families import Family, derived_seed
    from dyngen.generators.reasoning_gym.generator import shares
    from dyngen.round.context import RoundContext, Trigger

    levels = {f: min(level, Family(f).top) for f in FAMILIES}
    counts = shares(dict.fromkeys(FAMILIES, 1.0), rows)

    def ours(r: int) -> int:
        gen = ReasoningGymCurriculum({"tasks": FAMILIES, "rows_per_round": rows})
        made = gen.generate([], RoundContext("bench", r, r - 1, Trigger(), {"levels": levels}))
        return len(made)

    def theirs(r: int) -> int:
        import reasoning_gym

        made = 0
        for family, n in counts.items():
            at = Family(family)
            at.start_at(levels[family])
            ds = reasoning_gym.create_dataset(family, size=n, seed=derived_seed(0, "bench", r,
                                                                                family),
                                              **at.configuration())
            made += len([ds[i] for i in range(n)])
        return made

    ours(0), theirs(0)  # imports, word lists and scorers loaded once, outside the timing
    mine, base, kept = [], [], 0
    for r in range(1, repeat + 1):
        seconds, kept = timed(lambda r=r: ours(r))
        mine.append(kept / seconds)
        seconds, made = timed(lambda r=r: theirs(r))
        base.append(made / seconds)
    m, b = statistics.median(mine), statistics.median(base)
    print(f"generator, {rows} rows across {len(FAMILIES)} families at level {level} "
          f"(median of {repeat}):")
    print(f"  ReasoningGymCurriculum.generate  {m:>8.0f} rows/s  ({kept} rows written)")
    print(f"  reasoning-gym create_dataset     {b:>8.0f} entries/s (baseline)")
    print(f"  ratio generate / baseline        {m / b:>8.2f}")


def round_speed(rows: int) -> None:
    """One round through the flow on a fresh store: rows/s and each stage's share."""
    from dyngen.runtime.in_process import run_round
    from dyngen.store import Store
    from tests.rows import verl_rows

    with tempfile.TemporaryDirectory() as folder:
        store = Store(folder)
        store.create("bench", verl_rows(8))
        config = {"store": {"root": folder}, "data": {"datagen": {
            "path": "pkg://dyngen.generators.reasoning_gym", "name": "ReasoningGymCurriculum",
            "tasks": FAMILIES, "rows_per_round": rows}}}
        # A first round starts the server if needed and loads reasoning-gym, outside the timing.
        run_round("bench", config, {"step": 0})
        seconds, result = timed(lambda: run_round("bench", config, {"step": 1}))
        lineage = store.head("bench").lineage
    timings = lineage["timings"]
    counts = result["counts"]
    print(f"\nround through the flow (run_round), {rows} rows across {len(FAMILIES)} families "
          f"at their starting levels: {seconds:.2f} s wall, kept {counts['kept']} of "
          f"{counts['generated']} "
          f"(rejected {counts.get('rejected') or {}})")
    print(f"  rows per second (wall)           {counts['generated'] / seconds:>8.0f} generated, "
          f"{counts['kept'] / seconds:.0f} kept")
    staged = sum(timings.values())
    for stage, value in timings.items():
        print(f"  {stage:<10} {value:>7.2f} s  {value / seconds:>6.1%} of the round's wall time")
    print(f"  version, flow, records (the rest) {(seconds - staged):.2f} s "
          f"{(seconds - staged) / seconds:.1%}")
    print(f"  generator's share of the round   {timings['generate'] / seconds:>8.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--level", type=int, default=1, help="each family's level (capped at its top)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", choices=("generator", "round"), default=None)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    if args.only != "round":
        generator_speed(args.rows, args.level, args.repeat)
    if args.only != "generator":
        round_speed(args.rows)


if __name__ == "__main__":
    main()
