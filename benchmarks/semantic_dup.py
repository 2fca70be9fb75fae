"""Semantic-duplicate rejection: quality on labelled pairs, index scaling, embedding speed.

Quality: the repo's pair fixtures (tests/fixtures/near_duplicates*.jsonl), this benchmark's
222 pairs (benchmarks/data/semantic_pairs.jsonl: 72 paraphrases, 72 different tasks in
nearly the same words, 70 number variants, 8 with the numbers swapped between roles), and
the hard pairs of issue 53 (benchmarks/data/task_pairs.jsonl, each side with its reference
answer: heavy paraphrases with renamed people and variables, different questions on the
same givens, number variants, swapped numbers, code tasks with renamed identifiers and
with another input). The older fixtures' reference answers are in
benchmarks/data/fixture_answers.jsonl (written for this benchmark, by text).

Each pair is judged alone, `b` against a store holding `a`, by each rule: today's (the
semantic filter's cosine >= threshold with the same numbers in order; the MinHash filter's
Jaccard >= 0.8 with the same numbers; both, as the round runs them) and now's (the same
filters with the answer gate: a different reference answer keeps the row; the same answer
lowers the cosine to `same_answer_threshold` with one row's numbers within the other's).
Per fixture and rule: the share of duplicates caught (paraphrases, renamed code) and the
share of each other class wrongly rejected. `--end-to-end` also runs the real filters on
each fixture: a store holding every `a`, each `b` checked alone against all of them.
Then, on the older models: SemHash (PyPI `semhash`) on the same vectors, and static64.

Scaling: `--stored` random unit vectors (384 dims, as MiniLM's) in shards of
`--shard-rows` (what compaction leaves), each written as the round writes its sidecar
(dyngen.store.vectors.encode), then `--queries` new rows (a tenth planted near copies of
stored rows, cosine ~0.97, same numbers) looked up in every shard as the filter does,
today's candidates and now's; seconds per round (median of `--repeat`), bytes per row of
the sidecars, the planted rows found; then the same with `--small-shards` round shards of
1,000 rows on top. Last, what the gate adds per round at worst: every new row reading
READ_PER_ROW_GATED stored rows back (prompt, answer, extra_info) from a shard of
`--shard-rows` rows, against today's READ_PER_ROW.

    python benchmarks/semantic_dup.py [--stored 1000000] [--shard-rows 250000]
        [--queries 1000] [--repeat 3] [--small-shards 50] [--threshold 0.95]
        [--models minilm,static64] [--end-to-end] [--skip-quality] [--skip-scaling]

Targets (issue 53): on every fixture, paraphrases caught >= 90%, different tasks wrongly
rejected <= 3%, number variants 0%; 1,000 against 1M <= 1 s on 2 cores; <= 512 bytes a row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
PAIRS = {"fixture": REPO / "tests/fixtures/near_duplicates.jsonl",
         "held-out": REPO / "tests/fixtures/near_duplicates_heldout.jsonl",
         "new": REPO / "benchmarks/data/semantic_pairs.jsonl",
         "issue 53": REPO / "benchmarks/data/task_pairs.jsonl"}
ANSWERS = REPO / "benchmarks/data/fixture_answers.jsonl"
KINDS = ("paraphrase", "different", "numbers", "swapped")
DUPLICATES = ("paraphrase", "code_renamed")  # the classes a filter should catch
OTHERS = ("different", "numbers", "swapped", "code_other_input")
DIMS = 384


def load_pairs() -> dict[str, list[dict[str, str]]]:
    return {name: [json.loads(line) for line in path.open()] for name, path in PAIRS.items()}


def side_rows() -> dict[str, list[tuple[dict[str, Any], dict[str, Any], str]]]:
    """Per fixture, each pair as two verl rows (with their reference answers) and its kind."""
    known = {}
    if ANSWERS.exists():
        known = {d["text"]: d["answer"] for d in map(json.loads, ANSWERS.open())}

    def row(side: Any) -> dict[str, Any]:
        if isinstance(side, str):
            side = {"text": side, "answer": known.get(side)}
        return {"data_source": "bench", "ability": "math",
                "prompt": [{"role": "user", "content": side["text"]}],
                "reward_model": {"style": "rule", "ground_truth": side["answer"]},
                "extra_info": side.get("code") or {"index": 0}}

    return {name: [(row(p["a"]), row(p["b"]), p["kind"]) for p in pairs]
            for name, pairs in load_pairs().items()}


def text_of(row: dict[str, Any]) -> str:
    return row["prompt"][-1]["content"]


class Encoder:
    """Our embedder as SemHash's encoder: the very vectors the filter uses."""

    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder

    def encode(self, sentences: Any, **_: Any) -> np.ndarray:
        return self.embedder.embed([str(s) for s in sentences])


