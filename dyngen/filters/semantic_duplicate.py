"""The semantic-duplicate filter: prompts that say a stored or earlier task again in other
words ("Tom had 3 apples and bought 4 more" for "Tom has 3 apples and buys 4 more").

Each prompt's text (its non-system messages) is embedded (dyngen/store/embeddings.py) and
looked up in the version's semantic sidecars (dyngen/store/vectors.py, one faiss index of
int8 vectors per shard). The reference answer decides first (`answer_gate`, on;
dyngen.filters.answers): two rows whose answers differ are two tasks, however close their
vectors ("How much does she pay?" / "How much change does she get?" on one set-up).
Two rows with the same answer are duplicates at a lower cosine, `same_answer_threshold`,
when one's number literals hold all of the other's (a paraphrase may reorder its numbers
or spell one out; a number variant changes one) and they are not the same words with the
numbers swapped ("9 percent of 50" / "50 percent of 9": a swap, whatever its answer).
Rows without a comparable answer keep the similarity rule: the cosine `threshold` AND,
with `numbers_must_match`, the same number literals in the same order
(dyngen.store.minhash.numbers): "What is 12 + 7?" and "What is 13 + 7?" are different
tasks with near-identical vectors, and so are "What is 12 - 7?" and "What is 7 - 12?". The
detail says which rule decided.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from dyngen.filters.answers import DIFFERENT, SAME, answer_keys, compare, numbers_within, swapped
from dyngen.filters.base import RowFilter
from dyngen.filters.near_duplicate import stored_rows
from dyngen.progress import Bar, progress_bar
from dyngen.rows import Row, column_of
from dyngen.store import Store
from dyngen.store.embeddings import VectorSettings
from dyngen.store.index import ShardIndex, version_index
from dyngen.store.minhash import numbers, prompt_text
from dyngen.store.semantic import VecKind
from dyngen.store.vectors import number_key

logger = logging.getLogger(__name__)
# Neighbours asked per row and shard: a dataset of many number variants of one template
# must still leave room for the one with the same numbers.
NEIGHBOURS = 32
READ_PER_ROW = 4  # candidates read back per row (their numbers checked as written)
READ_PER_ROW_GATED = 8  # with answers to compare: candidates of another answer are skipped


class SemanticDuplicateFilter(RowFilter):
    """Drop prompts whose embedding nearly equals (same numbers) a stored or earlier row's."""

    reason = "semantic_duplicate"
    lineage_key = "semantic_duplicate"

    def __init__(self, store: Store, dataset: str, version: int | None = None,
                 prompt_key: str = "prompt", *, settings: VectorSettings | None = None,
                 threshold: float = 0.95, numbers_must_match: bool = True,
                 answer_gate: bool = True, same_answer_threshold: float = 0.6,
                 progress: Bar | None = None) -> None:
        super().__init__(None)
        self.store, self.dataset, self.version = store, dataset, version
        self.prompt_key = prompt_key
        self.kind = VecKind(settings or VectorSettings())
        self.threshold, self.numbers_must_match = threshold, numbers_must_match
        self.answer_gate = answer_gate
        self.same_answer_threshold = min(same_answer_threshold, threshold)
        self._answers: list[int | None] = []  # the answer keys of the rows being checked
        self.progress = progress
        self._cost = (0, 0.0)

    @classmethod
    def from_config(cls, settings: Mapping[str, Any], store: Store, dataset: str,
                    version: int | None, prompt_key: str = "prompt"
                    ) -> SemanticDuplicateFilter:
        """The filter `round.semantic_duplicate` describes."""
        return cls(store, dataset, version, prompt_key, settings=settings_of(settings),
                   threshold=float(settings["threshold"]),
                   numbers_must_match=bool(settings["numbers_must_match"]),
                   answer_gate=bool(settings.get("answer_gate", True)),
                   same_answer_threshold=float(settings.get("same_answer_threshold", 0.6)))

    def check(self, rows: Sequence[Row]) -> list[str | None]:
        texts = [prompt_text(p) for p in column_of(rows, self.prompt_key)]
        out: list[str | None] = [None] * len(rows)
        if not texts:
            return out
        embedder = self.kind.embedder
        before = (embedder.rows_embedded, embedder.seconds)
        queries = embedder.embed(texts)
        self._cost = (self._cost[0] + embedder.rows_embedded - before[0],
                      self._cost[1] + embedder.seconds - before[1])
        keys = np.fromiter((number_key(t) for t in texts), np.uint32, len(texts))
        self._answers = answer_keys(rows, self.prompt_key) if self.answer_gate \
            else [None] * len(rows)
        for i, detail in self._in_store(texts, queries, keys).items():
            out[i] = detail
        self._in_round(texts, queries, keys, out)
        return out

    def lineage(self) -> dict[str, Any] | None:
        return {"model": self.kind.settings.model, "endpoint": self.kind.settings.endpoint,
                "threshold": self.threshold, "numbers_must_match": self.numbers_must_match,
                "answer_gate": self.answer_gate,
                "same_answer_threshold": self.same_answer_threshold,
                "rows_embedded": self._cost[0],
                "embedding_seconds": round(self._cost[1], 3)}

    # ---- against the version read
    def _in_store(self, texts: list[str], queries: np.ndarray,
                  keys: np.ndarray) -> dict[int, str]:
        version = self.version if self.version is not None \
            else self.store.head_version(self.dataset)
        if version is None:
            return {}
        parts = self._index(version)
        gated = np.array([a is not None for a in self._answers])
        # (cosine, shard, row) of each row's candidates: at or above the threshold with the
        # same number key (the similarity rule), or, for a row with an answer, at or above
        # the same-answer threshold (its answer and numbers are checked once read).
        found: dict[int, list[tuple[float, int, int]]] = {}
        for s, part in enumerate(parts):
            k = min(NEIGHBOURS, part.sidecar.rows)
            if not k:
                continue
            sims, ids = part.sidecar.search(queries, k)
            ok = (ids >= 0) & (sims >= self.threshold)
            if self.numbers_must_match:
                ok &= part.sidecar.number_keys[np.maximum(ids, 0)] == keys[:, None]
            ok |= (ids >= 0) & (sims >= self.same_answer_threshold) & gated[:, None]
            for q, j in zip(*np.nonzero(ok), strict=True):
                found.setdefault(int(q), []).append((float(sims[q, j]), s, int(ids[q, j])))
        chosen = {q: sorted(c, reverse=True)[:READ_PER_ROW_GATED if gated[q] else READ_PER_ROW]
                  for q, c in found.items()}
        stored = stored_rows(self.store, self.dataset, parts,
                             {(s, r) for c in chosen.values() for _, s, r in c}, version,
                             self.prompt_key)
        out = {}
        for q, cands in chosen.items():
            for cosine, s, r in cands:
                row = stored[(s, r)]
                rule = self.rule(texts[q], self._answers[q], row.text, row.answer, cosine)
                if rule is not None:  # else another answer, or a number-hash collision
                    out[q] = _detail(row.where, cosine, rule)
                    break
        return out

    def rule(self, mine: str, my_answer: int | None, theirs: str, their_answer: int | None,
             cosine: float) -> str | None:
        """What makes two rows one task (said in the detail), or None if they are two."""
        answers = compare(my_answer, their_answer) if self.answer_gate else None
        if answers == DIFFERENT:
            return None
        if answers == SAME and cosine >= self.same_answer_threshold and (
                not self.numbers_must_match or _numbers_fit(mine, theirs)):
            return "same answer" + (", numbers within" if self.numbers_must_match else "")
        if cosine < self.threshold:
            return None
        if self.numbers_must_match and _numbers(mine) != _numbers(theirs):
            return None  # other numbers, or a number-hash collision
        said = "same numbers" if self.numbers_must_match else ""
        if answers is None:
            return said
        return f"{said}; {answers}" if said else str(answers)

    def _index(self, version: int) -> list[ShardIndex]:
        if self.progress is not None:
            return version_index(self.store, self.dataset, version, self.kind, self.progress)
        with progress_bar() as bar:  # drawn only on a terminal (`dyngen round`)
            return version_index(self.store, self.dataset, version, self.kind, bar)

    # ---- within the round
    def _in_round(self, texts: list[str], queries: np.ndarray, keys: np.ndarray,
                  out: list[str | None]) -> None:
        """Each row against the rows of this round kept before it."""
        todo = [i for i, o in enumerate(out) if o is None]
        if len(todo) < 2:
            return
        sims = queries[todo] @ queries[todo].T
        for a in range(1, len(todo)):
            i = todo[a]
            low = self.threshold if self._answers[i] is None else self.same_answer_threshold
            for b in np.argsort(-sims[a, :a]):
                j = todo[int(b)]
                if sims[a, b] < low:
                    break
                if out[j] is not None:
                    continue  # rejected rows are not in the dataset
                if self.numbers_must_match and self._answers[i] is None and keys[i] != keys[j]:
                    continue
                rule = self.rule(texts[i], self._answers[i], texts[j], self._answers[j],
                                 float(sims[a, b]))
                if rule is not None:
                    out[i] = _detail(f"generated row {j} of this round", float(sims[a, b]),
                                     rule)
                    break


@lru_cache(maxsize=4096)
def _numbers(text: str) -> tuple[str, ...]:
    """A text's number literals (a round's rows are compared with many others)."""
    return numbers(text)


def _numbers_fit(mine: str, theirs: str) -> bool:
    """One row's numbers are all among the other's, and the two are not the same words with
    the numbers swapped (the words compared only when the numbers moved: few pairs)."""
    a, b = _numbers(mine), _numbers(theirs)
    return numbers_within(a, b) and (a == b or sorted(a) != sorted(b)
                                     or not swapped(mine, theirs))


def _detail(where: str, cosine: float, rule: str) -> str:
    said = f", {rule}" if rule else ""
    return f"semantic duplicate of {where}: cosine {min(cosine, 1.0):.3f}{said}"


def settings_of(settings: Mapping[str, Any]) -> VectorSettings:
    """The embedding settings of a `round.semantic_duplicate` section."""
    endpoint = settings.get("endpoint")
    return VectorSettings(model=str(settings["model"]),
                          endpoint=None if endpoint in (None, "") else str(endpoint))
