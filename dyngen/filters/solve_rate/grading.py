"""Asking the policy for `samples` completions of each row's prompt, and grading each one.

All rows go to the model in one `complete` call (dyngen.llm: its concurrency, retries and
key handling); each request asks for n = samples completions, which a server that honours n
answers in one HTTP request, sharing the prompt's prefix (dyngen.llm.served probes it once
per endpoint). Each completion is scored by the row's reward function in verl's signature;
a score at or above `pass_threshold` is a pass.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dyngen.errors import FilterError
from dyngen.filters.solve_rate.rewards import RewardChooser, score_of
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
                 salt: Any = ()) -> list[ChatRequest]:
    """One request of `samples` completions per row, seeded by its prompt (reproducible)."""
    out = []
    for row in rows:
        messages = [{"role": str(m["role"]), "content": str(m["content"])}
                    for m in row[prompt_key]]
        out.append(ChatRequest(messages, n=int(settings["samples"]),
                               max_tokens=int(settings["max_tokens"]),
                               temperature=float(settings["temperature"]),
                               seed=seed_int(settings.get("seed", 0), salt,
                                             json.dumps(messages, sort_keys=True))))
    return out


def grade_rows(model: ChatModel, rows: Sequence[Mapping[str, Any]], prompt_key: str,
               settings: Mapping[str, Any], rewards: RewardChooser, salt: Any = ()
               ) -> list[Grade]:
    """Each row's grade; raises (ModelError) when more than half of the requests failed."""
    rewards.check(rows)  # a data source nothing grades is refused before any request
    results = model.complete(requests_for(rows, prompt_key, settings, salt))
    threshold = float(settings["pass_threshold"])
    return [_grade(row, result, rewards, threshold, int(settings["samples"]))
            for row, result in zip(rows, results, strict=True)]


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
