"""The near-duplicate filter: prompts that nearly repeat one of the dataset or of the round.

MinHash LSH (the version's sidecars, dyngen/store/index.py) proposes candidates; a row is
rejected only when a candidate's exact Jaccard similarity of word shingles reaches the
threshold AND the two prompts hold the same number literals in the same order: "Tom has
3 apples" and "Tom has 5 apples" are different tasks, with different answers. With
`answer_gate` (on), two rows whose reference answers differ (dyngen.filters.answers) are
different tasks however alike their words; rows without a comparable answer keep the rule
above, and the detail says which rule decided. Prompts of fewer than `min_words` words are
left to the exact-duplicate filter.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from dyngen.filters.answers import ANSWER_FIELDS, DIFFERENT, answer_key, answer_keys, compare
from dyngen.filters.base import RowFilter
from dyngen.progress import Bar, progress_bar
from dyngen.rows import Row, column_of
from dyngen.store import Store
from dyngen.store import shards as sh
from dyngen.store.index import ShardIndex, version_index
from dyngen.store.lsh import Queries
from dyngen.store.minhash import (
    Hashed,
    LshParams,
    hash_prompts,
    jaccard,
    numbers,
    prompt_text,
    signatures,
    words,
)
from dyngen.store.minhash import shingles as shingles_of

logger = logging.getLogger(__name__)
# Candidates checked exactly per row, most bands in common first: a dataset of many
# variants of one template must not make a round read thousands of rows per new row.
MAX_CANDIDATES = 32


@dataclass(frozen=True)
class Match:
    """The row a new row resembles, and how much."""

    where: str  # e.g. "row 17 of version 3 (added by version 2)"
    exact: float
    estimate: float
    answers: str  # how the reference answers compare (dyngen.filters.answers)


@dataclass(frozen=True)
class Stored:
    """A stored row read back: its prompt's text, where it is, its answer's key."""

    text: str
    where: str
    answer: int | None


class NearDuplicateFilter(RowFilter):
    """Drop prompts whose shingles nearly equal (same numbers) a stored or earlier row's."""

    reason = "near_duplicate"

    def __init__(self, store: Store, dataset: str, version: int | None = None,
                 prompt_key: str = "prompt", *, threshold: float = 0.8,
                 params: LshParams | None = None, min_words: int = 10,
                 answer_gate: bool = True, progress: Bar | None = None) -> None:
        super().__init__(None)
        self.store, self.dataset, self.version = store, dataset, version
        self.prompt_key = prompt_key
        self.threshold, self.min_words = threshold, min_words
        self.answer_gate = answer_gate
        self._answers: list[int | None] = []  # the answer keys of the rows being checked
        self.params = params or LshParams()
        self.progress = progress

    @classmethod
    def from_config(cls, settings: Mapping[str, Any], store: Store, dataset: str,
                    version: int | None, prompt_key: str = "prompt") -> NearDuplicateFilter:
        """The filter `round.near_duplicate` describes."""
        return cls(store, dataset, version, prompt_key, threshold=float(settings["threshold"]),
                   params=params_of(settings), min_words=int(settings["min_words"]),
                   answer_gate=bool(settings.get("answer_gate", True)))

    def check(self, rows: Sequence[Row]) -> list[str | None]:
        hashed = hash_prompts(column_of(rows, self.prompt_key), self.params, self.min_words)
        out: list[str | None] = [None] * len(rows)
        todo = np.flatnonzero(hashed.eligible)
        if not len(todo):
            return out
        self._answers = answer_keys(rows, self.prompt_key) if self.answer_gate \
            else [None] * len(rows)
        sig_of = {int(i): k for k, i in enumerate(todo)}
        for i, match in self._in_store(hashed, todo, sig_of).items():
            out[i] = _detail(match, self.answer_gate)
        self._in_round(hashed, [int(i) for i in todo if out[i] is None], sig_of, out)
        return out

    # ---- against the version read
    def _in_store(self, hashed: Hashed, todo: np.ndarray,
                  sig_of: dict[int, int]) -> dict[int, Match]:
        version = self.version if self.version is not None \
            else self.store.head_version(self.dataset)
        if version is None:
            return {}
        parts = self._index(version)
        queries = Queries.of(hashed.keys[todo], hashed.number_hashes[todo])
        pairs = [part.sidecar.lookup(queries) for part in parts]
        asked = np.concatenate([q for q, _ in pairs]) if pairs else np.empty(0, np.int64)
        if not len(asked):
            return {}
        shard = np.concatenate([np.full(len(q), k) for k, (q, _) in enumerate(pairs)])
        rows = np.concatenate([r for _, r in pairs])
        # One candidate per (new row, stored row); the bands it shares rank it.
        found, bands = np.unique(np.stack([asked, shard, rows]), axis=1, return_counts=True)
        chosen: dict[int, list[tuple[int, int]]] = {}
        for k in np.lexsort((-bands, found[0])):
            q, s, r = (int(x) for x in found[:, k])
            if len(chosen.setdefault(q, [])) < MAX_CANDIDATES:
                chosen[q].append((s, r))
        texts = stored_rows(self.store, self.dataset, parts,
                            {c for cs in chosen.values() for c in cs}, version, self.prompt_key)
        out: dict[int, Match] = {}
        for q, cands in chosen.items():
            i = int(todo[q])
            best = self._best(hashed, i, sig_of, [texts[c] for c in cands])
            if best is not None:
                out[i] = best
        return out

    def _index(self, version: int) -> list[ShardIndex]:
        if self.progress is not None:
            return version_index(self.store, self.dataset, version, self.params, self.progress)
        with progress_bar() as bar:  # drawn only on a terminal (`dyngen round`)
            return version_index(self.store, self.dataset, version, self.params, bar)

    def _best(self, hashed: Hashed, i: int, sig_of: dict[int, int],
              candidates: list[Stored]) -> Match | None:
        """The most similar candidate at or above the threshold with the same numbers and
        no different answer."""
        mine = hashed.sets[i]
        assert mine is not None
        best: tuple[float, Stored, set[str], str] | None = None
        for cand in candidates:
            if numbers(cand.text) != hashed.numbers[i]:
                continue  # a number hash collision: the numbers differ
            answers = compare(self._answers[i], cand.answer)
            if answers == DIFFERENT:
                continue  # another answer: another task
            theirs = shingles_of(words(cand.text), self.params.ngram)
            score = jaccard(mine, theirs)
            if score >= self.threshold and (best is None or score > best[0]):
                best = (score, cand, theirs, answers)
        if best is None:
            return None
        other = signatures([best[2]], self.params)[0]
        estimate = float(np.mean(other == hashed.signatures[sig_of[i]]))
        return Match(best[1].where, best[0], estimate, best[3])

    # ---- within the round
    def _in_round(self, hashed: Hashed, todo: list[int], sig_of: dict[int, int],
                  out: list[str | None]) -> None:
        """Each row against the rows of this round kept before it."""
        earlier = _shared_bands(hashed, todo)
        for i in sorted(earlier):
            match = None
            ranked = sorted(earlier[i].items(), key=lambda item: -item[1])
            for j, _ in ranked[:MAX_CANDIDATES]:
                if out[j] is not None or hashed.numbers[j] != hashed.numbers[i]:
                    continue  # rejected rows are not in the dataset; other numbers
                answers = compare(self._answers[i], self._answers[j])
                if answers == DIFFERENT:
                    continue
                score = jaccard(hashed.sets[i] or set(), hashed.sets[j] or set())
                if score >= self.threshold and (match is None or score > match.exact):
                    estimate = float(np.mean(hashed.signatures[sig_of[i]]
                                             == hashed.signatures[sig_of[j]]))
                    match = Match(f"generated row {j} of this round", score, estimate, answers)
            if match is not None:
                out[i] = _detail(match, self.answer_gate)