def rules(a: str, b: str, cosine: float, threshold: float) -> dict[str, bool]:
    """Whether `b` goes as a duplicate of `a`, by each rule compared."""
    from dyngen.store.minhash import numbers

    near = cosine >= threshold
    return {"in order (ours)": near and numbers(a) == numbers(b),
            "as a multiset": near and sorted(numbers(a)) == sorted(numbers(b)),
            "no number rule": near}


def minhash_rejects(a: str, b: str) -> bool:
    """The MinHash filter's rule at its defaults (exact Jaccard of 5-word shingles >= 0.8,
    the same numbers in order, at least 10 words)."""
    from dyngen.store.minhash import jaccard, numbers, shingles, words

    wa, wb = words(a), words(b)
    if min(len(wa), len(wb)) < 10 or numbers(a) != numbers(b):
        return False
    return jaccard(shingles(wa, 5), shingles(wb, 5)) >= 0.8


def semhash_rejects(encoder: Encoder, a: str, b: str, threshold: float) -> bool:
    from semhash import SemHash

    found = SemHash.from_records([a], model=encoder).deduplicate([b], threshold=threshold)
    return len(found.filtered) == 1


def quality(models: list[str], threshold: float) -> tuple[list[list[Any]], dict[str, float]]:
    """Per model and rule, without answers: rejected share of each kind of pair, per set."""
    from dyngen.store.embeddings import VectorSettings, embedder

    sets = {name: [(text_of(a), text_of(b), kind) for a, b, kind in pairs]
            for name, pairs in side_rows().items()}
    table, speed = [], {}
    for model in models:
        emb = embedder(VectorSettings(model))
        texts = list(dict.fromkeys(t for pairs in sets.values() for a, b, _ in pairs
                                   for t in (a, b)))
        emb.embed(texts[:8])  # the model loads outside the timing
        emb._memo.clear()  # every text embedded anew, not taken from the memo
        start = time.perf_counter()
        vectors = dict(zip(texts, emb.embed(texts), strict=True))
        speed[model] = len(texts) / (time.perf_counter() - start)
        encoder = Encoder(emb)
        for name, pairs in sets.items():
            shares: dict[str, dict[str, list[bool]]] = {}
            for a, b, kind in pairs:
                cosine = float(vectors[a] @ vectors[b])
                verdicts = rules(a, b, cosine, threshold)
                verdicts[f"semhash {threshold}"] = semhash_rejects(encoder, a, b, threshold)
                verdicts["semhash 0.9 (its default)"] = semhash_rejects(encoder, a, b, 0.9)
                for rule, gone in verdicts.items():
                    shares.setdefault(rule, {}).setdefault(kind, []).append(gone)
            for rule, kinds in shares.items():
                table.append([name, model, rule, len(pairs)] + [
                    f"{100 * np.mean(kinds[k]):.1f}% of {len(kinds[k])}" if k in kinds else "-"
                    for k in KINDS])
    return table, speed


