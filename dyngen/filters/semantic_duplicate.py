"""The semantic-duplicate filter: prompts that say a stored or earlier task again in other
words ("Tom had 3 apples and bought 4 more" for "Tom has 3 apples and buys 4 more").

Each prompt's text (its non-system messages) is embedded (dyngen/store/embeddings.py) and
looked up in the version's semantic sidecars (dyngen/store/vectors.py, one faiss index of
int8 vectors per shard). A row is rejected only when a stored or earlier row of the round
reaches the cosine `threshold` AND, with `numbers_must_match`, holds the same number
literals in the same order, the MinHash filter's rule (dyngen.store.minhash.numbers):
"What is 12 + 7?" and "What is 13 + 7?" are different tasks with near-identical vectors,
and so are "What is 12 - 7?" and "What is 7 - 12?" (why not a multiset: on the
benchmark's pairs it rejected every such swap and caught one paraphrase more in 72).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

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


class SemanticDuplicateFilter(RowFilter):
    """Drop prompts whose embedding nearly equals (same numbers) a stored or earlier row's."""

    reason = "semantic_duplicate"
    lineage_key = "semantic_duplicate"

    def __init__(self, store: Store, dataset: str, version: int | None = None,
                 prompt_key: str = "prompt", *, settings: VectorSettings | None = None,
                 threshold: float = 0.95, numbers_must_match: bool = True,
                 progress: Bar | None = None) -> None:
        super().__init__(None)
        self.store, self.dataset, self.version = store, dataset, version
        self.prompt_key = prompt_key
        self.kind = VecKind(settings or VectorSettings())
        self.threshold, self.numbers_must_match = threshold, numbers_must_match
        self.progress = progress
        self._cost = (0, 0.0)

    @classmethod
    def from_config(cls, settings: Mapping[str, Any], store: Store, dataset: str,
                    version: int | None, prompt_key: str = "prompt"
                    ) -> SemanticDuplicateFilter:
        """The filter `round.semantic_duplicate` describes."""
        return cls(store, dataset, version, prompt_key, settings=settings_of(settings),
                   threshold=float(settings["threshold"]),
                   numbers_must_match=bool(settings["numbers_must_match"]))

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
        for i, detail in self._in_store(texts, queries, keys).items():
            out[i] = detail
        self._in_round(texts, queries, keys, out)
        return out

    def lineage(self) -> dict[str, Any] | None:
        return {"model": self.kind.settings.model, "endpoint": self.kind.settings.endpoint,
                "threshold": self.threshold, "numbers_must_match": self.numbers_must_match,
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
        # (cosine, shard, row) of each row's candidates at or above the threshold.
        found: dict[int, list[tuple[float, int, int]]] = {}
        for s, part in enumerate(parts):
            k = min(NEIGHBOURS, part.sidecar.rows)
            if not k:
                continue
            sims, ids = part.sidecar.search(queries, k)
            ok = (ids >= 0) & (sims >= self.threshold)
            if self.numbers_must_match:
                same = part.sidecar.number_keys[np.maximum(ids, 0)] == keys[:, None]
                ok &= same
            for q, j in zip(*np.nonzero(ok), strict=True):
                found.setdefault(int(q), []).append((float(sims[q, j]), s, int(ids[q, j])))
        chosen = {q: sorted(c, reverse=True)[:READ_PER_ROW] for q, c in found.items()}
        stored = stored_rows(self.store, self.dataset, parts,
                             {(s, r) for c in chosen.values() for _, s, r in c}, version,
                             self.prompt_key)
        out = {}
        for q, cands in chosen.items():
            for cosine, s, r in cands:
                text, where = stored[(s, r)]
                if not self.numbers_must_match or _same_numbers(text, texts[q]):
                    out[q] = _detail(where, cosine, self.numbers_must_match)
                    break  # else a number-hash collision: the numbers differ
        return out

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
            best = None
            for b in np.argsort(-sims[a, :a]):
                j = todo[int(b)]
                if sims[a, b] < self.threshold:
                    break
                if out[j] is not None:
                    continue  # rejected rows are not in the dataset
                if self.numbers_must_match and (keys[i] != keys[j]
                                                or not _same_numbers(texts[i], texts[j])):
                    continue
                best = (j, float(sims[a, b]))
                break
            if best is not None:
                out[i] = _detail(f"generated row {best[0]} of this round", best[1],
                                 self.numbers_must_match)


def _same_numbers(a: str, b: str) -> bool:
    return numbers(a) == numbers(b)


def _detail(where: str, cosine: float, numbers_checked: bool) -> str:
    said = ", same numbers" if numbers_checked else ""
    return f"semantic duplicate of {where}: cosine {min(cosine, 1.0):.3f}{said}"


def settings_of(settings: Mapping[str, Any]) -> VectorSettings:
    """The embedding settings of a `round.semantic_duplicate` section."""
    endpoint = settings.get("endpoint")
    return VectorSettings(model=str(settings["model"]),
                          endpoint=None if endpoint in (None, "") else str(endpoint))