def stored_rows(store: Store, dataset: str, parts: list[ShardIndex],
                wanted: set[tuple[int, int]], version: int,
                prompt_key: str) -> dict[tuple[int, int], Stored]:
    """Each wanted (shard, row) of a version's index, read from the memory-mapped shards:
    its text, where it is (the row, the version and the version that added it) and its
    reference answer's key (None if it has no comparable one)."""
    out = {}
    for s in sorted({s for s, _ in wanted}):
        part = parts[s]
        rows = sorted(r for t, r in wanted if t == s)
        table = _answer_view(sh.open_table(store.shard_path(dataset, part.info,
                                                              version)).table, prompt_key)
        for r, found in zip(rows, _take(table, rows), strict=True):
            prompt, v = found.get(prompt_key), found.get(sh.VERSION_COLUMN)
            by = "" if v is None else f" (added by version {v})"
            answer = answer_key({prompt_key: prompt, **{
                outer: {inner: found.get(f"{outer}.{inner}") for inner in fields}
                for outer, fields in ANSWER_FIELDS.items()}}, prompt_key)
            out[(s, r)] = Stored(prompt_text(prompt),
                                 f"row {part.start + r} of version {version}{by}", answer)
    return out


def _answer_view(table: pa.Table, prompt_key: str) -> pa.Table:
    """A shard's prompt and version columns with only the fields an answer is read from
    (its struct columns flattened, zero-copy: a row's whole extra_info is never converted)."""
    names = [prompt_key, sh.VERSION_COLUMN]
    names += [f"{o}.{i}" for o, fields in ANSWER_FIELDS.items() for i in fields]
    keep = [c for c in (prompt_key, sh.VERSION_COLUMN, *ANSWER_FIELDS)
            if c in table.column_names]
    flat = table.select(keep).flatten()
    return flat.select([n for n in names if n in flat.column_names])