def gate_quality(threshold: float, same_answer: float) -> list[list[Any]]:
    """Per fixture, today's rules and now's (the answer gate), MiniLM: the share of each
    class rejected (duplicates: caught; others: wrongly rejected)."""
    from dyngen.filters.answers import DIFFERENT, answer_key, compare
    from dyngen.filters.semantic_duplicate import SemanticDuplicateFilter
    from dyngen.store.embeddings import VectorSettings, embedder

    def semantic(gate: bool) -> SemanticDuplicateFilter:
        return SemanticDuplicateFilter(None, "-", threshold=threshold,  # type: ignore[arg-type]
                                       answer_gate=gate, same_answer_threshold=same_answer)

    today, now = semantic(False), semantic(True)
    sets = side_rows()
    emb = embedder(VectorSettings("minilm"))
    texts = list(dict.fromkeys(text_of(r) for pairs in sets.values() for a, b, _ in pairs
                               for r in (a, b)))
    vectors = dict(zip(texts, emb.embed(texts), strict=True))
    table = []
    for name, pairs in sets.items():
        shares: dict[str, dict[str, list[bool]]] = {}
        for a, b, kind in pairs:
            ta, tb = text_of(a), text_of(b)
            ka, kb = answer_key(a), answer_key(b)
            cosine = float(vectors[ta] @ vectors[tb])
            mh = minhash_rejects(ta, tb)
            sem_today = today.rule(tb, None, ta, None, cosine) is not None
            sem_now = now.rule(tb, kb, ta, ka, cosine) is not None
            mh_now = mh and compare(kb, ka) != DIFFERENT
            if kind == "paraphrase" and ka is not None and kb is not None:
                kind = "paraphrase, answered"  # counted apart, then into paraphrase too
            for rule, gone in (("today: semantic", sem_today), ("today: MinHash", mh),
                               ("today: both", sem_today or mh),
                               ("now: semantic + gate", sem_now),
                               ("now: MinHash + gate", mh_now),
                               ("now: both", sem_now or mh_now)):
                shares.setdefault(rule, {}).setdefault(kind, []).append(gone)
                if kind == "paraphrase, answered":
                    shares[rule].setdefault("paraphrase", []).append(gone)
        answered = sum(answer_key(a) is not None and answer_key(b) is not None
                       for a, b, _ in pairs)
        for rule, kinds in shares.items():
            table.append([name, rule, f"{answered}/{len(pairs)}"] + [
                share(kinds.get(k)) for k in (*DUPLICATES, *OTHERS, "paraphrase, answered")])
    return table


def share(verdicts: list[bool] | None) -> str:
    if not verdicts:
        return "-"
    return f"{100 * np.mean(verdicts):.1f}% ({sum(verdicts)}/{len(verdicts)})"


