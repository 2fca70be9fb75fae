"""Asking the policy for completions of each row's prompt, and grading each one.

Each stage of the sampling plan (sequential.py: all `samples` at once, or `first`, then
`step` more for the rows still undecided) sends its rows to the model in one `complete`
call (dyngen.llm: its concurrency, retries and key handling); each request asks for the
stage's n completions, which a server that honours n answers in one HTTP request, sharing
the prompt's prefix (dyngen.llm.served probes it once per endpoint). Each completion is
scored by the row's reward function in verl's signature; a score at or above
`pass_threshold` is a pass. A row's grade sums its stages.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dyngen.errors import FilterError
from dyngen.filters.solve_rate.rewards import RewardChooser, score_of
from dyngen.filters.solve_rate.sequential import SamplingPlan
from dyngen.llm import ChatModel, ChatRequest, ChatResult, seed_int


@dataclass(frozen=True)
class Grade:
    """One row's measurement: `passed` of `samples` completions, or why none were graded."""

    passed: int
    samples: int
    error: str | None = None  # the request failed after its retries: model_error
    prompt_tokens: int = 0
    completion_tokens: int = 0
    answered_by: str = ""  # the model the server said answered

    @property
    def rate(self) -> float:
        """The pass rate, passed / samples."""
        return self.passed / self.samples


def band_verdict(grade: Grade, keep: Sequence[float]) -> tuple[str, str] | None:
    """None inside the band; else (too_easy | too_hard | model_error, the measured rate)."""
    if grade.error is not None:
        return ("model_error", grade.error)
    detail = f"{grade.passed}/{grade.samples} passed"
    if grade.rate > float(keep[1]):
        return ("too_easy", detail)
    if grade.rate < float(keep[0]):
        return ("too_hard", detail)
    return None


def requests_for(rows: Sequence[Mapping[str, Any]], prompt_key: str, settings: Mapping[str, Any],
                 salt: Any = (), n: int | None = None, stage: int = 0) -> list[ChatRequest]:
    """One request of n (default `samples`) completions per row, seeded by its prompt and
    the stage (reproducible; a later stage's samples are new ones)."""
    out = []
    for row in rows:
        messages = [{"role": str(m["role"]), "content": str(m["content"])}
                    for m in row[prompt_key]]
        seed_parts = (settings.get("seed", 0), salt, json.dumps(messages, sort_keys=True))
        out.append(ChatRequest(messages, n=int(settings["samples"] if n is None else n),
                               max_tokens=int(settings["max_tokens"]),
                               temperature=float(settings["temperature"]),
                               seed=seed_int(*seed_parts, *((stage,) if stage else ()))))
    return out


def grade_rows(model: ChatModel, rows: Sequence[Mapping[str, Any]], prompt_key: str,
               settings: Mapping[str, Any], rewards: RewardChooser, salt: Any = ()
               ) -> list[Grade]:
    """Each row's grade, summed over the stages it was asked in; raises (ModelError) when
    more than half of a stage's requests failed. A failed request ends its row's asking."""
    rewards.check(rows)  # a data source nothing grades is refused before any request
    plan = SamplingPlan.of(settings)
    threshold = float(settings["pass_threshold"])
    grades: list[Grade | None] = [None] * len(rows)
    asking = list(range(len(rows)))
    for stage, n in enumerate(plan.sizes):
        if not asking:
            break
        results = model.complete(requests_for([rows[i] for i in asking], prompt_key,
                                              settings, salt, n, stage))
        undecided = []
        for i, result in zip(asking, results, strict=True):
            grade = _grade(rows[i], result, rewards, threshold, n)
            before = grades[i]
            grades[i] = total = grade if before is None else _sum(before, grade)
            if total.error is None and not plan.decided(total.passed, total.samples):
                undecided.append(i)
        asking = undecided
    return [g for g in grades if g is not None]


def _sum(before: Grade, after: Grade) -> Grade:
    """One row's grade over two stages (the later one's error and answering model win)."""
    return Grade(before.passed + after.passed, before.samples + after.samples, after.error,
                 before.prompt_tokens + after.prompt_tokens,
                 before.completion_tokens + after.completion_tokens,
                 after.answered_by or before.answered_by)


def _grade(row: Mapping[str, Any], result: ChatResult, rewards: RewardChooser,
           threshold: float, samples: int) -> Grade:
    if not result.ok:
        return Grade(0, samples, result.error, result.prompt_tokens, result.completion_tokens)
    source = str(row.get("data_source"))
    choice = rewards.for_source(source, row)
    truth = (row.get("reward_model") or {}).get("ground_truth")
    info = row.get("extra_info")
    passed = 0
    for text in result.texts:
        try:
            value = choice.function(data_source=source, solution_str=text, ground_truth=truth,
                                    extra_info=dict(info) if isinstance(info, Mapping) else info)
        except Exception as exc:
            raise FilterError(
                f"reward function {choice.label} raised {type(exc).__name__}: {exc} on a row of "
                f"data_source {source!r}; fix the function (it must return a number or a dict "
                "with 'score' for any completion, however malformed)") from exc
        passed += score_of(value, choice.label) >= threshold
    return Grade(passed, len(result.texts), None, result.prompt_tokens,
                 result.completion_tokens, result.model)