def _take(table: pa.Table, rows: list[int]) -> list[dict[str, Any]]:
    """The rows at sorted positions `rows`, each record batch asked only for its own (a
    table's `take` would first copy each whole column of a shard's many batches into one)."""
    out: list[dict[str, Any]] = []
    start, k = 0, 0
    for batch in table.to_batches():
        end = start + batch.num_rows
        mine = []
        while k < len(rows) and rows[k] < end:
            mine.append(rows[k] - start)
            k += 1
        if mine:
            out += batch.take(pa.array(mine, pa.int64())).to_pylist()
        start = end
    return out


def _shared_bands(hashed: Hashed, todo: list[int]) -> dict[int, dict[int, int]]:
    """For each row, the earlier rows of `todo` sharing a band and its number hash with it,
    and how many bands they share."""
    if len(todo) < 2:
        return {}
    rows = np.asarray(todo)
    salt = hashed.number_hashes[rows].astype(np.uint64)[:, None] * np.uint64(0x9E3779B97F4A7C15)
    flat = (hashed.keys[rows] ^ salt).reshape(-1)
    owner = np.repeat(rows, hashed.keys.shape[1])
    order = np.argsort(flat, kind="stable")  # stable: each run lists its rows in order
    flat, owner = flat[order], owner[order]
    cuts = np.flatnonzero(np.diff(flat)) + 1
    starts, ends = np.r_[0, cuts], np.r_[cuts, len(flat)]
    out: dict[int, dict[int, int]] = {}
    for k in np.flatnonzero(ends - starts >= 2).tolist():  # keys shared by two rows or more
        members = owner[starts[k]:ends[k]].tolist()
        for k, i in enumerate(members):
            for j in members[:k]:
                if j != i:
                    out.setdefault(i, {})[j] = out.setdefault(i, {}).get(j, 0) + 1
    return out


def _detail(match: Match, gate: bool) -> str:
    said = f"; {match.answers}" if gate else ""
    return (f"near-duplicate of {match.where}: Jaccard similarity {match.exact:.2f} "
            f"(MinHash estimate {match.estimate:.2f}), same numbers{said}")


def params_of(settings: Mapping[str, Any]) -> LshParams:
    """The hashing settings of a `round.near_duplicate` section."""
    return LshParams(num_perm=int(settings["num_perm"]), bands=int(settings["bands"]),
                     ngram=int(settings["ngram"]))
