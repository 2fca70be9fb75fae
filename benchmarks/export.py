"""Reading versions elsewhere: what the Delta mirror costs, and DuckDB over Store.to_arrow.

mirror   a dataset of V versions (version 0, then rounds of R rows, each followed by the
         default compaction policy as rounds apply it) mirrored from scratch (seconds per
         version); then rounds mirrored one at a time, incrementally (median seconds per
         call, in process and as `dyngen export NAME DEST --format delta`). Baselines, in
         the same run: deltalake's own write_deltalake of the head's rows as one commit,
         and of each round's rows as one append.
query    `select data_source, count(*) ... group by` in DuckDB over Store.to_arrow(head)
         of N rows in 100 versions, against the same query over a pyarrow table read from
         one Parquet file of the same rows. Each side in a fresh process, imports done
         first; the table's opening is counted (memory-mapping with checksums verified, or
         reading the file) and shown apart from the query.

    python benchmarks/export.py [--versions 1000] [--round-rows 100] [--rounds 10]
                                [--rows 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.rows import bench_row  # noqa: E402

NAME = "bench"
_QUERY = "select data_source, count(*) as n from tbl group by data_source"
_MEASURE = r"""
import json, sys, time
import datasets.table, duckdb, pyarrow.parquet as pq  # imports are not what is measured
from dyngen.store import Store
mode, root, parquet, query = sys.argv[1:5]
t0 = time.perf_counter()
tbl = pq.read_table(parquet) if mode == "parquet" else Store(root).to_arrow("bench")
opened = time.perf_counter() - t0
t1 = time.perf_counter()
rows = duckdb.sql(query).fetchall()
queried = time.perf_counter() - t1
print(json.dumps({"open": opened, "query": queried, "total": opened + queried,
                  "rows": sum(n for _, n in rows)}))
"""


def build_rounds(root: Path, versions: int, per: int) -> object:
    """Version 0 then rounds of `per` rows, compacting as rounds do, to `versions` versions."""
    from dyngen.store import Store

    store = Store(root)
    store.create(NAME, [bench_row(i) for i in range(per)])
    n = per
    t0 = time.perf_counter()
    while store.head_version(NAME) < versions - 1:
        store.append(NAME, [bench_row(n + i) for i in range(per)], generator="bench")
        n += per
        if store.head_version(NAME) < versions - 1:
            store.compact(NAME)  # the default policy, as a round applies it after committing
    head = store.head(NAME)
    kinds = sorted({r.operation for r in store.history(NAME)})
    print(f"built {head.version + 1:,} versions ({', '.join(kinds)}; {head.rows:,} rows, "
          f"{len(head.shards)} shards at the head) in {time.perf_counter() - t0:.1f} s")
    return store


def bench_mirror(tmp: Path, versions: int, per: int, rounds: int) -> None:
    import deltalake

    from dyngen.mirror import mirror_delta
    from dyngen.mirror.files import delta_schema

    store = build_rounds(tmp / "store", versions, per)
    dest, copy = tmp / "mirror", tmp / "copy"
    t0 = time.perf_counter()
    done = mirror_delta(store, NAME, dest)
    scratch = time.perf_counter() - t0
    head = store.to_arrow(NAME)
    t0 = time.perf_counter()
    deltalake.write_deltalake(str(copy), head.cast(delta_schema(head.schema)))
    one_commit = time.perf_counter() - t0
    print(f"mirror from scratch: {len(done.committed):,} versions in {scratch:.1f} s = "
          f"{scratch / len(done.committed) * 1000:.1f} ms per version; the head's rows as one "
          f"write_deltalake commit: {one_commit:.2f} s (ratio {scratch / one_commit:.0f}x for "
          "every version's history)")

    ours, theirs, cli, idle = [], [], [], []
    start = store.head(NAME).rows
    for r in range(rounds):
        rows = [bench_row(start + r * per + i) for i in range(per)]
        store.append(NAME, rows, generator="bench")
        t0 = time.perf_counter()
        step = mirror_delta(store, NAME, dest)
        ours.append(time.perf_counter() - t0)
        assert len(step.committed) == 1
        new = store.to_arrow(NAME).slice(store.head(NAME).rows - per)
        t0 = time.perf_counter()
        deltalake.write_deltalake(str(copy), new.cast(delta_schema(new.schema)), mode="append")
        theirs.append(time.perf_counter() - t0)
        store.append(NAME, [bench_row(10**8 + start + r * per + i) for i in range(per)],
                     generator="bench")
        cli.append(_cli_export(store, dest))
        idle.append(_cli_export(store, dest))  # nothing to do: the command's fixed cost
    mine, base, shell, fixed = (statistics.median(x) for x in (ours, theirs, cli, idle))
    print(f"one new round of {per} rows, incrementally (median of {rounds}): mirror_delta "
          f"{mine * 1000:.0f} ms in process (target <= 0.5 s: "
          f"{'met' if mine <= 0.5 else 'NOT met'}), write_deltalake append of the same rows "
          f"{base * 1000:.0f} ms (ratio {mine / base:.2f}); `dyngen export --format delta` "
          f"as a command {shell:.2f} s, of which {fixed:.2f} s when it has nothing to do "
          f"(Python, imports, checks; ratio {shell / fixed:.2f})")


def _cli_export(store: object, dest: Path) -> float:
    dyngen = Path(sys.executable).with_name("dyngen")
    t0 = time.perf_counter()
    subprocess.run([str(dyngen), "--root", str(store.root), "export", NAME, str(dest),  # type: ignore[attr-defined]
                    "--format", "delta"], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    return time.perf_counter() - t0


def bench_query(tmp: Path, rows: int, repeat: int) -> None:
    from dyngen.store import Store
    from dyngen.trainers.verl_format import export_version

    store = Store(tmp / "qstore")
    per = rows // 100
    for v in range(100):
        batch = [{**bench_row(v * per + i), "data_source": f"source-{i % 7}"} for i in range(per)]
        if v == 0:
            store.create(NAME, batch)
        else:
            store.append(NAME, batch, generator="bench")
    parquet = export_version(store, NAME, tmp / "baseline.parquet", with_provenance=True)
    results: dict[str, list[dict]] = {"parquet": [], "to_arrow": []}
    for _ in range(repeat):  # interleaved so machine noise hits both alike
        for mode in results:
            out = subprocess.run([sys.executable, "-c", _MEASURE, mode, str(store.root),
                                  str(parquet), _QUERY], capture_output=True, text=True,
                                 check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
            results[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"DuckDB `{_QUERY}` over {rows:,} rows (median of {repeat}, fresh processes):")
    base = {k: statistics.median(r[k] for r in results["parquet"]) for k in
            ("open", "query", "total")}
    for mode, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("open", "query", "total")}
        assert all(r["rows"] == rows for r in runs)
        print(f"  {mode:<9} open {med['open']:.3f} s  query {med['query']:.3f} s  total "
              f"{med['total']:.3f} s  (total ratio {med['total'] / base['total']:.2f}, query "
              f"ratio {med['query'] / base['query']:.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", type=int, default=1000)
    ap.add_argument("--round-rows", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dyngen-bench-export-") as tmp:
        bench_mirror(Path(tmp), args.versions, args.round_rows, args.rounds)
        bench_query(Path(tmp), args.rows, args.repeat)


if __name__ == "__main__":
    main()
