"""What a round adds to the difficulty record: observations, retirements, revivals, warnings.

- **Observations.** The band's measurement of each row the round keeps (`extra_info.
  solve_rate`, at the policy step that measured it) and, for each batch end the round
  covers (and a trigger's own rollouts file), each prompt's group of completions (a
  rollout passes when its score is at least `round.solve_rate.pass_threshold`), at that
  batch end's step, for prompts that are rows of the dataset.
- **Retirement.** A row whose observations within `retire_window_steps` of the newest step
  hold at least `retire_min_samples` completions, all right (or all wrong), is retired with
  that evidence: the trainer-side sampler no longer draws it. Its rows stay stored.
- **Revival.** A row retired as all wrong comes back when its data source's recent pass
  rate (its trainer groups in the window) has risen by `revive_rise` since its retirement.
- **A broken reward.** When at least `broken_reward_min_groups` of a data source's groups in
  this round came back and `broken_reward_share` of them were all wrong, the round warns
  once (per data source and dataset), naming the source and the trainer's reward functions,
  and retires none of that source's rows as too hard while it lasts: a grader that never
  matches the model's format would otherwise retire everything.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dyngen.difficulty.record import (
    SNAPSHOT_EVERY,
    DifficultyBook,
    Observation,
    key_text,
    write_observations,
)
from dyngen.errors import DyngenError
from dyngen.store.keys import prompt_key
from dyngen.text import question_of

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DifficultySettings:
    """`round.difficulty` (and the pass threshold `round.solve_rate` grades by)."""

    enabled: bool = True
    half_life_steps: float = 4.0
    retire_min_samples: int = 16
    retire_window_steps: int = 8
    revive_rise: float = 0.25
    broken_reward_min_groups: int = 8
    broken_reward_share: float = 0.95
    pass_threshold: float = 1.0

    @classmethod
    def from_config(cls, cfg: Any) -> DifficultySettings:
        """The settings of a round's config."""
        d = cfg.round.difficulty
        return cls(bool(d.enabled), float(d.half_life_steps), int(d.retire_min_samples),
                   int(d.retire_window_steps), float(d.revive_rise),
                   int(d.broken_reward_min_groups), float(d.broken_reward_share),
                   float(cfg.round.solve_rate.pass_threshold))


def rollouts_by_step(context: Any) -> list[tuple[int, Sequence[Any]]]:
    """The rollouts the round sees, by training step: each covered batch end's, and the
    trigger's own file when the trigger names no run (read as the generator reads it; a
    file that cannot be read is left out with a warning)."""
    out: list[tuple[int, Sequence[Any]]] = [(int(b.step), b.rollouts)
                                            for b in context.batch_ends]
    trig = context.trigger
    if trig.rollouts is not None and trig.run is None and trig.step is not None:
        try:
            out.append((int(trig.step), context.rollouts_policy.read(trig.rollouts)))
        except DyngenError as exc:
            logger.warning("dyngen: the trigger's rollouts are not observed: %s", exc)
    return out


def trainer_groups(rollouts: Iterable[tuple[int, Sequence[Any]]], threshold: float
                   ) -> list[tuple[int, Any, int, int]]:
    """(step, prompt, passed, samples) of each prompt's completions at each step."""
    return [(step, *group) for step, lines in rollouts
            for group in prompt_groups(((r.prompt, r.score) for r in lines), threshold)]


def prompt_groups(scored: Iterable[tuple[Any, float]], threshold: float
                  ) -> list[tuple[Any, int, int]]:
    """(prompt, passed, samples) of each prompt's completions, from (prompt, score) pairs;
    a completion passes when its score is at least `threshold`."""
    groups: dict[int, tuple[Any, list[float]]] = {}
    for prompt, score in scored:
        groups.setdefault(prompt_key(prompt), (prompt, []))[1].append(float(score))
    return [(prompt, sum(s >= threshold for s in scores), len(scores))
            for prompt, scores in groups.values()]


def sources_of(data: Any, prompt_column: str, questions: set[str]) -> dict[int, str]:
    """Prompt key -> data_source of the rows whose question is one of `questions`."""
    out: dict[int, str] = {}
    if not questions or prompt_column not in data.column_names:
        return out
    names = [prompt_column] + (["data_source"] if "data_source" in data.column_names else [])
    for batch in data.select_columns(names).iter(batch_size=4096):
        sources = batch.get("data_source") or [""] * len(batch[prompt_column])
        for prompt, source in zip(batch[prompt_column], sources, strict=True):
            if question_of(prompt) in questions:
                out[prompt_key(prompt)] = str(source or "")
    return out


def band_observations(kept: Sequence[Mapping[str, Any]], prompt_column: str,
                      step: int) -> list[Observation]:
    """The band's measurement of each kept row that has one."""
    out = []
    for row in kept:
        info = row.get("extra_info")
        measured = info.get("solve_rate") if isinstance(info, Mapping) else None
        if isinstance(measured, Mapping) and measured.get("samples"):
            out.append(Observation(prompt_key(row.get(prompt_column)), step,
                                   int(measured["passed"]), int(measured["samples"]),
                                   str(row.get("data_source") or ""), "band"))
    return out


