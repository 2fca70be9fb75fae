"""`Store.append` in a loop: compacted on append (the default) against `compact=False`.

Two stores get the same appends of one row each, alternately (so the machine's noise hits
both alike). At N/2 and at N appends it prints, for each: the head's shards, the
checkpoints (files and bytes), the dataset folder's bytes (data and log), a head load from
a fresh `Store`, and the loop's seconds; then the ratios compacted / uncompacted.

    python benchmarks/append_loop.py [--appends 1000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.rows import bench_row  # noqa: E402
from dyngen.store import Store  # noqa: E402

NAME = "loop"
KINDS = ("compacted", "uncompacted")


def folder_bytes(folder: Path) -> int:
    """Bytes of every file under `folder`."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def measure(root: Path, seconds: float) -> dict[str, float]:
    """The figures of one store at its current size."""
    base = root / NAME
    checkpoints = list((base / "_checkpoints").glob("0*.json"))
    t0 = time.perf_counter()
    rows = len(Store(root).load(NAME))
    load_s = time.perf_counter() - t0
    return {"rows": rows, "head shards": len(Store(root).head(NAME).shards),
            "checkpoints": len(checkpoints),
            "checkpoint KB": sum(p.stat().st_size for p in checkpoints) / 1024,
            "dataset KB": folder_bytes(base) / 1024,
            "head load ms": load_s * 1000, "append loop s": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--appends", type=int, default=1000)
    args = ap.parse_args()
    n = args.appends
    with tempfile.TemporaryDirectory(prefix="dyngen-append-loop-") as tmp:
        roots = {kind: Path(tmp) / kind for kind in KINDS}
        stores = {kind: Store(root) for kind, root in roots.items()}
        for store in stores.values():
            store.create(NAME, [bench_row(0)])
        seconds = dict.fromkeys(KINDS, 0.0)
        points: dict[int, dict[str, dict[str, float]]] = {}
        for i in range(1, n + 1):
            for kind in KINDS:
                t0 = time.perf_counter()
                stores[kind].append(NAME, [bench_row(i)], compact=kind == "compacted")
                seconds[kind] += time.perf_counter() - t0
            if i in (n // 2, n):
                points[i] = {kind: measure(roots[kind], seconds[kind]) for kind in KINDS}
        for at, figures in points.items():
            assert figures["compacted"]["rows"] == figures["uncompacted"]["rows"] == at + 1
    print(f"Store.append x {n:,}, one row each: compacted on append (default) vs "
          "compact=False")
    print(f"{'':<16}" + "".join(f"{f'{k} @{at:,}':>22}" for at in points for k in KINDS)
          + "".join(f"{f'ratio @{at:,}':>14}" for at in points))
    for key in points[n]["compacted"]:
        if key == "rows":
            continue
        cells = "".join(f"{points[at][k][key]:>22.1f}" for at in points for k in KINDS)
        ratios = "".join(_ratio(points[at]["compacted"][key], points[at]["uncompacted"][key])
                         for at in points)
        print(f"{key:<16}{cells}{ratios}")


def _ratio(a: float, b: float) -> str:
    """a / b as a table cell; a dash where there is nothing to divide by (no checkpoint
    yet in a short loop)."""
    return f"{a / b:>14.2f}" if b else f"{'-':>14}"


if __name__ == "__main__":
    main()
