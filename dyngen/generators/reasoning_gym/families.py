"""reasoning-gym's task families as the curriculum uses them: names, levels, entries, scorers.

A family's level is its curriculum's global level (`get_max_level`): reasoning-gym moves it
with `increment_global_level` / `decrement_global_level`, and `set_global_level` puts a
curriculum back at a level recorded in the dataset's lineage. A family without a
curriculum has one level, 0: its default configuration.

Entries are stored as JSON text (`encode_entry`): their metadata differ in shape from one
family to the next (and hold tuples and integer-keyed dicts that plain JSON would turn into
lists and string keys, which some scorers then fail to match), so a tagged encoding keeps
them exactly and one string column holds every family's.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
from collections.abc import Callable
from typing import Any

from dyngen.errors import ConfigError, MissingDependencyError

SOURCE_PREFIX = "reasoning_gym/"
# Families that stand for a mix of others rather than tasks of their own.
NOT_A_FAMILY = frozenset({"composite"})
# Where a family whose entries have no single answer (answer None) keeps a checked example.
EXAMPLE_KEYS = ("example_answer", "example_correct_answer", "possible_answer")
_TUPLE, _PAIRS = "__tuple__", "__pairs__"


def rg() -> Any:
    """The reasoning_gym module, or an error that says how to install it."""
    try:
        import reasoning_gym
    except ImportError as exc:  # pragma: no cover - the extra is installed in tests
        raise MissingDependencyError(
            "ReasoningGymCurriculum needs reasoning-gym: pip install 'dyngen[reasoning-gym]'."
        ) from exc
    return reasoning_gym


def family_names() -> list[str]:
    """Every task family reasoning-gym registers."""
    from reasoning_gym.factory import DATASETS

    rg()
    return sorted(set(DATASETS) - NOT_A_FAMILY)


def check_families(names: list[str]) -> None:
    """Fail, naming close matches, if reasoning-gym has no family of one of these names."""
    known = family_names()
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
            hint = f"Did you mean {', '.join(close)}?" if close else (
                f"It has {len(known)} families, e.g. {', '.join(known[:5])}.")
            raise ConfigError(f"data.datagen.tasks: reasoning-gym has no task family {name!r}. "
                              f"{hint} (reasoning_gym.factory.DATASETS lists them all.)")


def family_of_source(data_source: Any) -> str | None:
    """The family a row's `data_source` names (`reasoning_gym/<family>`), else None."""
    if isinstance(data_source, str) and data_source.startswith(SOURCE_PREFIX):
        return data_source[len(SOURCE_PREFIX):] or None
    return None


class Family:
    """One family's curriculum (if it has one) at a level, and its entries at that level."""

    def __init__(self, name: str) -> None:
        from reasoning_gym.factory import create_curriculum, has_curriculum

        self.name = name
        self.curriculum = create_curriculum(name) if has_curriculum(name) else None

    @property
    def category(self) -> str:
        """reasoning-gym's category of the family (arithmetic, logic, games, ...)."""
        from reasoning_gym.factory import DATASETS

        return DATASETS[self.name][0].__module__.split(".")[1]

    @property
    def top(self) -> int:
        """The highest level: where every attribute is at its last value."""
        if self.curriculum is None or not self.curriculum.attributes:
            return 0
        return max(len(a.levels) for a in self.curriculum.attributes.values()) - 1

    @property
    def level(self) -> int:
        """The curriculum's global level (0 without a curriculum)."""
        return 0 if self.curriculum is None else int(self.curriculum.get_max_level())

    def start_at(self, level: int | None) -> None:
        """Put the curriculum at a recorded level (clamped), or leave it at its default."""
        if self.curriculum is not None and level is not None:
            self.curriculum.set_global_level(max(0, min(int(level), self.top)))

    def promote(self) -> bool:
        """One level up with reasoning-gym's curriculum; False at the top."""
        return self.curriculum is not None and bool(self.curriculum.increment_global_level())

    def demote(self) -> bool:
        """One level down with reasoning-gym's curriculum; False at level 0."""
        return self.curriculum is not None and bool(self.curriculum.decrement_global_level())

    def configuration(self) -> dict[str, Any]:
        """The dataset configuration at the current level, without seed and size."""
        if self.curriculum is None:
            return {}
        config = self.curriculum.generate_configuration()
        fields = {f.name for f in dataclasses.fields(config)}
        return {k: v for k, v in vars(config).items() if k in fields - {"seed", "size"}}

    def entries(self, size: int, seed: int) -> list[dict[str, Any]]:
        """`size` entries from `create_dataset` at the current level."""
        dataset = rg().create_dataset(self.name, size=size, seed=seed, **self.configuration())
        return [dataset[i] for i in range(size)]


def derived_seed(seed: int, dataset: str, round_no: int | str, family: str,
                 partition: int = 0) -> int:
    """A 32-bit seed of its own for each dataset, round, family and partition."""
    text = f"{seed}\0{dataset}\0{round_no}\0{family}\0{partition}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")


def ground_truth(entry: dict[str, Any]) -> str | None:
    """The entry's answer; for a family with none, the example answer it carries, if any."""
    answer = entry.get("answer")
    if isinstance(answer, str):
        return answer
    if answer is not None:
        return str(answer)
    metadata = entry.get("metadata") or {}
    for key in EXAMPLE_KEYS:
        if metadata.get(key) is not None:
            value = metadata[key]
            return value if isinstance(value, str) else json.dumps(value)
    return None


@functools.cache
def scorer(family: str, level: int | None = None) -> Callable[[str | None, dict[str, Any]], float]:
    """The family's scorer, from its dataset at `level` (built once per process).

    Some scorers read their dataset's configuration (word_ladder checks words against the
    word lengths its configuration loaded), so a row is scored by the dataset of its own
    level; without a level, by reasoning-gym's `get_score_answer_fn` (the default one).
    """
    if level is None:
        return rg().get_score_answer_fn(family)
    at = Family(family)
    at.start_at(level)
    return rg().create_dataset(family, size=1, seed=0, **at.configuration()).score_answer


def encode_entry(entry: dict[str, Any]) -> str:
    """An entry as JSON text that `decode_entry` turns back into an equal entry."""
    try:
        text = json.dumps(_tagged(entry), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        text = None
    if text is None or decode_entry(text) != entry:
        raise ValueError("the entry holds values JSON cannot keep (e.g. sets, NaN or objects)")
    return text


def decode_entry(text: str) -> dict[str, Any]:
    """The entry `encode_entry` stored."""
    return json.loads(text, object_hook=_untagged)


def _tagged(value: Any) -> Any:
    if isinstance(value, tuple):
        return {_TUPLE: [_tagged(v) for v in value]}
    if isinstance(value, list):
        return [_tagged(v) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and not {_TUPLE, _PAIRS} & set(value):
            return {k: _tagged(v) for k, v in value.items()}
        return {_PAIRS: [[_tagged(k), _tagged(v)] for k, v in value.items()]}
    return value


def _untagged(obj: dict[str, Any]) -> Any:
    if len(obj) == 1 and _TUPLE in obj:
        return tuple(obj[_TUPLE])
    if len(obj) == 1 and _PAIRS in obj:
        return {_hashable(k): v for k, v in obj[_PAIRS]}
    return obj


def _hashable(key: Any) -> Any:
    """A dict key back from JSON: a list (a tuple key JSON nested) as a tuple."""
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key
