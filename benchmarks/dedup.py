"""Duplicate detection cost against dataset size: per-shard sorted keys vs a full scan.

Builds two store datasets of verl rows as many appended versions (small: 10 x 1,000 rows,
large: 100 x 10,000 = 1M rows), then for Q new prompts (half already stored, half new)
times, interleaved, in the same process:
  dyngen  Store.contains_prompts(name, prompt_keys(new))   (binary search of each shard's keys)
  scan    np.isin(prompt_keys(new), prompt_keys(Store.load(name)["prompt"]))   (the baseline)
checks both give the same answer, and prints seconds, the ratio to the scan, and how each
side's cost grows from the small dataset to the large one.

    python benchmarks/dedup.py [--small-versions 10] [--small-rows 1000]
        [--large-versions 100] [--large-rows 10000] [--queries 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _row(i: int) -> dict[str, Any]:
    return {
        "data_source": "bench",
        "prompt": [{"role": "system", "content": "Answer with a number."},
                   {"role": "user", "content": f"Compute {i} * {i % 97} + {i % 13}."}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(i * (i % 97) + i % 13)},
        "extra_info": {"index": i},
    }


def build(store: Any, name: str, versions: int, per_version: int) -> int:
    """Create `name` as one create plus versions-1 appends of `per_version` rows each."""
    t0 = time.perf_counter()
    for v in range(versions):
        batch = [_row(v * per_version + i) for i in range(per_version)]
        if v == 0:
            store.create(name, batch)
        else:
            # One shard per version, as measured: no compaction on append.
            store.append(name, batch, generator="bench", compact=False)
    rows = versions * per_version
    print(f"built {name}: {rows:,} rows as {versions} versions in "
          f"{time.perf_counter() - t0:.1f} s")
    return rows


def queries(rows: int, count: int, seed: int) -> tuple[list[Any], np.ndarray]:
    """`count` prompts, half drawn from the stored rows and half new, shuffled; and the truth."""
    rng = random.Random(seed)
    present = rng.sample(range(rows), count // 2)
    new = range(rows, rows + count - count // 2)
    picked = [(i, i < rows) for i in [*present, *new]]
    rng.shuffle(picked)
    return [_row(i)["prompt"] for i, _ in picked], np.array([p for _, p in picked])


def ours(store: Any, name: str, prompts: list[Any]) -> np.ndarray:
    from dyngen.store.keys import prompt_keys

    return store.contains_prompts(name, prompt_keys(prompts))


def scan(store: Any, name: str, prompts: list[Any]) -> np.ndarray:
    from dyngen.store.keys import prompt_keys

    stored = prompt_keys(store.load(name)["prompt"])
    return np.isin(prompt_keys(prompts), stored)


def timed(fn: Callable[..., np.ndarray], *args: Any) -> tuple[float, np.ndarray]:
    t0 = time.perf_counter()
    found = fn(*args)
    return time.perf_counter() - t0, found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small-versions", type=int, default=10)
    ap.add_argument("--small-rows", type=int, default=1_000, help="rows per small version")
    ap.add_argument("--large-versions", type=int, default=100)
    ap.add_argument("--large-rows", type=int, default=10_000, help="rows per large version")
    ap.add_argument("--queries", type=int, default=1_000, help="new prompts to check")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import datasets

    from dyngen.store import Store

    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory(prefix="dyngen-bench-") as tmp:
        store = Store(tmp)
        sizes = {"small": build(store, "small", args.small_versions, args.small_rows),
                 "large": build(store, "large", args.large_versions, args.large_rows)}
        asks = {name: queries(rows, args.queries, args.seed) for name, rows in sizes.items()}
        seconds = {(name, mode): [] for name in sizes for mode in ("dyngen", "scan")}
        for _ in range(args.repeat):  # interleaved so machine noise hits every mode alike
            for name, (prompts, truth) in asks.items():
                for mode, fn in (("dyngen", ours), ("scan", scan)):
                    s, found = timed(fn, store, name, prompts)
                    if not np.array_equal(found, truth):
                        sys.exit(f"DISAGREE: {mode} on {name} found {int(found.sum())} of "
                                 f"{len(found)} prompts stored; expected {int(truth.sum())}")
                    seconds[name, mode].append(s)

    med = {key: statistics.median(runs) for key, runs in seconds.items()}
    print(f"{args.queries:,} prompts per check ({args.queries // 2:,} already stored): dyngen "
          "and scan agree with each other and with the truth on every run")
    print(f"{'dataset':<8}{'rows':>11}{'versions':>10}{'dyngen s':>10}{'scan s':>10}"
          f"{'time ratio':>12}")
    for name, rows in sizes.items():
        versions = args.small_versions if name == "small" else args.large_versions
        d, s = med[name, "dyngen"], med[name, "scan"]
        print(f"{name:<8}{rows:>11,}{versions:>10}{d:>10.4f}{s:>10.3f}{d / s:>12.4f}")
    growth = sizes["large"] / sizes["small"]
    print(f"large/small: {growth:.0f}x the rows; dyngen "
          f"{med['large', 'dyngen'] / med['small', 'dyngen']:.1f}x the time, scan "
          f"{med['large', 'scan'] / med['small', 'scan']:.1f}x the time")
    print(f"time ratio = dyngen seconds / scan seconds (medians of {args.repeat} interleaved "
          "runs); dyngen's keys are binary-searched per shard, so its cost follows the number "
          "of shards and new prompts, not the rows stored")


if __name__ == "__main__":
    main()
