"""`rephrase`: a model rewrites a source's question; kept only where the label still holds.

The rewriting model (dyngen.llm: `endpoint`, `model_name`, ... or in-process) sees a few
worked rewrites and the source's question, and answers `variants_per_row` rewrites of one
line each, all sources in one call. A rewrite keeps its source's label, so it is checked
twice before it is kept:
  numbers  the numbers it states must be the source's, as multisets (1,000 and 1000 alike):
           else `numbers_changed`;
  solver   a solver (the policy's endpoint: `solver_endpoint`, `solver_model_name`, ...;
           unset, the rewriting model) answers it `samples` times, each answer graded by the
           row's reward (round.solve_rate's choice by data_source, or `reward_path` /
           `reward_name`); kept if at least `agree` of them give the source's label (its
           extra_info.agreement), else `solver_disagrees`, with the count.
Both kinds of rejected rewrite are quarantined with the reason. A source whose request failed
after its retries is skipped (`model_error`).

Config (data.datagen): the model's and solver's keys (dyngen.llm), max_new_tokens (96),
temperature (0.7), samples (4), agree (0.5), solve_max_tokens (128), solve_temperature
(0.7), pass_threshold (1.0), reward_path, reward_name (compute_score).
"""

from __future__ import annotations

from typing import Any

import datasets

from dyngen.errors import ConfigError
from dyngen.filters.solve_rate.grading import grade_rows
from dyngen.filters.solve_rate.rewards import RewardChooser
from dyngen.generators.augment.base import (
    DEFAULTS,
    AugmentContext,
    Augmenter,
    Check,
    NotApplicable,
    with_question,
)
from dyngen.generators.proposer.arithmetic import numbers_in
from dyngen.llm import MODEL_DEFAULTS, SOLVER_DEFAULTS, ChatModel, ChatRequest, chat_model, seed_int
from dyngen.text import question_of

SYSTEM = ("You rewrite questions in other words. Keep every number exactly as it is written. "
          "Reply with the rewritten question only, on one line.")
SHOTS = (
    ("Tom has 5 pens and buys 3 more. How many pens does he have?",
     "After buying 3 more pens, how many pens does Tom have if he started with 5?"),
    ("What is 12 * 4?", "Compute the value of 12 * 4."),
    ("A box holds 24 eggs. How many eggs are in 6 boxes?",
     "If each box holds 24 eggs, how many eggs do 6 boxes hold?"),
)
ASK = "Rewrite this question in other words, without answering it: "
_LABEL = ("rewritten question:", "rewritten:", "question:")


