"""The reward for code tasks, for verl and for TRL: the model's final answer against the label.

The answer is what follows the completion's last `Answer:` to the end of its line (else
its last `\\boxed{...}`), read as a Python literal. A deduction answer scores 1.0 when it
is the label by value (`[1, 2]` is `[1,2]`, a dict in any order; `True` is not `1`, a list
not a tuple); an abduction answer scores 1.0 when it is the task's own input or when the
program, run on it in the sandbox, returns the label. Anything else, unreadable answers
included, scores 0.0.

verl (0.9.1): reward.custom_reward_function.path=pkg://dyngen.generators.code_tasks.reward
              reward.custom_reward_function.name=compute_score
TRL:          GRPOTrainer(reward_funcs=[code_task_reward], ...) on rows in verl's schema
              (their reward_model and extra_info columns arrive as keyword arguments).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dyngen.errors import ConfigError
from dyngen.generators.code_tasks.tasks import ABDUCTION, literal
from dyngen.text import completion_text

# Linear-time patterns: a completion may be long and built to make a regex backtrack (a
# lazy group before `[ \t]*$`, or a greedy one before `\}`, is quadratic on it).
_ANSWER = re.compile(r"\banswer[ \t*_]*:[ \t*_]*(?P<a>[^\n]*)", re.I)
_BOXED = "\\boxed{"


def _last_boxed(text: str) -> str | None:
    """What the last line holding a boxed answer boxes: from its first `boxed{` to its last
    `}`, as a greedy regex within one line would take it; or None."""
    for line in reversed(text.split("\n")):
        start, end = line.find(_BOXED), line.rfind("}")
        if start >= 0 and start + len(_BOXED) <= end:
            return line[start + len(_BOXED):end]
    return None


def final_answer(text: str) -> str | None:
    """The text of the completion's final answer, or None if it gives none."""
    found = None
    for found in _ANSWER.finditer(text):  # noqa: B007 - the last one is the answer
        pass
    if found is not None:
        answer = found["a"]
    else:
        boxed = _last_boxed(text)
        if boxed is None:
            return None
        answer = boxed
    answer = answer.strip()
    if answer.endswith(".") and not literal(answer)[0]:  # a sentence's full stop
        answer = answer[:-1]
    return answer.strip().strip("`").strip()


def score(solution: str, ground_truth: str, extra_info: Mapping[str, Any] | None = None,
          sandbox: str = "bwrap", timeout_seconds: float = 5.0) -> float:
    """1.0 if the completion's final answer solves the task, else 0.0: a hostile answer (a
    parser bomb, 1e999, a huge int) scores 0.0 and never raises inside a training step."""
    from dyngen.sandbox import SandboxInputError, run_python, same_value

    answer = final_answer(solution if isinstance(solution, str) else "")
    if answer is None:
        return 0.0
    readable, value = literal(answer)
    if not readable:
        return 0.0
    info = dict(extra_info or {})
    if info.get("task") != ABDUCTION:
        return 1.0 if same_value(answer, str(ground_truth)) else 0.0
    if info.get("input") is not None and same_value(answer, str(info["input"])):
        return 1.0
    if not info.get("program") or not info.get("function"):
        raise ConfigError("an abduction task's extra_info must hold its program and function "
                          f"to check an answer by running it; found keys {sorted(info)}.")
    try:
        result = run_python(str(info["program"]), str(info["function"]), value,
                            isolation=sandbox, timeout_seconds=timeout_seconds)
    except SandboxInputError:  # an answer that cannot cross (too long, not data)
        return 0.0
    return 1.0 if result.ok and same_value(result.value or "", str(ground_truth)) else 0.0


def compute_score(data_source: str, solution_str: str, ground_truth: str,
                  extra_info: Mapping[str, Any] | None = None, **kwargs: Any) -> float:
    """verl's custom reward function: called with keywords by verl's reward managers.

    `reward.custom_reward_function.reward_kwargs` may set `sandbox` (bwrap / unisolated)
    and `timeout_seconds` for abduction answers.
    """
    return score(solution_str, ground_truth, extra_info,
                 sandbox=str(kwargs.get("sandbox", "bwrap")),
                 timeout_seconds=float(kwargs.get("timeout_seconds", 5.0)))


def code_task_reward(prompts: Sequence[Any], completions: Sequence[Any],
                     reward_model: Sequence[Mapping[str, Any]] | None = None,
                     extra_info: Sequence[Mapping[str, Any] | None] | None = None,
                     ground_truth: Sequence[str] | None = None, *, sandbox: str = "bwrap",
                     timeout_seconds: float = 5.0, sandbox_workers: int = 2,
                     **kwargs: Any) -> list[float]:
    """TRL's reward function: one score per completion, from the rows' own columns.

    The label is each row's `reward_model["ground_truth"]` (verl's schema) or its
    `ground_truth` column. `sandbox` and `timeout_seconds` apply to abduction answers (wrap
    the function to change them: TRL names a reward by its function's __name__);
    `sandbox_workers` completions are scored at once, each on a warm sandbox of its own.
    """
    if ground_truth is None and reward_model is None:
        given = sorted([*kwargs, *(["extra_info"] if extra_info is not None else [])])
        raise ConfigError(
            "code_task_reward: expected the dataset's reward_model column (verl's schema) or a "
            f"ground_truth column among the keyword arguments; found {given}. Train "
            "on rows CodeTaskProposer wrote, or add a ground_truth column.")
    truths = list(ground_truth) if ground_truth is not None else [
        str((r or {}).get("ground_truth", "")) for r in reward_model or []]
    infos = list(extra_info) if extra_info is not None else [None] * len(completions)
    rows = list(zip(completions, truths, infos, strict=True))

    def one(row: tuple[Any, str, Any]) -> float:
        return score(completion_text(row[0]), row[1], row[2], sandbox=sandbox,
                     timeout_seconds=timeout_seconds)

    if sandbox_workers <= 1 or len(rows) <= 1:
        return [one(row) for row in rows]
    with ThreadPoolExecutor(min(sandbox_workers, len(rows))) as pool:
        return list(pool.map(one, rows))
