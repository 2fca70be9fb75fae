"""Partitioned generation on Ray: a generator that sleeps like a slow model, 4 partitions
on a 2-CPU local Ray against 1 partition, as whole rounds, in one run.

Each round asks for the same `--rows` new rows at `--seconds-per-row`; a partition
writes its share (every P-th row). Ray is started once and warmed up by one round, as on
a cluster that is already running; that first round's time is printed apart. The ratio
is the 1-partition baseline's median round time over each mode's.

    python benchmarks/partitions.py [--rounds 3] [--rows 24] [--seconds-per-row 1.0]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import datasets  # noqa: E402

from dyngen.generators.base import AbstractDataGenerator  # noqa: E402


class SleepsLikeAModel(AbstractDataGenerator):
    """Its partition's share of `rows` new tasks, `seconds_per_row` each."""

    def generate(self, dataset: Any, context: Any = None) -> datasets.Dataset:
        share = range(context.partition, int(self.config.rows), context.partitions)
        time.sleep(float(self.config.seconds_per_row) * len(share))
        return datasets.Dataset.from_list([_task(context.round, i) for i in share])


def _task(round_no: int, i: int) -> dict[str, Any]:
    a, b = round_no * 1000 + i, i + 7
    return {"data_source": "bench", "ability": "math",
            "prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"index": a, "split": "train"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per mode")
    ap.add_argument("--rows", type=int, default=24)
    ap.add_argument("--seconds-per-row", type=float, default=1.0)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dyngen-partitions-")
    # Prefect reads these when first imported: a throwaway home, quiet, offline.
    os.environ.update({"PREFECT_HOME": str(Path(tmp) / "prefect"),
                       "PREFECT_LOGGING_LEVEL": "WARNING",
                       "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    # A single-machine Ray otherwise binds to the host's network address.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    from prefect.testing.utilities import prefect_test_harness
    from prefect_ray import RayTaskRunner

    from dyngen.flows.generation_round import generation_round
    from dyngen.store import Store

    ray = {"kind": "ray",
           "init_kwargs": {"num_cpus": 2, "include_dashboard": False, "log_to_driver": False}}
    modes = {"1 partition (default runner)": (1, {}), "1 partition on Ray": (1, ray),
             "4 partitions on 2 Ray CPUs": (4, ray)}
    with prefect_test_harness(server_startup_timeout=180), \
            RayTaskRunner(init_kwargs=ray["init_kwargs"]):
        store = Store(Path(tmp) / "store")
        store.create("bench", [_task(0, i) for i in range(8)])
        step = 0

        def round_seconds(partitions: int, runner: dict[str, Any]) -> tuple[float, float]:
            nonlocal step
            step += 1
            cfg = {"store": {"root": str(store.root)},
                   "data": {"datagen": {"path": str(Path(__file__).resolve()),
                                        "name": "SleepsLikeAModel", "rows": args.rows,
                                        "seconds_per_row": args.seconds_per_row}},
                   "round": {"partitions": partitions, "task_runner": runner}}
            t0 = time.perf_counter()
            generation_round("bench", cfg, {"step": step})
            total = time.perf_counter() - t0
            lineage = store.head("bench").lineage
            assert lineage["counts"]["kept"] == args.rows, lineage["counts"]
            return total, lineage["timings"]["generate"]

        warm = round_seconds(4, ray)
        print(f"warm-up round (Ray starts its workers): {warm[0]:.2f} s", flush=True)
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in modes}
        for _ in range(args.rounds):  # interleaved, so load on the machine hits every mode
            for name, (partitions, runner) in modes.items():
                results[name].append(round_seconds(partitions, runner))
                print(f"{name}: round {results[name][-1][0]:.2f} s", flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    base = statistics.median(t for t, _ in results[next(iter(modes))])
    ideal = args.rows * args.seconds_per_row
    print(f"\n{args.rows} rows x {args.seconds_per_row} s per round (sleep alone: {ideal:.1f} s "
          f"in one partition, {ideal / 2:.1f} s in 4 on 2 CPUs)")
    print(f"{'mode':<30}{'round s':>9}{'generate s':>12}{'speed-up':>10}")
    for name, times in results.items():
        total = statistics.median(t for t, _ in times)
        generate = statistics.median(g for _, g in times)
        print(f"{name:<30}{total:>9.2f}{generate:>12.2f}{base / total:>9.2f}x")


if __name__ == "__main__":
    main()
