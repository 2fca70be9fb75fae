"""Head load of a store dataset built from many appended versions, against one parquet file.

Builds N rows as V versions (one create + V-1 appends), exports the same rows to one
parquet file, then, each in a fresh process so RSS is comparable, times:
  dyngen   Store.load(head)                       (memory-mapped shards, checksums verified)
  dyngen-nocheck  Store.load(head, verify_checksums=False)
  parquet  datasets.Dataset(pyarrow.parquet.read_table(file))   (the baseline)
and prints seconds, RSS growth and the ratio to the baseline measured in the same run.

    python benchmarks/store_load.py [--rows 1000000] [--versions 100] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.rows import bench_row  # noqa: E402

_MEASURE = r"""
import json, resource, sys, time
def rss_mb():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20
mode, root, parquet = sys.argv[1:4]
import datasets, pyarrow.parquet as pq
from dyngen.store import Store
before = rss_mb()
t0 = time.perf_counter()
if mode == "parquet":
    ds = datasets.Dataset(datasets.table.InMemoryTable(pq.read_table(parquet)))
else:
    ds = Store(root).load("bench", verify_checksums=(mode == "dyngen"))
elapsed = time.perf_counter() - t0
assert len(ds) > 0
print(json.dumps({"seconds": elapsed, "rss_mb": rss_mb() - before, "rows": len(ds)}))
"""


def build(root: Path, rows: int, versions: int) -> Path:
    """Create the dataset as `versions` versions and export its head to one parquet file."""
    from dyngen.store import Store
    from dyngen.trainers.verl_format import export_version

    per = rows // versions
    store = Store(root)
    t0 = time.perf_counter()
    for v in range(versions):
        batch = [bench_row(v * per + i) for i in range(per)]
        if v == 0:
            store.create("bench", batch)
        else:
            # One shard per version, as measured: no compaction on append.
            store.append("bench", batch, generator="bench", compact=False)
    print(f"built {rows:,} rows as {versions} versions in {time.perf_counter() - t0:.1f} s")
    return export_version(store, "bench", root / "baseline.parquet")


def measure(mode: str, root: Path, parquet: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, mode, str(root), str(parquet)],
        capture_output=True, text=True, check=True, cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HF_DATASETS_OFFLINE": "1"},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--versions", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dyngen-bench-") as tmp:
        root = Path(tmp)
        parquet = build(root, args.rows, args.versions)
        results: dict[str, list[dict]] = {"parquet": [], "dyngen": [], "dyngen-nocheck": []}
        for _ in range(args.repeat):  # interleaved so machine noise hits every mode alike
            for mode in results:
                results[mode].append(measure(mode, root, parquet))
        base_s = statistics.median(r["seconds"] for r in results["parquet"])
        base_mb = statistics.median(r["rss_mb"] for r in results["parquet"])
        print(f"{'mode':<15}{'rows':>11}{'load s':>9}{'RSS +MB':>9}{'time ratio':>12}"
              f"{'RSS ratio':>11}")
        for mode, runs in results.items():
            s = statistics.median(r["seconds"] for r in runs)
            mb = statistics.median(r["rss_mb"] for r in runs)
            print(f"{mode:<15}{runs[0]['rows']:>11,}{s:>9.3f}{mb:>9.1f}{s / base_s:>12.2f}"
                  f"{mb / base_mb if base_mb > 0 else float('nan'):>11.2f}")
        print("dyngen-nocheck = checksums not verified; target: dyngen head load <= 0.5 s, "
              "<= 50 MB RSS growth at 1M rows")


if __name__ == "__main__":
    main()
