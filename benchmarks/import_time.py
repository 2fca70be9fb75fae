"""`import dyngen` against a bare interpreter's start, in fresh processes, in one run.

The package root's public API is lazy, so a CLI's, a worker's or a trainer's `import dyngen`
costs next to nothing until a name is used. Each sample is a fresh `python -c`, interleaved:
  bare           python -c pass (the baseline)
  import dyngen  python -c "import dyngen", this checkout
  dyngen at REV  the same at another commit (--against), from a `git archive` of it
and `-X importtime`'s cumulative time of the `dyngen` package alone.

    python benchmarks/import_time.py [--runs 21] [--against 5829491]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def wall(code: str, cwd: Path) -> float:
    """Seconds for a fresh interpreter to run `code` in `cwd` (its dyngen comes first)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=cwd, check=True, env={"PATH": "/usr/bin"})
    return time.perf_counter() - start


def package_import_us(cwd: Path) -> int:
    """`-X importtime`'s cumulative microseconds for the `dyngen` package itself."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import dyngen"], cwd=cwd,
                         check=True, capture_output=True, text=True, env={"PATH": "/usr/bin"})
    line = next(x for x in out.stderr.splitlines() if x.rstrip().endswith("| dyngen"))
    return int(line.split("|")[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--against", help="another commit to measure, e.g. 5829491")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"import dyngen": REPO}
        if args.against:
            other = Path(tmp) / args.against
            other.mkdir()
            archive = subprocess.run(["git", "archive", args.against], cwd=REPO, check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(other)], input=archive, check=True)
            trees[f"dyngen at {args.against}"] = other
        times: dict[str, list[float]] = {"bare": []}
        package: dict[str, list[int]] = {}
        for _ in range(args.runs):
            times["bare"].append(wall("pass", REPO))
            for label, tree in trees.items():
                times.setdefault(label, []).append(wall("import dyngen", tree))
                package.setdefault(label, []).append(package_import_us(tree))
    bare = statistics.median(times["bare"])
    print(f"bare interpreter: {bare * 1000:.1f} ms (median of {args.runs})")
    for label in trees:
        median = statistics.median(times[label])
        print(f"{label}: {median * 1000:.1f} ms, {median / bare:.2f}x bare; the dyngen "
              f"package itself {statistics.median(package[label]) / 1000:.2f} ms")


if __name__ == "__main__":
    main()