def round_difficulty(store: Any, settings: DifficultySettings, context: Any, parent: Any,
                     kept: Sequence[Mapping[str, Any]], band_step: int | None
                     ) -> dict[str, Any] | None:
    """The round's `difficulty` lineage entry (its observations written into the store),
    or None when it has nothing to record."""
    if not settings.enabled:
        return None
    dataset, column = context.dataset, parent.prompt_key
    book = DifficultyBook.at(store, dataset, parent.version)
    groups = trainer_groups(rollouts_by_step(context), settings.pass_threshold)
    step = band_step if band_step is not None else (context.step or book.now)
    observations = band_observations(kept, column, int(step or 0))
    if groups:
        sources = sources_of(store.load(dataset, parent.version), column,
                             {question_of(g[1]) for g in groups})
        sources.update({o.key: o.source for o in observations})
        observations += [Observation(k, s, p, n, sources[k], "trainer")
                         for s, prompt, p, n in groups if (k := prompt_key(prompt)) in sources]
    if not observations:
        return None
    book.add(observations)
    trainer = [o for o in observations if o.kind == "trainer"]
    warnings = _broken_reward(book, trainer, settings, context.metrics)
    flagged = {w["source"] for w in warnings} | {
        s for s in book.warned if _all_wrong_share(trainer, s) >= settings.broken_reward_share}
    retired = _retire(book, {o.key for o in trainer}, settings, flagged)
    revived = _revive(book, trainer, settings)
    entry = {"observations": write_observations(store, dataset, observations),
             "now": book.now, "half_life_steps": settings.half_life_steps,
             "retired": retired, "revived": revived, "warnings": warnings}
    if context.round - book.snapshot >= SNAPSHOT_EVERY:  # the next rounds start from here
        book.mark(entry)
        entry["snapshot"] = {**book.write_snapshot(store, dataset), "parent": parent.version}
    return entry


def _retire(book: DifficultyBook, keys: set[int], settings: DifficultySettings,
            flagged: set[str]) -> list[dict[str, Any]]:
    out = []
    for key in sorted(keys - set(book.retired)):
        passed, samples = book.recent(key, settings.retire_window_steps)
        if samples < settings.retire_min_samples or 0 < passed < samples:
            continue
        source = book.sources.get(key, "")
        if passed == 0 and source in flagged:
            continue
        out.append({"key": key_text(key), "why": "all_right" if passed else "all_wrong",
                    "passed": passed, "samples": samples, "source": source,
                    "window": [book.now - settings.retire_window_steps, book.now],
                    "source_rate": _source_rate(book, source, settings.retire_window_steps)})
    return out


def _revive(book: DifficultyBook, trainer: Sequence[Observation],
            settings: DifficultySettings) -> list[dict[str, Any]]:
    out = []
    seen = {o.source for o in trainer}
    for key, entry in sorted(book.retired.items()):
        source = str(entry.get("source") or "")
        if entry.get("why") != "all_wrong" or source not in seen:
            continue
        since = int((entry.get("window") or [0, 0])[1])  # the step it was retired at
        rate = _source_rate(book, source, book.now - since - 1, settings.retire_min_samples)
        before = float(entry.get("source_rate") or 0.0)
        if rate is not None and rate >= before + settings.revive_rise:
            out.append({"key": key_text(key), "why": "source_rate_rose", "source": source,
                        "source_rate": rate, "at_retirement": before})
    return out


def _source_rate(book: DifficultyBook, source: str, window: int, at_least: int = 1
                 ) -> float | None:
    """The pass rate of a data source's rows not retired, over their observations within
    `window` steps of `now`; None with fewer than `at_least` completions."""
    passed = samples = 0
    for key, evidence in book.evidence.items():
        if book.sources.get(key) == source and key not in book.retired:
            for e in evidence:
                if e.step >= book.now - window:
                    passed, samples = passed + e.passed, samples + e.samples
    return passed / samples if samples >= max(1, at_least) else None


def _all_wrong_share(trainer: Sequence[Observation], source: str) -> float:
    groups = [o for o in trainer if o.source == source and o.samples >= 2]
    return sum(o.passed == 0 for o in groups) / len(groups) if groups else 0.0


def _broken_reward(book: DifficultyBook, trainer: Sequence[Observation],
                   settings: DifficultySettings, metrics: Mapping[str, Any]
                   ) -> list[dict[str, Any]]:
    """One warning per data source whose groups nearly all came back all wrong (once)."""
    by_source: dict[str, list[Observation]] = defaultdict(list)
    for o in trainer:
        if o.samples >= 2:
            by_source[o.source].append(o)
    rewards = sorted({k.split("/")[1] for k in metrics if k.startswith("rewards/")
                      and k.count("/") >= 2})
    out = []
    for source, groups in sorted(by_source.items()):
        wrong = sum(o.passed == 0 for o in groups)
        if (source in book.warned or len(groups) < settings.broken_reward_min_groups
                or wrong < settings.broken_reward_share * len(groups)):
            continue
        named = ", ".join(rewards) if rewards else "the trainer's reward function"
        message = (f"data source {source or '(none)'!r}: {wrong} of {len(groups)} groups of "
                   f"completions came back all wrong (reward: {named}). A reward that never "
                   "matches the model's answer format starves a learnability sampler; check "
                   "the reward on a few completions. Rows of this source are not retired as "
                   "too hard while this lasts.")
        logger.warning("dyngen: %s", message)
        out.append({"source": source, "rewards": rewards, "all_wrong": wrong,
                    "groups": len(groups), "message": message})
    return out
