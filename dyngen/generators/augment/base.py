"""Augmenter: new rows made from chosen rows of the dataset, each label checked, each traced.

A subclass writes `augment(row, context) -> list[row]` (and, to prove its labels, `check`);
the base does the rest each round:
  select    the source rows (select.py): `failed`, `band` or `random`;
  augment   each source, deep-copied, handed to `augment` with its AugmentContext, again
            until it made `variants_per_row` variants with different questions (at most
            VARIANT_TRIES calls a variant: its rng moves on, so each call draws anew);
            raising NotApplicable skips the row (counted by reason), raising BadRow
            quarantines it (e.g. a template that does not parse), with the reason;
  check     every variant must be a row with a question other than its source's and a
            label; then `check(source, variant, context)` proves its label, or says why not:
            such a variant is quarantined with that reason;
  record    each kept row carries extra_info.augmented_from = {version, index, method} (the
            source's version and position in it), and `stats` counts, per method, the rows
            made, kept, skipped and rejected by reason; at most `rows_per_round` rows.

Config (data.datagen): select (failed), rows_per_round (16), variants_per_row (1),
failed_below (1.0: a failed row's mean rollout score is below it), band ([0.0, 0.5]: the
solve rates `band` takes), seed (0), fit_schema (true), and a method's own keys.
"""

from __future__ import annotations

import copy
import logging
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import datasets

from dyngen.errors import ConfigError
from dyngen.generators.augment.select import SELECTIONS, Source, select_sources
from dyngen.generators.base import AbstractDataGenerator, rows_of
from dyngen.generators.schema import rows_as_dataset
from dyngen.llm import seed_int
from dyngen.round.context import RoundContext
from dyngen.text import question_of

logger = logging.getLogger(__name__)

AUGMENTED_FROM = {"version": datasets.Value("int64"), "index": datasets.Value("int64"),
                  "method": datasets.Value("string")}
DEFAULTS: dict[str, Any] = {"select": "failed", "rows_per_round": 16, "variants_per_row": 1,
                            "failed_below": 1.0, "band": (0.0, 0.5), "seed": 0,
                            "fit_schema": True}
# Fields of a source's extra_info that describe the source, not what is made from it.
NOT_INHERITED = ("solve_rate", "score")
VARIANT_TRIES = 3  # calls of `augment` per variant wanted, before a source gives fewer
Check = str | tuple[str, str] | None


class NotApplicable(Exception):  # noqa: N818 - a signal, not an error: the row is skipped
    """This method cannot make a row from this source (it is skipped and counted)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BadRow(Exception):  # noqa: N818 - the source is quarantined, the round goes on
    """The source row is malformed for this method: quarantined with `reason` and `detail`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass
class AugmentContext:
    """What `augment` and `check` know of one source row."""

    index: int  # the source's position in the version read
    version: int | None  # that version (None outside a round)
    rng: random.Random  # seeded by (seed, dataset, round, index, method): reproducible
    settings: dict[str, Any]
    round: RoundContext | None = None
    notes: dict[str, Any] = field(default_factory=dict)  # augment's notes for check