def end_to_end(root: Path) -> list[list[Any]]:
    """The real filters (defaults, MiniLM) per fixture: a store of every `a` (distinct),
    each `b` checked alone against all of them. A rejection counts for its pair when it
    names the pair's own `a`; one naming another stored row (the older fixtures reuse a
    task across pairs: "Solve the following... Task: <a paraphrase's task>") is counted
    apart, as the labels say nothing of it."""
    import re

    from dyngen.filters import NearDuplicateFilter, SemanticDuplicateFilter
    from dyngen.store import Store
    from dyngen.store.embeddings import VectorSettings
    from dyngen.store.semantic import VecKind

    kind = VecKind(VectorSettings("minilm"))
    out = []
    for name, pairs in side_rows().items():
        stored = list({text_of(a): a for a, _, _ in pairs}.values())
        row_of = {text_of(a): i for i, a in enumerate(stored)}
        store = Store(root / name.replace(" ", "-"))
        store.create("ds", stored, vectors=kind)
        filters = {"today": [NearDuplicateFilter(store, "ds", answer_gate=False),
                             SemanticDuplicateFilter(store, "ds", answer_gate=False)],
                   "now": [NearDuplicateFilter(store, "ds"), SemanticDuplicateFilter(store, "ds")]}
        for when, chain in filters.items():
            kinds: dict[str, list[bool]] = {}
            elsewhere = 0
            for a, b, k in pairs:
                details = [f.check([b])[0] for f in chain]
                found = next((d for d in details if d is not None), None)
                row = re.search(r"of row (\d+) ", found or "")
                own = row is not None and int(row.group(1)) == row_of[text_of(a)]
                elsewhere += found is not None and not own
                kinds.setdefault(k, []).append(own)
            out.append([name, f"{when}: both filters, end to end", f"{len(stored)} stored"]
                       + [share(kinds.get(k)) for k in (*DUPLICATES, *OTHERS)]
                       + [elsewhere])
    return out


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.standard_normal((n, DIMS)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def scaling(args: argparse.Namespace, root: Path) -> list[list[Any]]:
    """Seconds per round of `--queries` rows against `--stored` vectors, bytes per row."""
    from dyngen.store import vectors as vc

    rng = np.random.default_rng(7)
    header = vc.wanted_header({"model": "random", "source": "benchmark", "dims": DIMS})
    big, build = [], 0.0
    n_planted = args.queries // 10
    per_shard = -(-n_planted // max(1, args.stored // args.shard_rows))
    planted, planted_keys = [], []
    for s in range(args.stored // args.shard_rows):
        x = unit(rng, args.shard_rows)
        keys = rng.integers(0, 2**32, args.shard_rows, dtype=np.uint32)
        start = time.perf_counter()
        big.append(vc.encode_to(root / f"big-{s}.vec", x, keys, header))
        build += time.perf_counter() - start
        rows = rng.choice(args.shard_rows, per_shard, replace=False)
        planted += list(x[rows])
        planted_keys += list(keys[rows])
    planted, planted_keys = planted[:n_planted], planted_keys[:n_planted]
    small = [vc.encode_to(root / f"small-{s}.vec", unit(rng, 1000),
                          rng.integers(0, 2**32, 1000, dtype=np.uint32), header)
             for s in range(args.small_shards)]
    # A tenth of the queries: near copies of stored rows (noise to a cosine of ~0.97).
    noisy = np.array(planted) + 0.25 / np.sqrt(DIMS) * rng.standard_normal((n_planted, DIMS))
    queries = np.concatenate([noisy / np.linalg.norm(noisy, axis=1, keepdims=True),
                              unit(rng, args.queries - n_planted)]).astype(np.float32)
    keys = np.concatenate([np.array(planted_keys, np.uint32),
                           rng.integers(0, 2**32, args.queries - n_planted, dtype=np.uint32)])
    out = []
    low = args.same_answer_threshold
    lookup([vc.read(small[0].path if small else big[0].path)], queries[:8], keys[:8], 0.95)
    for label, shards in ((f"{len(big)} shards of {args.shard_rows:,}", big),
                          (f"+ {len(small)} round shards of 1,000", big + small)):
        times: dict[str, list[float]] = {"today": [], "now": []}
        found: dict[str, tuple[np.ndarray, int]] = {}
        for _ in range(args.repeat):
            for when in times:  # today's lookup and now's, alternately, in one run
                fresh = [vc.read(sc.path) for sc in shards]  # mapped anew: nothing cached
                start = time.perf_counter()
                found[when] = lookup(fresh, queries, keys, args.threshold,
                                     low if when == "now" else None)
                times[when].append(time.perf_counter() - start)
        rows = sum(sc.rows for sc in shards)
        size = sum(sc.path.stat().st_size for sc in shards)
        for when, (hit, candidates) in found.items():
            out.append([label, when, f"{rows:,}", f"{statistics.median(times[when]):.3f}",
                        f"{size / rows:.0f}", f"{int(hit[:n_planted].sum())}/{n_planted}",
                        int(hit[n_planted:].sum()), candidates])
    print(f"  building {args.stored:,} rows of sidecars took {build:.1f} s "
          f"({args.stored / build:,.0f} rows/s)")
    return out


def lookup(shards: list[Any], queries: np.ndarray, keys: np.ndarray, threshold: float,
           same_answer: float | None = None) -> tuple[np.ndarray, int]:
    """Which queries have a stored row at the threshold with the same number key (the
    filter's lookup, without reading the rows back), and how many candidates it would read;
    with `same_answer`, also every row at that cosine (every query having an answer)."""
    from dyngen.filters.semantic_duplicate import NEIGHBOURS

    hit = np.zeros(len(queries), bool)
    candidates = 0
    for sc in shards:
        sims, ids = sc.search(queries, min(NEIGHBOURS, sc.rows))
        same = sc.number_keys[np.maximum(ids, 0)] == keys[:, None]
        strict = (ids >= 0) & (sims >= threshold) & same
        hit |= strict.any(axis=1)
        if same_answer is not None:
            strict |= (ids >= 0) & (sims >= same_answer)
        candidates += int(strict.sum())
    return hit, candidates


def read_cost(args: argparse.Namespace, root: Path) -> list[list[Any]]:
    """Seconds to read candidates back from a shard of `--shard-rows` rows: today's
    READ_PER_ROW per new row (prompt, version), now's READ_PER_ROW_GATED (prompt, version,
    reward_model, extra_info, and the answer's key computed): the gate's worst case, every
    new row with that many stored rows of the same-answer cosine."""
    from dyngen.filters.near_duplicate import stored_rows
    from dyngen.filters.semantic_duplicate import READ_PER_ROW, READ_PER_ROW_GATED
    from dyngen.store import Store
    from dyngen.store import shards as sh
    from dyngen.store.index import ShardIndex

    store = Store(root / "reads")
    n = args.shard_rows
    store.create("ds", [{"data_source": "bench", "ability": "math",
                         "prompt": [{"role": "user", "content":
                                     f"A crate holds {i} apples and {i % 7 + 2} pears. "
                                     "How many pieces of fruit are in it?"}],
                         "reward_model": {"style": "rule", "ground_truth": str(i + i % 7 + 2)},
                         "extra_info": {"index": i}} for i in range(n)], index=None)
    parts = [ShardIndex(info, 0, None) for info in store.state("ds").shards]
    rng = np.random.default_rng(3)
    out = []
    for when, per_row in (("today", READ_PER_ROW), ("now", READ_PER_ROW_GATED)):
        wanted = {(0, int(r)) for r in rng.choice(n, args.queries * per_row, replace=False)}
        start = time.perf_counter()
        if when == "now":
            stored_rows(store, "ds", parts, wanted, 0, "prompt")
        else:  # what stored_rows read before the gate: the prompt and the version
            table = sh.open_table(store.shard_path("ds", parts[0].info, 0)).table
            table = table.select(["prompt", sh.VERSION_COLUMN])
            [table.slice(r, 1).to_pylist()[0] for _, r in sorted(wanted)]
        out.append([when, f"{args.queries:,} x {per_row}", f"{len(wanted):,}",
                    f"{time.perf_counter() - start:.3f}"])
    return out


def show(head: list[str], rows: list[list[Any]]) -> None:
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stored", type=int, default=1_000_000)
    parser.add_argument("--shard-rows", type=int, default=250_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--small-shards", type=int, default=50)
    parser.add_argument("--threshold", type=float, default=0.95)
    parser.add_argument("--models", default="minilm,static64")
    parser.add_argument("--same-answer-threshold", type=float, default=0.6)
    parser.add_argument("--skip-quality", action="store_true")
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--end-to-end", action="store_true")
    args = parser.parse_args()
    head = ["pairs", "rule", "pairs with answers", *(f"{k} caught" for k in DUPLICATES),
            *(f"{k} wrongly rejected" for k in OTHERS)]
    answered = [*head, "paraphrase caught, both answered"]
    if not args.skip_quality:
        print(f"## Today and now (MiniLM, threshold {args.threshold}, same answer "
              f"{args.same_answer_threshold}; MinHash at its defaults)\n")
        show(answered, gate_quality(args.threshold, args.same_answer_threshold))
        if args.end_to_end:
            with tempfile.TemporaryDirectory() as tmp:
                print("\n## The real filters, each b against a store of every a\n")
                show([*head, "b rejected for another stored row"], end_to_end(Path(tmp)))
        table, speed = quality(args.models.split(","), args.threshold)
        print(f"\n## Without answers: pairs rejected (threshold {args.threshold})\n")
        show(["pairs", "model", "rule", "n", *KINDS], table)
        print("\n## Embedding throughput (2 cores, every distinct text of the pairs)\n")
        show(["model", "rows/s"], [[m, f"{v:.0f}"] for m, v in speed.items()])
    if not args.skip_scaling:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"\n## {args.queries:,} new rows against {args.stored:,} stored vectors\n")
            rows = scaling(args, Path(tmp))
            show(["shards", "lookup", "rows", "s per round", "bytes/row", "planted found",
                  "others rejected", "candidates to read"], rows)
            print("\n## Reading candidates back (the gate's worst case)\n")
            show(["reads", "rows x per row", "rows read", "s"], read_cost(args, Path(tmp)))
    # The 2 cores are shared: say how busy they were.
    print(f"\nload average (1, 5, 15 min): {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
