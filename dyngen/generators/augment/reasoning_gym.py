"""`reasoning_gym`: a reasoning-gym row's family at its level, from a new seed.

The source's extra_info.reasoning_gym names its family and level (rows ReasoningGymCurriculum
wrote); the variant is `create_dataset(family, seed=<new>, **configuration at that level)`'s
entry, written as the curriculum writes its rows. A generated entry whose label the scorer
does not prove is drawn again (up to `redraws` times; counted as `unproved_labels`). `check`
proves each variant again from what it stores: the same family and level as its source, its
label scoring 1.0 by the family's scorer on the stored entry, an impossible answer less.
Rows of other sources are skipped (`not_reasoning_gym`). Needs `dyngen[reasoning-gym]`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from dyngen.errors import ConfigError
from dyngen.generators.augment.base import DEFAULTS, AugmentContext, Augmenter, Check, NotApplicable
from dyngen.generators.reasoning_gym.families import Family
from dyngen.generators.reasoning_gym.generator import entry_row, label_proved
from dyngen.generators.reasoning_gym.reward import entry_of


class ReasoningGymAugmenter(Augmenter):
    """New reasoning-gym rows of a source's family and level, each label scored."""

    method = "reasoning_gym"
    defaults = {**DEFAULTS, "redraws": 3}

    def opened(self, cfg: dict[str, Any]) -> None:
        """One Family per family and level this round (its curriculum is built once)."""
        self._families: dict[tuple[str, int | None], Family] = {}
        self._unproved: Counter[str] = Counter()

    def augment(self, row: dict[str, Any], context: AugmentContext) -> list[dict[str, Any]]:
        """One entry of the source's family and level from a new seed."""
        try:
            name, level, _ = entry_of(row.get("extra_info"), row.get("data_source"))
        except ConfigError:
            raise NotApplicable("not_reasoning_gym") from None
        family = self._family(name, level)
        for _ in range(int(context.settings["redraws"]) + 1):
            try:
                entry = family.entries(1, context.rng.getrandbits(32))[0]
            except Exception:  # noqa: BLE001 - reasoning-gym's generators raise anything
                raise NotApplicable("generator_raised") from None
            made = entry_row(name, family, entry, 0)
            if made is not None:
                return [made]
            self._unproved[name] += 1
        raise NotApplicable("unproved_label")

    def check(self, source: dict[str, Any], variant: dict[str, Any],
              context: AugmentContext) -> Check:
        """The same family and level as the source; the label proved by the scorer."""
        name, level, _ = entry_of(source.get("extra_info"), source.get("data_source"))
        got_name, got_level, entry = entry_of(variant.get("extra_info"),
                                              variant.get("data_source"))
        if (got_name, got_level) != (name, level):
            return ("other_family", f"{got_name} level {got_level}, its source {name} level "
                                    f"{level}")
        if not label_proved(str(variant["reward_model"]["ground_truth"]), name, entry, level):
            return ("unproved_label", f"{name}'s scorer does not give the label 1.0")
        return None

    def method_stats(self) -> dict[str, Any]:
        """Entries drawn again because the scorer did not prove their label, per family."""
        return {"unproved_labels": dict(sorted(self._unproved.items()))}

    def _family(self, name: str, level: int | None) -> Family:
        key = (name, level)
        if key not in self._families:
            try:
                family = Family(name)
            except Exception:  # noqa: BLE001 - a family this reasoning-gym does not know
                raise NotApplicable("unknown_family") from None
            family.start_at(level)
            if level is not None and family.level != level:
                raise NotApplicable("unknown_level")
            self._families[key] = family
        return self._families[key]
