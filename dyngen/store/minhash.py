"""What near-duplicate detection hashes: a prompt's words, shingles, numbers and MinHash bands.

A prompt's text is the content of its messages (system messages aside: a shared system
prompt is boilerplate, not the task), lowercased, as words (`\\w+`, numbers kept as
written: no digit normalisation). Its shingles are the runs of `ngram` consecutive words.
The MinHash signature (rensa's R-MinHash, `num_perm` values, a fixed seed) is cut into
`bands` bands; each band becomes one 64-bit key mixed with its band number, so the keys
of all bands live in one sorted array per shard (dyngen/store/lsh.py).
"""

from __future__ import annotations

import json
import re
import unicodedata
import zlib
from dataclasses import asdict, dataclass
from functools import lru_cache
from itertools import chain
from typing import Any

import numpy as np

from dyngen.errors import ConfigError

SEED = 20240611  # the permutations' seed: part of every sidecar's header
ALGORITHM = "rensa.RMinHash"
BAND_HASH = "splitmix64 of each band's values, seeded by the band number"
WORD = re.compile(r"\w+")
# A number literal: digits with decimal or thousands separators, a minus sign where it
# cannot be a binary minus ("-3", not the "-" of "5-3").
NUMBER = re.compile(r"(?:(?<![\w)\]])-)?\d+(?:[.,]\d+)*")
_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


@dataclass(frozen=True)
class LshParams:
    """How a shard's prompts are shingled and hashed: what a sidecar's header records."""

    num_perm: int = 128
    bands: int = 16
    ngram: int = 5

    def __post_init__(self) -> None:
        for name in ("num_perm", "bands", "ngram"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"round.near_duplicate.{name}: expected an integer >= 1, "
                                  f"found {value!r}.")
        if self.num_perm % self.bands:
            raise ConfigError(
                f"round.near_duplicate: num_perm ({self.num_perm}) must be a multiple of "
                f"bands ({self.bands}), each band taking num_perm / bands values; set e.g. "
                f"num_perm={self.bands * max(1, self.num_perm // self.bands)}.")

    @property
    def rows_per_band(self) -> int:
        """Signature values hashed into each band's key."""
        return self.num_perm // self.bands

    def header(self) -> dict[str, Any]:
        """What a sidecar built with these parameters records (compared before any use)."""
        return {"library": "rensa", "library_version": library_version(),
                "algorithm": ALGORITHM, "seed": SEED, **asdict(self),
                "band_hash": BAND_HASH,
                "shingling": f"{self.ngram}-word shingles of the lowercased \\w+ words of the "
                             "non-system messages; numbers as written"}

    def digest(self) -> str:
        """A short name of `header()`: sidecars built alike share it."""
        text = json.dumps(self.header(), sort_keys=True)
        return f"{zlib.crc32(text.encode()):08x}"


@lru_cache(maxsize=1)
def library_version() -> str:
    """The installed rensa's version (a sidecar of another version is not compared)."""
    from importlib.metadata import version

    return version("rensa")


def prompt_text(prompt: Any) -> str:
    """The text of a prompt that says its task: its non-system messages (all, if none)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)):
        messages = [m for m in prompt if isinstance(m, dict)]
        task = [m for m in messages if str(m.get("role", "")).strip().lower() != "system"]
        return "\n".join(str(m.get("content") or "") for m in (task or messages))
    return "" if prompt is None else json.dumps(prompt, sort_keys=True, default=str)


def words(text: str) -> list[str]:
    """The lowercased words of a text (NFKC, so full-width and plain digits agree)."""
    return WORD.findall(unicodedata.normalize("NFKC", text).lower())


def numbers(text: str) -> tuple[str, ...]:
    """The number literals of a text, in order, as written."""
    return tuple(NUMBER.findall(unicodedata.normalize("NFKC", text)))


def shingles(tokens: list[str], ngram: int) -> set[str]:
    """The runs of `ngram` consecutive words (the whole text, if it is shorter)."""
    if len(tokens) <= ngram:
        return {" ".join(tokens)}
    return {" ".join(tokens[i:i + ngram]) for i in range(len(tokens) - ngram + 1)}


def jaccard(a: set[str], b: set[str]) -> float:
    """|a ∩ b| / |a ∪ b| (0 for two empty sets)."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def number_hash(nums: tuple[str, ...]) -> int:
    """A 32-bit hash of a number sequence: rows whose hashes differ have other numbers."""
    return zlib.crc32("\x1f".join(nums).encode())


def signatures(sets: list[set[str]], params: LshParams) -> np.ndarray:
    """MinHash signatures, one row of `num_perm` uint32 values per shingle set."""
    from rensa import RMinHash

    if not sets:
        return np.empty((0, params.num_perm), dtype=np.uint32)
    digests = RMinHash.digests_from_token_sets([list(s) for s in sets], params.num_perm,
                                              SEED)
    flat = np.fromiter(chain.from_iterable(digests), dtype=np.uint32,
                       count=len(sets) * params.num_perm)
    return flat.reshape(len(sets), params.num_perm)


def band_keys(sigs: np.ndarray, params: LshParams) -> np.ndarray:
    """One uint64 key per band and row, shape (rows, bands): equal keys, equal bands."""
    n = sigs.shape[0]
    parts = sigs.reshape(n, params.bands, params.rows_per_band).astype(np.uint64)
    h = np.broadcast_to(np.arange(params.bands, dtype=np.uint64) + np.uint64(1),
                        (n, params.bands)).copy()
    for j in range(params.rows_per_band):
        h = _splitmix64(h ^ parts[:, :, j])
    return h


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, element-wise (uint64 arithmetic wraps, as intended)."""
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & _MASK
    x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK
    x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK
    return x ^ (x >> np.uint64(31))


@dataclass(frozen=True)
class Hashed:
    """Rows as near-duplicate detection sees them: which are long enough, and their hashes."""

    eligible: np.ndarray  # bool per row: at least min_words words
    sets: list[set[str] | None]  # shingles of eligible rows
    numbers: list[tuple[str, ...]]
    keys: np.ndarray  # (rows, bands) uint64; rows not eligible hold zeros
    number_hashes: np.ndarray  # uint32 per row
    signatures: np.ndarray  # (eligible rows, num_perm)


def hash_prompts(prompts: list[Any], params: LshParams, min_words: int = 0) -> Hashed:
    """Everything near-duplicate detection needs of some prompts, in one pass."""
    texts = [unicodedata.normalize("NFKC", prompt_text(p)) for p in prompts]
    tokens = [WORD.findall(t.lower()) for t in texts]
    eligible = np.array([len(t) >= max(min_words, 1) for t in tokens], dtype=bool)
    sets: list[set[str] | None] = [shingles(t, params.ngram) if ok else None
                                   for t, ok in zip(tokens, eligible.tolist(), strict=True)]
    nums = [tuple(NUMBER.findall(t)) for t in texts]  # as `numbers`, already normalised
    sigs = signatures([s for s in sets if s is not None], params)
    keys = np.zeros((len(prompts), params.bands), dtype=np.uint64)
    keys[eligible] = band_keys(sigs, params)
    hashes = np.fromiter((number_hash(n) for n in nums), dtype=np.uint32, count=len(nums))
    return Hashed(eligible, sets, nums, keys, hashes, sigs)
