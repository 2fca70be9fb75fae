"""`dyngen report` on long histories: drawing with grouping and thinning vs every point.

Makes N rounds' version records in memory (realistic lineage: counts with three reject
reasons, a score metric, a curriculum level, four stage timings), then times, in the
same process, drawing the report's five charts
  dyngen    as the report draws them (at most 120 bars, 1,500 points per line)
  baseline  the same charts with every round a bar and every version a point
and prints seconds and SVG bytes of each, and their ratios. Reading the records from the
store is not included (the store's log decides that cost).

    python benchmarks/report.py [--rounds 100 1000 10000]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dyngen.report import charts  # noqa: E402
from dyngen.report.history import History, history_of  # noqa: E402
from dyngen.store import VersionRecord  # noqa: E402

DRAW = (charts.rows_chart, charts.counts_chart, charts.metrics_chart, charts.state_chart,
        charts.timings_chart)


def records(rounds: int, seed: int = 0) -> list[VersionRecord]:
    """Version 0 and `rounds` appended rounds with a curriculum's lineage."""
    rng = random.Random(seed)
    out = [VersionRecord("bench", 0, None, "create", (), 16, {}, "2026-01-01T00:00:00")]
    rows = 16
    for v in range(1, rounds + 1):
        rejected = {r: rng.randint(0, 2) for r in ("duplicate", "overlong_prompt", "schema")}
        kept = rng.randint(2, 8)
        rows += kept
        lineage = {"counts": {"generated": kept + sum(rejected.values()), "kept": kept,
                              "rejected": rejected},
                   "trigger": {"step": v, "metrics": {"score": rng.random()}},
                   "generator": {"name": "ArithmeticCurriculum",
                                 "state": {"level": 1 + v * 5 // rounds}},
                   "timings": {s: rng.random() for s in ("load", "generate", "filter", "concat")}}
        out.append(VersionRecord("bench", v, v - 1, "append", (), rows, {},
                                 "2026-01-01T00:00:00", lineage=lineage))
    return out


def draw(history: History) -> tuple[float, int]:
    """Seconds to draw every chart, and their SVG bytes."""
    start = time.perf_counter()
    size = sum(len(svg or "") for svg in (chart(history) for chart in DRAW))
    return time.perf_counter() - start, size


def main() -> None:
    """Time both ways for each history length and print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, nargs="+", default=[100, 1000, 10000])
    args = parser.parse_args()
    draw(history_of(records(10)))  # load matplotlib and its fonts before timing
    print(f"{'rounds':>7} {'dyngen s':>9} {'KB':>6} {'baseline s':>11} {'KB':>7} "
          f"{'time ratio':>10} {'size ratio':>10}")
    for rounds in args.rounds:
        history = history_of(records(rounds))
        ours, our_size = draw(history)
        capped = charts.MAX_BARS, charts.MAX_POINTS
        charts.MAX_BARS, charts.MAX_POINTS = 10**9, 10**9
        try:
            full, full_size = draw(history)
        finally:
            charts.MAX_BARS, charts.MAX_POINTS = capped
        print(f"{rounds:>7,} {ours:>9.2f} {our_size / 1e3:>6.0f} {full:>11.2f} "
              f"{full_size / 1e3:>7.0f} {ours / full:>10.2f} {our_size / full_size:>10.2f}")


if __name__ == "__main__":
    main()
