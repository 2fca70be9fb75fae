"""ReasoningGymCurriculum: reasoning-gym's task families, each at the level the policy is ready for.

Each round reads the trigger's rollouts, takes each family's mean reward over its last
`window` batch ends at its level (decisions.py), moves the family's level with
reasoning-gym's own curriculum, and writes `rows_per_round` rows across the families by
weight from `create_dataset(family, size, seed, **configuration at its level)`. Every
row's label is checked before it is written: its ground truth, as a completion, must
score 1.0 through this package's reward (the family's own scorer on the stored entry),
and an answer that cannot be right must score less; rows that fail are not written and
are counted in `stats["unproved_labels"]`.

A family whose generator raises at its level is left out of the round and steps one level
down, as after a fall (decisions.py). A family reasoning-gym has no curriculum for stays at
level 0, its default configuration.

Config (data.datagen): tasks (a list of family names, or {name: weight}), rows_per_round
(64), promote_at (0.8), demote_at (0.3), window (4 batch ends per decision), seed (0).
In a round of P partitions each writes its share of every family's rows, with a seed of
its own; all make the same decisions (same rollouts, same memory).
"""

from __future__ import annotations

import copy
import logging
from collections import Counter
from typing import Any

import datasets

from dyngen.errors import ConfigError
from dyngen.generators.base import AbstractDataGenerator, rows_of
from dyngen.generators.reasoning_gym import decisions as dec
from dyngen.generators.reasoning_gym.families import (
    SOURCE_PREFIX,
    Family,
    check_families,
    decode_entry,
    derived_seed,
    encode_entry,
    ground_truth,
)
from dyngen.generators.reasoning_gym.reward import score
from dyngen.round.context import RoundContext

logger = logging.getLogger(__name__)
MAX_REASON_CHARS = 300
NOT_AN_ANSWER = "zq-dyngen-not-an-answer-7"


