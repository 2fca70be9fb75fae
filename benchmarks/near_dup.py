"""Near-duplicate rejection: seconds per round against 100k and 1M rows, sidecar size,
memory, building the index of an old store from scratch, and the labelled fixture.

Builds two datasets as rounds leave them (appends of `--rows-per-version` rows, the
default compaction policy after each): `small` (100k rows) with its sidecars written as it
grows, and `large` (1M rows) as a store from before sidecars (none written). Then, each in
a fresh process (for its peak RSS):
  index    the large dataset's first round: every shard indexed from scratch (one pass)
  round    1,000 new rows (a tenth near-copies of stored rows, the first word changed; the rest
           new) through NearDuplicateFilter against the head, `--repeat` times
and prints seconds per round (median), the 1M / 100k ratio (target <= 2x; <= 0.3 s at
1M), sidecar bytes per row (<= 200), peak RSS, and the fixture's rejection shares at the
default threshold for 5-word shingles (the defaults) and 1-word shingles.

    python benchmarks/near_dup.py [--small 100000] [--large 1000000]
        [--rows-per-version 10000] [--queries 1000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
VOCABULARY = 20_000
WORDS_PER_PROMPT = 40


def word(k: int) -> str:
    """The k-th made-up word (letters only, as most words of a prompt are)."""
    out = ""
    while True:
        out += "abcdefghijklmnopqrstuvwxyz"[k % 26]
        k //= 26
        if not k:
            return out


def prompt(rng: np.random.Generator) -> str:
    """A 40-word task of random words with two numbers: unrelated to any other."""
    ws = [word(int(k)) for k in rng.integers(0, VOCABULARY, WORDS_PER_PROMPT)]
    ws[10], ws[30] = str(rng.integers(0, 1000)), str(rng.integers(0, 1000))
    return " ".join(ws)


def rows(texts: list[str]) -> list[dict[str, Any]]:
    return [{"data_source": "bench", "prompt": [{"role": "user", "content": t}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": "1"},
             "extra_info": {"index": i}} for i, t in enumerate(texts)]


def build(root: Path, name: str, total: int, per_version: int, sidecars: bool) -> float:
    from dyngen.store import CompactionPolicy, Store

    store = Store(root)
    rng = np.random.default_rng(hash(name) % 2**32)
    index = {} if sidecars else {"index": None}
    t0 = time.perf_counter()
    for v in range(total // per_version):
        batch = rows([prompt(rng) for _ in range(per_version)])
        if v == 0:
            store.create(name, batch, **index)
        else:
            store.append(name, batch, generator="bench", **index)
        store.compact(name, CompactionPolicy())
    return time.perf_counter() - t0


def measure(root: str, name: str, queries: int, repeat: int, first: bool) -> dict[str, Any]:
    """In a fresh process: the first round's indexing (if `first`), then timed rounds."""
    from dyngen.filters import NearDuplicateFilter
    from dyngen.store import Store

    store = Store(root)
    head = store.state(name)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out: dict[str, Any] = {"rows": head.rows, "shards": len(head.shards)}
    rng = np.random.default_rng(7)
    stored = store.load(name)
    picks = rng.choice(head.rows, queries // 10, replace=False).tolist()
    texts = [prompt(rng) for _ in range(queries - len(picks))]
    for i in picks:  # near-copies: one word of a stored prompt replaced
        ws = stored[int(i)]["prompt"][0]["content"].split()
        ws[0] = "changed"
        texts.append(" ".join(ws))
    if first:  # only the first round, which indexes the store
        t0 = time.perf_counter()
        NearDuplicateFilter(store, name, head.version).verdicts(rows(texts[:1]))
        out["index_seconds"] = time.perf_counter() - t0
        repeat = 0
    seconds: list[float] = []
    dropped = 0
    for _ in range(repeat):
        flt = NearDuplicateFilter(Store(root), name, head.version)
        t0 = time.perf_counter()
        verdicts = flt.verdicts(rows(texts))
        seconds.append(time.perf_counter() - t0)
        dropped = sum(v is not None for v in verdicts)
    out.update(seconds=statistics.median(seconds) if seconds else 0.0, dropped=dropped,
               near_copies=len(picks),
               rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               rss_growth_mb=(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024)
    return out


def sidecar_bytes(root: Path, name: str) -> float:
    """Bytes of the head's sidecars (own or derived) per row."""
    from dyngen.store import Store

    store = Store(root)
    head = store.state(name)
    total = 0
    for info in head.shards:
        if info.lsh is not None:
            total += (root / name / info.lsh).stat().st_size
        else:
            total += sum(p.stat().st_size for p in (root / name / "_index").glob(
                f"{info.sha256}-*.lsh"))
    return total / head.rows


# The labelled pairs: the first written with the filter, the second held out (written by
# someone who saw neither the filter nor the first file).
FIXTURES = ("near_duplicates.jsonl", "near_duplicates_heldout.jsonl")


def fixture(name: str) -> dict[int, dict[str, float]]:
    """Share of each kind of the labelled pairs whose second prompt is rejected."""
    from dyngen.filters import NearDuplicateFilter
    from dyngen.store import Store
    from dyngen.store.minhash import LshParams

    pairs = [json.loads(line) for line in
             (REPO / "tests/fixtures" / name).read_text().splitlines()]
    out: dict[int, dict[str, float]] = {}
    for ngram in (5, 1):
        out[ngram] = {}
        for kind in ("paraphrase", "numbers", "different"):
            mine = [p for p in pairs if p["kind"] == kind]
            with tempfile.TemporaryDirectory(prefix="dyngen-bench-") as tmp:
                store = Store(tmp)
                params = LshParams(ngram=ngram)
                store.create("f", rows([p["a"] for p in mine]), index=params)
                verdicts = NearDuplicateFilter(store, "f", 0, params=params).verdicts(
                    rows([p["b"] for p in mine]))
            out[ngram][kind] = sum(v is not None for v in verdicts) / len(mine)
    return out


def child(root: Path, name: str, args: argparse.Namespace, first: bool) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--measure", str(root), name, str(args.queries),
           str(args.repeat), "1" if first else "0"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--measure":
        root, name, queries, repeat, first = sys.argv[2:7]
        print(json.dumps(measure(root, name, int(queries), int(repeat), first == "1")))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=100_000)
    ap.add_argument("--large", type=int, default=1_000_000)
    ap.add_argument("--rows-per-version", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=1_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--skip-fixture", action="store_true")
    args = ap.parse_args()
    import datasets

    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory(prefix="dyngen-bench-") as tmp:
        root = Path(tmp)
        built = {"small": build(root, "small", args.small, args.rows_per_version, True),
                 "large": build(root, "large", args.large, args.rows_per_version, False)}
        print(f"built small ({args.small:,} rows, sidecars as it grew) in {built['small']:.0f} s"
              f", large ({args.large:,} rows, no sidecars) in {built['large']:.0f} s")
        small = child(root, "small", args, first=False)
        first = child(root, "large", args, first=True)  # its own process: its own peak RSS
        large = child(root, "large", args, first=False)
        per_row = {n: sidecar_bytes(root, n) for n in ("small", "large")}
    print(f"large, first round: indexed {first['rows']:,} rows from scratch in "
          f"{first['index_seconds']:.1f} s, peak RSS {first['rss_mb']:.0f} MB (one pass; "
          "later rounds reuse it)")
    print(f"{'dataset':<8}{'rows':>11}{'shards':>8}{'s/round':>9}{'dropped':>9}"
          f"{'sidecar B/row':>15}{'peak RSS MB':>13}")
    for n, m in (("small", small), ("large", large)):
        print(f"{n:<8}{m['rows']:>11,}{m['shards']:>8}{m['seconds']:>9.3f}"
              f"{m['dropped']:>5}/{m['near_copies']:<3}{per_row[n]:>15.1f}{m['rss_mb']:>13.0f}")
    print(f"1M / 100k seconds per round: {large['seconds'] / small['seconds']:.2f}x "
          f"(targets: <= 2x, <= 0.3 s at 1M); {args.queries:,} new rows per round, median of "
          f"{args.repeat}")
    for name in () if args.skip_fixture else FIXTURES:
        for ngram, shares in fixture(name).items():
            print(f"{name}, {ngram}-word shingles, threshold 0.8: rejected " + ", ".join(
                f"{k} {v:.1%}" for k, v in shares.items()))


if __name__ == "__main__":
    main()
