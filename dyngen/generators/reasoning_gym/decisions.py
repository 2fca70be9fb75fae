"""When a family's level moves: its mean reward over a window of batch ends, at its level.

Free of reasoning-gym: this reads rollouts and a family's memory and says promote, demote
or hold. A family's memory (JSON, kept in the generator's state) is:

- `window`: `[reward sum, rollouts]` of each of the last `window` batch ends that had
  rollouts of the family at its current level (cleared when the level moves);
- `batch_ends`: how many such batch ends since the level last moved;
- `fell_from`: `{level: times}`, how often the family was demoted from a level.

A level the family fell from is tried again only after `window * 2**times` batch ends at
the level below with a mean at or above `promote_at`: a policy that masters level H but
not H + 1 settles at H, with ever rarer visits to H + 1 (which stay open, should the policy
improve). Without that wait, a threshold alone would swing between H and H + 1 for ever.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc

from dyngen.generators.proposer.text import question_of
from dyngen.generators.questions import rows_asking
from dyngen.generators.reasoning_gym.families import SOURCE_PREFIX, family_of_source
from dyngen.rollout_format import Rollout

PROMOTED, DEMOTED, HELD = "promoted", "demoted", "held"


@dataclass(frozen=True)
class Decision:
    """What a round decided for one family, and the mean reward that decided it."""

    decision: str
    mean: float | None
    level: int  # the level after the decision
    why: str

    def as_dict(self) -> dict[str, Any]:
        """The decision as the round's stats record it."""
        mean = None if self.mean is None else round(self.mean, 4)
        return {"decision": self.decision, "mean": mean, "level": self.level, "why": self.why}


def fresh_memory() -> dict[str, Any]:
    """A family's memory before its first batch end."""
    return {"window": [], "batch_ends": 0, "fell_from": {}}


def decide(memory: dict[str, Any], level: int, top: int, seen: tuple[float, int] | None,
           cfg: Mapping[str, Any]) -> tuple[str, float | None, str]:
    """Fold this batch end's `(reward sum, rollouts)` at the family's level into `memory`
    and return (decision, mean, why); the caller moves the level and calls `moved`."""
    window = int(cfg["window"])
    if seen is not None and seen[1] > 0:
        memory["window"] = [*memory["window"], [float(seen[0]), int(seen[1])]][-window:]
        memory["batch_ends"] += 1
    if len(memory["window"]) < window:
        mean = _mean(memory["window"])
        return HELD, mean, f"{len(memory['window'])} of {window} batch ends at this level"
    mean = _mean(memory["window"])
    assert mean is not None
    if mean >= cfg["promote_at"]:
        if level >= top:
            return HELD, mean, "at the top level"
        wait = window * 2 ** int(memory["fell_from"].get(str(level + 1), 0))
        if memory["batch_ends"] < wait:
            return HELD, mean, (f"fell from level {level + 1} before: tries it again after "
                                f"{wait} batch ends here ({memory['batch_ends']} so far)")
        return PROMOTED, mean, f"mean {mean:.3f} >= promote_at {cfg['promote_at']}"
    if mean <= cfg["demote_at"]:
        if level <= 0:
            return HELD, mean, "at level 0"
        return DEMOTED, mean, f"mean {mean:.3f} <= demote_at {cfg['demote_at']}"
    return HELD, mean, f"mean {mean:.3f} between demote_at and promote_at"


def moved(memory: dict[str, Any], decision: str, old_level: int, new_level: int) -> None:
    """Start a new window at the new level; remember a fall, forget falls below a rise."""
    memory["window"], memory["batch_ends"] = [], 0
    if decision == DEMOTED:
        key = str(old_level)
        memory["fell_from"][key] = int(memory["fell_from"].get(key, 0)) + 1
    elif decision == PROMOTED:
        # Leaving a level upwards shows it mastered: falls from it and below are forgotten
        # (a retry of the level fallen from keeps its count, so the next wait doubles).
        memory["fell_from"] = {k: v for k, v in memory["fell_from"].items()
                               if int(k) > old_level}


def _mean(window: list[list[float]]) -> float | None:
    count = sum(n for _, n in window)
    return sum(s for s, _ in window) / count if count else None


@dataclass(frozen=True)
class Seen:
    """One rollout's family and level (None: not known), and its reward."""

    family: str | None
    level: int | None
    score: float


def attribute(rollouts: list[Rollout], rows: Any) -> list[Seen]:
    """Each rollout's family (its own `data_source`, else the dataset row with the same
    prompt's) and level (its own `extra_info.reasoning_gym.level`, else that row's)."""
    found = [(_own_family(r), _own_level(r), r) for r in rollouts]
    wanted = {question_of(r.prompt) for fam, lvl, r in found if fam is None or lvl is None}
    index = _row_index(rows, wanted - {""}) if wanted else {}
    out = []
    for family, level, r in found:
        known = index.get(question_of(r.prompt))
        if known is not None and (family is None or family == known[0]):
            family, level = known[0], level if level is not None else known[1]
        out.append(Seen(family, level, r.score))
    return out


def tally(seen: Iterable[Seen], levels: Mapping[str, int]) -> tuple[dict[str, tuple[float, int]],
                                                                    dict[str, int]]:
    """Per family, (reward sum, rollouts) at its current level (an unknown level counts);
    and how many rollouts were left out: `other_level`, `no_family`."""
    sums: dict[str, tuple[float, int]] = {}
    left = {"other_level": 0, "no_family": 0}
    for s in seen:
        if s.family not in levels:
            left["no_family"] += 1
        elif s.level is not None and s.level != levels[s.family]:
            left["other_level"] += 1
        else:
            total, count = sums.get(s.family, (0.0, 0))
            sums[s.family] = (total + s.score, count + 1)
    return sums, left


def _own_family(r: Rollout) -> str | None:
    return family_of_source(r.record.get("data_source"))


def _own_level(r: Rollout) -> int | None:
    return _level_of(r.record.get("extra_info"))


def _level_of(extra_info: Any) -> int | None:
    info = extra_info.get("reasoning_gym") if isinstance(extra_info, Mapping) else None
    level = info.get("level") if isinstance(info, Mapping) else None
    return level if isinstance(level, int) and not isinstance(level, bool) else None


def _row_index(rows: Any, questions: set[str]) -> dict[str, tuple[str, int | None]]:
    """(family, level) of the dataset's reasoning-gym rows whose question is wanted.

    Trainers' rollouts files carry only prompts, so this runs most rounds over the whole
    dataset: the rows are picked in Arrow (reasoning-gym rows, a message with a wanted
    text) and only those become Python objects.
    """
    names = rows.column_names if hasattr(rows, "column_names") else []
    if not questions or not {"prompt", "data_source"} <= set(names):
        return {}
    columns = ["prompt", "data_source"] + (["extra_info"] if "extra_info" in names else [])
    out: dict[str, tuple[str, int | None]] = {}
    for _, row in rows_asking(rows, questions, columns, keep=_reasoning_gym_rows):
        question = question_of(row["prompt"])
        if question in questions:
            family = family_of_source(row["data_source"])
            if family is not None:
                out[question] = (family, _level_of(row.get("extra_info")))
    return out


def _reasoning_gym_rows(batch: Any) -> Any:
    """Which rows of an Arrow batch are reasoning-gym's (by data_source)."""
    return pc.starts_with(batch["data_source"], SOURCE_PREFIX)