class ReasoningGymCurriculum(AbstractDataGenerator):
    """`rows_per_round` reasoning-gym rows a round, each family at its own level."""

    defaults = {"tasks": None, "rows_per_round": 64, "promote_at": 0.8, "demote_at": 0.3,
                "window": 4, "seed": 0}

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.settings()  # an unknown family fails here, before the round does any work

    def check_settings(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """Tasks as {family: weight}, each a family reasoning-gym has; thresholds in order."""
        cfg["tasks"] = _weights(cfg["tasks"])
        if cfg["rows_per_round"] < 1 or cfg["window"] < 1:
            raise ConfigError("data.datagen.rows_per_round and window must be at least 1, "
                              f"found {cfg['rows_per_round']} and {cfg['window']}.")
        if not 0.0 <= cfg["demote_at"] < cfg["promote_at"] <= 1.0:
            raise ConfigError("data.datagen: expected 0 <= demote_at < promote_at <= 1, found "
                              f"demote_at={cfg['demote_at']}, promote_at={cfg['promote_at']}.")
        check_families(list(cfg["tasks"]))
        return cfg

    def generate(self, dataset: Any, context: RoundContext | None = None) -> datasets.Dataset:
        """New rows at each family's level, after moving levels by the batch's rewards."""
        cfg = self.settings()
        rows = rows_of(dataset)
        previous = (context.previous_state if context is not None else None) or {}
        levels = dict(previous.get("levels") or {})
        memory = copy.deepcopy(dict(previous.get("memory") or {}))
        families = {name: Family(name) for name in cfg["tasks"]}
        for name, family in families.items():
            family.start_at(levels.get(name))
        stats: dict[str, Any] = {"rows": {}, "decisions": {}, "dropped": {},
                                 "unproved_labels": {}}
        self._say_no_curriculum(families, stats)
        self._decide(cfg, families, memory, rows, context, stats)
        new_rows = self._write(cfg, families, memory, len(rows), context, stats)
        levels.update({name: family.level for name, family in families.items()})
        self.state = {"levels": levels, "memory": memory}
        self.stats = stats
        return datasets.Dataset.from_list(new_rows) if new_rows else _empty()

    def _say_no_curriculum(self, families: dict[str, Family], stats: dict[str, Any]) -> None:
        """Families reasoning-gym has no curriculum for: said once a round, kept at level 0."""
        plain = sorted(name for name, family in families.items() if family.curriculum is None)
        if plain:
            stats["no_curriculum"] = plain
            logger.warning("ReasoningGymCurriculum: reasoning-gym has no curriculum for %s; "
                           "they stay at their default configuration (level 0).",
                           ", ".join(plain))

    def _decide(self, cfg: dict[str, Any], families: dict[str, Family],
                memory: dict[str, Any], rows: Any, context: RoundContext | None,
                stats: dict[str, Any]) -> None:
        """Each family's decision from this batch end's rollouts; levels moved in place."""
        rollouts = context.read_rollouts() if context is not None else []
        seen = dec.attribute(rollouts, rows) if rollouts else []
        sums, left = dec.tally(seen, {n: f.level for n, f in families.items()})
        stats["rollouts"] = {"read": len(rollouts),
                             "used": sum(n for _, n in sums.values()), **left}
        for name, family in families.items():
            mem = memory.setdefault(name, dec.fresh_memory())
            before = family.level
            decision, mean, why = dec.decide(mem, before, family.top, sums.get(name), cfg)
            if decision == dec.PROMOTED:
                family.promote()
            elif decision == dec.DEMOTED:
                family.demote()
            if decision != dec.HELD:
                dec.moved(mem, decision, before, family.level)
            stats["decisions"][name] = dec.Decision(decision, mean, family.level, why).as_dict()

    def _write(self, cfg: dict[str, Any], families: dict[str, Family], memory: dict[str, Any],
               start: int, context: RoundContext | None,
               stats: dict[str, Any]) -> list[dict[str, Any]]:
        """This partition's share of rows_per_round, by weight, each label checked."""
        part, parts = (context.partition, context.partitions) if context else (0, 1)
        name_of_dataset, round_no = (context.dataset, context.round_seed) if context else ("", 0)
        out: list[dict[str, Any]] = []
        for name, total in shares(cfg["tasks"], cfg["rows_per_round"]).items():
            count = total // parts + (1 if part < total % parts else 0)
            if count == 0:
                continue
            family = families[name]
            seed = derived_seed(cfg["seed"], name_of_dataset, round_no, name, part)
            try:
                entries = family.entries(count, seed)
            except Exception as exc:  # noqa: BLE001 - reasoning-gym's generators raise anything
                reason = f"{type(exc).__name__}: {exc}"[:MAX_REASON_CHARS]
                stats["dropped"][name] = {"level": family.level, "reason": reason}
                logger.warning("ReasoningGymCurriculum: %s at level %d raised, so it is left out "
                               "of this round: %s", name, family.level, reason)
                self._step_down(name, family, memory, stats)
                continue
            made: Counter[int] = Counter()
            for entry in entries:
                row = entry_row(name, family, entry, start + len(out))
                if row is None:
                    stats["unproved_labels"][name] = stats["unproved_labels"].get(name, 0) + 1
                    continue
                out.append(row)
                made[family.level] += 1
            stats["rows"][name] = {str(level): n for level, n in made.items()}
        return out


    @staticmethod
    def _step_down(name: str, family: Family, memory: dict[str, Any],
                   stats: dict[str, Any]) -> None:
        """A level whose generator raised counts as a fall: the next round is one below, and
        the level is tried again only after the wait a fall sets (decisions.py)."""
        before = family.level
        if family.demote():
            dec.moved(memory[name], dec.DEMOTED, before, family.level)
            stats["decisions"][name] = dec.Decision(
                dec.DEMOTED, stats["decisions"][name]["mean"], family.level,
                f"create_dataset raised at level {before}").as_dict()


def shares(weights: dict[str, float], total: int) -> dict[str, int]:
    """`total` rows split by weight (largest remainders get the rows left over)."""
    whole = sum(weights.values())
    exact = {name: total * w / whole for name, w in weights.items()}
    out = {name: int(x) for name, x in exact.items()}
    order = sorted(weights, key=lambda n: (-(exact[n] - out[n]), list(weights).index(n)))
    for name in order[:total - sum(out.values())]:
        out[name] += 1
    return out


def label_proved(truth: str, name: str, entry: dict[str, Any], level: int | None) -> bool:
    """Whether the label scores 1.0 by the family's scorer, as the reward reads it, and an
    answer that cannot be right does not (a scorer that accepts anything cannot grade)."""
    return (score(f"<answer>{truth}</answer>", name, entry, level) == 1.0
            and score(f"<answer>{NOT_AN_ANSWER}</answer>", name, entry, level) < 1.0)


def entry_row(name: str, family: Family, entry: dict[str, Any], index: int
              ) -> dict[str, Any] | None:
    """A row in verl's schema, or None if its label does not score 1.0 as stored."""
    truth = ground_truth(entry)
    if truth is None:
        return None
    try:
        stored = encode_entry(entry)
    except ValueError:
        return None
    if not label_proved(truth, name, decode_entry(stored), family.level):
        return None
    return {
        "data_source": SOURCE_PREFIX + name,
        "prompt": [{"role": "user", "content": str(entry["question"])}],
        "ability": family.category,
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"index": index, "reasoning_gym": {
            "family": name, "level": family.level, "entry": stored}},
    }


def _weights(tasks: Any) -> dict[str, float]:
    """`tasks` as {family: weight}: a list weighs each family 1."""
    expected = ("expected a list of reasoning-gym family names or a mapping {name: weight}, "
                "e.g. [basic_arithmetic, chain_sum]")
    if isinstance(tasks, (list, tuple)):
        tasks = dict.fromkeys(tasks, 1.0)
    if not isinstance(tasks, dict) or not tasks:
        raise ConfigError(f"data.datagen.tasks: {expected}; found {tasks!r}.")
    out = {}
    for name, weight in tasks.items():
        if not isinstance(name, str) or isinstance(weight, bool) \
                or not isinstance(weight, (int, float)) or not weight > 0:
            raise ConfigError(f"data.datagen.tasks: {expected}, each weight a positive number; "
                              f"found {name!r}: {weight!r}.")
        out[name] = float(weight)
    return out


def _empty() -> datasets.Dataset:
    """No rows, with the columns rows have."""
    return datasets.Dataset.from_dict({c: [] for c in
                                       ("data_source", "prompt", "ability", "reward_model",
                                        "extra_info")})
