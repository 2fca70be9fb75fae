"""The semantic sidecar as a kind of shard index (dyngen/store/index.py): a shard's prompts
embedded (dyngen/store/embeddings.py) into a vector sidecar (dyngen/store/vectors.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dyngen.progress import QUIET, Bar
from dyngen.store import vectors
from dyngen.store.embeddings import Embedder, VectorSettings, embedder
from dyngen.store.index import Kind
from dyngen.store.minhash import prompt_text

CHUNK_ROWS = 1024  # a progress step every few seconds with MiniLM on 2 cores


@dataclass(frozen=True)
class VecKind(Kind):
    """Semantic vectors of a shard's prompts, embedded as `settings` say."""

    settings: VectorSettings = VectorSettings()
    field = "vec"
    suffix = ".vec"
    label = "semantic"

    @property
    def embedder(self) -> Embedder:
        return embedder(self.settings)

    def wanted(self) -> dict[str, Any]:
        """The header this kind's sidecars carry."""
        return vectors.wanted_header(self.embedder.header())

    def read(self, path: Path) -> vectors.VecSidecar:
        return vectors.read(path)

    def header_digest(self, header: dict[str, Any]) -> str:
        return vectors.digest(header)

    def digest(self) -> str:
        return vectors.digest(self.wanted())

    def check(self, header: dict[str, Any], where: str) -> None:
        vectors.check_header(header, self.wanted(), where)

    def build(self, prompts: Sequence[Any], progress: Bar = QUIET) -> bytes:
        texts = [prompt_text(p) for p in prompts]
        parts = [np.zeros((0, self.embedder.dims), np.float32)]
        for start in range(0, len(texts), CHUNK_ROWS):
            chunk = texts[start:start + CHUNK_ROWS]
            parts.append(self.embedder.embed(chunk))
            progress.advance(len(chunk))
        keys = np.fromiter((vectors.number_key(t) for t in texts), np.uint32, len(texts))
        return vectors.encode(np.concatenate(parts), keys, self.wanted())

    def merge(self, parts: list[Any]) -> bytes:
        return vectors.merge(parts)


VECTORS = VecKind()  # reads and merges any semantic sidecar (compaction's, verify's)