class Augmenter(AbstractDataGenerator):
    """New rows from chosen source rows: override `augment` (and `check` to prove labels)."""

    method: ClassVar[str] = "custom"  # extra_info.augmented_from.method of its rows
    defaults: ClassVar[Mapping[str, Any] | None] = DEFAULTS
    # extra_info fields this method adds to its rows, with their types (beside augmented_from)
    provenance_features: ClassVar[Mapping[str, Any]] = {}

    def augment(self, row: dict[str, Any], context: AugmentContext) -> list[dict[str, Any]]:
        """New rows made from `row` (a copy: change it freely); raise NotApplicable to skip."""
        raise NotImplementedError(f"{type(self).__name__} must define augment(row, context)")

    def check(self, source: dict[str, Any], variant: dict[str, Any],
              context: AugmentContext) -> Check:
        """None if the variant's label is proved, else why not (a reason, or (reason,
        detail)). The base has checked its shape already; override to prove the label."""
        return None

    def augment_batch(self, sources: list[dict[str, Any]], contexts: list[AugmentContext]
                      ) -> list[list[dict[str, Any]] | Exception]:
        """`augment` of each source, called until it made `variants_per_row` variants with
        different questions, or VARIANT_TRIES calls a variant made no more; a method asking
        a model overrides it to ask once."""
        out: list[list[dict[str, Any]] | Exception] = []
        for row, ctx in zip(sources, contexts, strict=True):
            wanted = int(ctx.settings["variants_per_row"])
            made: list[dict[str, Any]] = []
            try:
                for _ in range(wanted * VARIANT_TRIES):
                    made = _distinct([*made, *self.augment(copy.deepcopy(row), ctx)])
                    if len(made) >= wanted:
                        break
            except (NotApplicable, BadRow) as exc:
                if not made:  # a later call that finds no new one keeps what was made
                    out.append(exc)
                    continue
            out.append(made)
        return out

    def check_batch(self, pairs: list[tuple[dict[str, Any], dict[str, Any], AugmentContext]]
                    ) -> list[Check]:
        """`check` of each (source, variant, context); overridden to check in one call."""
        return [self.check(s, v, c) for s, v, c in pairs]

    def opened(self, cfg: dict[str, Any]) -> None:
        """Before the round's first source: open what the method needs (a model)."""

    def closed(self) -> None:
        """After the round's last source: close what `opened` opened."""

    def check_settings(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """A known selection, a band inside [0, 1], counts of at least one."""
        if cfg["select"] not in SELECTIONS:
            raise ConfigError(f"data.datagen.select: expected one of {', '.join(SELECTIONS)}; "
                              f"found {cfg['select']!r}.")
        band = list(cfg["band"])
        if len(band) != 2 or not all(isinstance(b, (int, float)) for b in band) \
                or not 0 <= band[0] <= band[1] <= 1:
            raise ConfigError(f"data.datagen.band: expected [low, high] with 0 <= low <= high "
                              f"<= 1 (solve rates); found {cfg['band']!r}.")
        for key in ("rows_per_round", "variants_per_row"):
            if int(cfg[key]) < 1:
                raise ConfigError(f"data.datagen.{key}: expected at least 1; found {cfg[key]!r}.")
        return cfg

    def generate(self, dataset: Any, context: RoundContext | None = None) -> datasets.Dataset:
        """At most rows_per_round new rows from the selected sources, labels checked."""
        cfg = self.settings()
        rows = rows_of(dataset)
        sources, selection = select_sources(cfg, rows, context)
        budget = _share(int(cfg["rows_per_round"]), context)
        tally: Counter[str] = Counter()
        skipped: Counter[str] = Counter()
        rejected: Counter[str] = Counter()
        self.rejected, made = [], []
        self.opened(cfg)
        try:
            at = 0
            while at < len(sources) and len(made) < budget:
                wanted = -(-(budget - len(made)) // int(cfg["variants_per_row"]))
                chunk = sources[at:at + wanted]
                at += len(chunk)
                pairs = self._variants(chunk, rows, cfg, context, skipped, tally)
                for (_, variant, _), why in zip(pairs, self.check_batch(pairs),
                                                    strict=True):
                    if why is not None:
                        reason, detail = (why, "") if isinstance(why, str) else why
                        rejected[reason] += 1
                        self.rejected.append({"reason": reason, "detail": detail,
                                              "row": variant})
                    elif len(made) < budget:
                        variant["extra_info"]["index"] = len(rows) + len(made)
                        made.append(variant)
                    else:  # a source's last variants, past rows_per_round
                        tally["over_budget"] += 1
        finally:
            self.closed()
        self.stats = self._stats(selection, len(sources), tally, skipped, rejected, len(made))
        self.stats.update(self.method_stats())
        if skipped:
            logger.warning("%s: skipped %d source rows %s cannot apply to: %s",
                           type(self).__name__, sum(skipped.values()), self.method,
                           dict(skipped))
        logger.info("%s: %s", type(self).__name__, self.stats)
        features = {"augmented_from": AUGMENTED_FROM, **self.provenance_features}
        return rows_as_dataset(made, rows, features, bool(cfg["fit_schema"]))

    def method_stats(self) -> dict[str, Any]:
        """What the method adds to the round's stats (e.g. its model's usage)."""
        return {}

    def _variants(self, chunk: Sequence[Source], rows: datasets.Dataset, cfg: dict[str, Any],
                  context: RoundContext | None, skipped: Counter[str], tally: Counter[str]
                  ) -> list[tuple[dict[str, Any], dict[str, Any], AugmentContext]]:
        """The chunk's sources augmented: their variants that have a row's shape, each with
        its provenance; the others skipped, quarantined or rejected here."""
        version = context.parent if context is not None else None
        dataset = context.dataset if context is not None else ""
        round_no = context.round_seed if context is not None else 0
        sources = [_plain(rows[s.index]) for s in chunk]
        contexts = [AugmentContext(s.index, version, random.Random(seed_int(
            cfg["seed"], dataset, round_no, s.index, self.method)), cfg, context)
            for s in chunk]
        results = self.augment_batch([copy.deepcopy(r) for r in sources], contexts)
        out = []
        for source, ctx, result in zip(sources, contexts, results, strict=True):
            tally["sources"] += 1
            if isinstance(result, NotApplicable):
                skipped[result.reason] += 1
                continue
            if isinstance(result, BadRow):
                tally["bad_sources"] += 1
                tally[f"rejected_{result.reason}"] += 1
                where = f"row {ctx.index}" + (f" of version {version}" if version is not None
                                              else "")
                self.rejected.append({"reason": result.reason,
                                      "detail": f"{where}: {result.detail}", "row": source})
                continue
            if isinstance(result, Exception):
                raise result
            for variant in _distinct(result)[:int(cfg["variants_per_row"])]:
                tally["made"] += 1
                shaped = _shaped(variant, source)
                if isinstance(shaped, tuple):
                    self.rejected.append({"reason": shaped[0], "detail": f"{shaped[1]} "
                                          f"(made from row {ctx.index})", "row": variant})
                    tally[f"rejected_{shaped[0]}"] += 1
                    continue
                info = shaped["extra_info"]
                for key in NOT_INHERITED:
                    info.pop(key, None)
                info["augmented_from"] = {"version": version, "index": ctx.index,
                                          "method": self.method}
                out.append((source, shaped, ctx))
        return out

    def _stats(self, selection: dict[str, Any], candidates: int, tally: Counter[str],
               skipped: Counter[str], rejected: Counter[str], kept: int) -> dict[str, Any]:
        """The round's counts: what was selected, and per method made / kept / skipped /
        rejected by reason (a variant refused for its shape counts among the rejected) /
        over_budget (proved, but past rows_per_round)."""
        for key, n in tally.items():
            if key.startswith("rejected_"):
                rejected[key.removeprefix("rejected_")] += n
        return {"select": selection, "candidates": candidates, "sources": tally["sources"],
                "skipped": sum(skipped.values()), "kept": kept,
                "methods": {self.method: {
                    "made": tally["made"], "kept": kept, "skipped": dict(sorted(skipped.items())),
                    "bad_sources": tally["bad_sources"], "over_budget": tally["over_budget"],
                    "rejected": dict(sorted(rejected.items()))}}}


def _share(total: int, context: RoundContext | None) -> int:
    """This partition's share of `total` rows, rounded up."""
    parts = context.partitions if context is not None else 1
    return -(-total // parts)


def _distinct(variants: Sequence[Any]) -> list[Any]:
    """The variants, but the second and later asking one question (spaces aside); what is
    not a row is left for the shape check to refuse."""
    seen: set[str] = set()
    out = []
    for variant in variants:
        prompt = variant.get("prompt") if isinstance(variant, Mapping) else None
        question = " ".join(question_of(prompt).split()) if isinstance(prompt, (list, str)) \
            else None
        if question is None or question not in seen:
            out.append(variant)
            if question is not None:
                seen.add(question)
    return out


def _plain(row: Mapping[str, Any]) -> dict[str, Any]:
    """A stored row without the store's own columns."""
    return {k: v for k, v in row.items() if not k.startswith("_dyngen_")}


def _shaped(variant: Any, source: dict[str, Any]) -> dict[str, Any] | tuple[str, str]:
    """The variant if it is a row with a new question and a label, else (reason, detail)."""
    if not isinstance(variant, Mapping):
        return ("bad_variant", f"expected a row (a dict), found {type(variant).__name__}")
    row = dict(variant)
    prompt, reward = row.get("prompt"), row.get("reward_model")
    question = question_of(prompt) if isinstance(prompt, (list, str)) else ""
    if not question:
        return ("bad_variant", "expected a prompt with a user message of text")
    truth = reward.get("ground_truth") if isinstance(reward, Mapping) else None
    if truth is None or not str(truth).strip():
        return ("bad_variant", "expected reward_model.ground_truth, the variant's label")
    if " ".join(question.split()) == " ".join(question_of(source.get("prompt")).split()):
        return ("unchanged", "the variant asks its source's question")
    info = row.get("extra_info")
    row["extra_info"] = dict(info) if isinstance(info, Mapping) else {}
    return row


def with_question(row: dict[str, Any], question: str, label: str) -> dict[str, Any]:
    """`row` asking `question` (its last user message, or its text) with `label`."""
    new = dict(row)
    prompt = row["prompt"]
    if isinstance(prompt, str):
        new["prompt"] = question
    else:
        messages = [dict(m) for m in prompt]
        last = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        messages[last]["content"] = question
        new["prompt"] = messages
    new["reward_model"] = {**row["reward_model"], "ground_truth": label}
    new["extra_info"] = dict(row.get("extra_info") or {})
    return new