class RephraseAugmenter(Augmenter):
    """A model's rewrites of the source's question, kept where a solver confirms the label."""

    method = "rephrase"
    defaults = {**DEFAULTS, **MODEL_DEFAULTS, **SOLVER_DEFAULTS, "max_new_tokens": 96,
                "temperature": 0.7, "samples": 4, "agree": 0.5, "solve_max_tokens": 128,
                "solve_temperature": 0.7, "pass_threshold": 1.0, "reward_path": None,
                "reward_name": "compute_score"}
    provenance_features = {"agreement": datasets.Value("float64")}

    def check_settings(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """At least one sample, and `agree` a share in (0, 1]."""
        if int(cfg["samples"]) < 1 or not 0 < float(cfg["agree"]) <= 1:
            raise ConfigError(f"data.datagen: expected samples >= 1 and 0 < agree <= 1; "
                              f"found {cfg['samples']!r} and {cfg['agree']!r}.")
        return super().check_settings(cfg)

    def opened(self, cfg: dict[str, Any]) -> None:
        """The rewriting model now (a dead endpoint fails the round before any work); the
        solver when first needed."""
        self._models: dict[str, ChatModel] = {"model": chat_model(cfg)}
        self._models["model"].check()
        self._rewards = RewardChooser(cfg["reward_path"], str(cfg["reward_name"]))
        self._cfg = cfg

    def closed(self) -> None:
        """A served model's connections end with the round."""
        for model in getattr(self, "_models", {}).values():
            model.close()

    def augment_batch(self, sources: list[dict[str, Any]], contexts: list[AugmentContext]
                      ) -> list[list[dict[str, Any]] | Exception]:
        """Every source's rewrites, asked in one call."""
        cfg = self._cfg
        requests = [ChatRequest(messages_for(question_of(row["prompt"])),
                                n=int(cfg["variants_per_row"]),
                                max_tokens=int(cfg["max_new_tokens"]),
                                temperature=float(cfg["temperature"]),
                                seed=ctx.rng.getrandbits(32), stop=("\n",))
                    for row, ctx in zip(sources, contexts, strict=True)]
        results = self._models["model"].complete(requests)
        out: list[list[dict[str, Any]] | Exception] = []
        for row, result in zip(sources, results, strict=True):
            if not result.ok:
                out.append(NotApplicable("model_error"))
                continue
            label = row["reward_model"]["ground_truth"]
            out.append([with_question(row, text, label)
                        for text in map(rewrite_of, result.texts) if text])
        return out

    def check_batch(self, pairs: list[tuple[dict[str, Any], dict[str, Any], AugmentContext]]
                    ) -> list[Check]:
        """Numbers as multisets, then the solver's agreement, all rewrites in one call."""
        verdicts: list[Check] = []
        to_solve = []
        for i, (source, variant, _) in enumerate(pairs):
            old, new = (numbers_in(question_of(r["prompt"])) for r in (source, variant))
            if old != new:
                verdicts.append(("numbers_changed", f"{_shown(new)}, its source "
                                                    f"{_shown(old)}"))
            else:
                verdicts.append(None)
                to_solve.append(i)
        if not to_solve:
            return verdicts
        if "solver" not in self._models:
            self._models["solver"] = chat_model(self._cfg, "solver")
            self._models["solver"].check()
        cfg = self._cfg
        settings = {"samples": int(cfg["samples"]), "max_tokens": int(cfg["solve_max_tokens"]),
                    "temperature": float(cfg["solve_temperature"]),
                    "pass_threshold": float(cfg["pass_threshold"]), "seed": cfg["seed"]}
        rows = [pairs[i][1] for i in to_solve]
        grades = grade_rows(self._models["solver"], rows, "prompt", settings, self._rewards,
                            salt=seed_int("rephrase", cfg["seed"]))
        for i, grade in zip(to_solve, grades, strict=True):
            variant = pairs[i][1]
            if grade.error is not None:
                verdicts[i] = ("model_error", grade.error)
                continue
            variant["extra_info"]["agreement"] = round(grade.rate, 4)
            if grade.rate < float(cfg["agree"]):
                verdicts[i] = ("solver_disagrees", f"{grade.passed}/{grade.samples} answers "
                                                   f"gave the label, agree={cfg['agree']}")
        return verdicts

    def method_stats(self) -> dict[str, Any]:
        """Each model's usage (requests, tokens, seconds)."""
        return {role: m.usage.as_dict() for role, m in getattr(self, "_models", {}).items()}


def messages_for(question: str) -> list[dict[str, str]]:
    """The few-shot chat asking for one rewrite of `question`."""
    out = [{"role": "system", "content": SYSTEM}]
    for before, after in SHOTS:
        out += [{"role": "user", "content": ASK + before},
                {"role": "assistant", "content": after}]
    return [*out, {"role": "user", "content": ASK + question}]


def rewrite_of(text: str) -> str:
    """The rewrite a completion holds: its first line, without a label or quotes."""
    line = next((x.strip() for x in text.splitlines() if x.strip()), "")
    for label in _LABEL:
        if line.lower().startswith(label):
            line = line[len(label):].strip()
    return line.strip('"').strip()


def _shown(numbers: Any) -> str:
    return "[" + ", ".join(str(n) for n in sorted(numbers.elements())) + "]"
