"""The rollouts format: what one rollout of a trainer's batch is, and how it is checked.

JSONL, one rollout per line: {"prompt": str or [{role, content}, ...], "score": number,
"ground_truth"?: any, ...other fields kept}. A round reads it from a trigger's file or a
batch end in the store's inbox (dyngen.round.rollouts: where it may come from, how large
it may be); the frontier sampler weighs a pending batch end's rollouts by the same rule
(dyngen.difficulty.pending). Errors name the line and the field, never their text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dyngen.errors import RolloutsError

FORMAT = '{"prompt": text or [{"role", "content"}, ...], "score": number}'


@dataclass(frozen=True)
class Rollout:
    """One line of a rollouts file: the prompt, its score, and the whole record."""

    line: int  # 1-based line number in the file
    prompt: str | list[dict[str, str]]
    score: float
    ground_truth: Any = None
    record: Mapping[str, Any] = field(default_factory=dict)


def parse_rollouts(data: bytes, where: str = "rollouts file") -> list[Rollout]:
    """Rollouts from JSONL bytes; an error names the line and field, never their text."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise RolloutsError(f"{where}, line {line}: expected UTF-8 text, found bytes that are "
                            "not UTF-8.") from None
    out = []
    # Split on newlines only: JSON strings may hold other line separators (U+2028).
    for number, line in enumerate(text.split("\n"), 1):
        if line.strip():
            at = f"{where}, line {number}"
            out.append(rollout_of(_json(line, at), number, at))
    return out


def rollout_of(record: Any, number: int, at: str) -> Rollout:
    """The rollout a decoded record is (its line `number`); RolloutsError, naming `at` and
    the field, if it is not one."""
    if not isinstance(record, dict):
        raise RolloutsError(f"{at}: expected a JSON object {FORMAT}, found {_kind(record)}.")
    for key in ("prompt", "score"):
        if key not in record:
            raise RolloutsError(f"{at}: field {key!r} is missing; expected {FORMAT}.")
    prompt, score = record["prompt"], record["score"]
    if not _is_prompt(prompt):
        found = ("a list with an item that is not {role, content} text"
                 if isinstance(prompt, list) and prompt else _kind(prompt))
        raise RolloutsError(f"{at}: field 'prompt' must be non-empty text or a list of "
                            f"{{role, content}} messages of text, found {found}.")
    if isinstance(score, bool) or not isinstance(score, (int, float)) \
            or not math.isfinite(score):
        found = "a number that is not finite" if isinstance(score, float) else _kind(score)
        raise RolloutsError(f"{at}: field 'score' must be a finite number, found {found}.")
    return Rollout(number, prompt, float(score), record.get("ground_truth"), record)


def _json(line: str, at: str) -> Any:
    try:
        return json.loads(line)
    except RecursionError:
        raise RolloutsError(f"{at}: expected a JSON object {FORMAT}, found JSON nested too "
                            "deeply.") from None
    except ValueError:
        raise RolloutsError(f"{at}: expected a JSON object {FORMAT}, found text that is not "
                            "JSON.") from None


def _is_prompt(value: Any) -> bool:
    if isinstance(value, str):
        return bool(value.strip())
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str)
        and isinstance(m.get("content"), str) for m in value)


def _kind(value: Any) -> str:
    """What a JSON value is, in words: its type, never its content."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "an empty string" if not value.strip() else "a string"
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    return "a JSON object"
