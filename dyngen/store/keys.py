"""Prompt keys: a 64-bit hash of a normalised prompt, kept sorted beside each shard.

Dedup asks "is this prompt already in the dataset?" for the new rows only: each
shard's sorted key file is memory-mapped and binary-searched, so the cost grows with
the number of new rows and shards, not with the number of rows already stored.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from pathlib import Path
from typing import Any

import numpy as np

from dyngen.progress import QUIET, Bar

KEY_DTYPE = np.dtype("<u8")
CHUNK_ROWS = 20_000  # hashing runs ~50k prompts/s: a progress step every fraction of a second


def normalise_prompt(prompt: Any) -> str:
    """A canonical text for a prompt: NFC, trimmed, whitespace collapsed, roles lowercased."""
    if isinstance(prompt, str):
        messages: list[Any] = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, (list, tuple)):
        messages = list(prompt)
    else:
        return json.dumps(prompt, sort_keys=True, default=str)
    parts = []
    for m in messages:
        if isinstance(m, dict):
            role = str(m.get("role", "")).strip().lower()
            content = " ".join(unicodedata.normalize("NFC", str(m.get("content", ""))).split())
            parts.append([role, content])
        else:
            parts.append(["", " ".join(str(m).split())])
    return json.dumps(parts, ensure_ascii=False)


def prompt_key(prompt: Any) -> int:
    """The 64-bit key of one prompt."""
    digest = hashlib.blake2b(normalise_prompt(prompt).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def prompt_keys(prompts: list[Any], progress: Bar = QUIET) -> np.ndarray:
    """Keys of many prompts, in order, reporting each chunk of `CHUNK_ROWS` to `progress`."""
    keys = np.empty(len(prompts), dtype=KEY_DTYPE)
    for start in range(0, len(prompts), CHUNK_ROWS):
        chunk = prompts[start:start + CHUNK_ROWS]
        keys[start:start + len(chunk)] = np.fromiter((prompt_key(p) for p in chunk),
                                                     dtype=KEY_DTYPE, count=len(chunk))
        progress.advance(len(chunk))
    return keys


def sorted_bytes(keys: np.ndarray) -> bytes:
    """The content of a key file: the keys sorted, little-endian 64-bit."""
    return np.sort(np.asarray(keys).astype(KEY_DTYPE)).tobytes()


def contains(path: Path, keys: np.ndarray) -> np.ndarray:
    """Which of `keys` are in the sorted key file at `path` (memory-mapped, binary search)."""
    if path.stat().st_size == 0:
        return np.zeros(len(keys), dtype=bool)
    stored = np.memmap(path, dtype=KEY_DTYPE, mode="r")
    pos = np.searchsorted(stored, keys)
    found = np.zeros(len(keys), dtype=bool)
    inside = pos < len(stored)
    found[inside] = stored[pos[inside]] == keys[inside]
    return found
