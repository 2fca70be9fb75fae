"""Seeds: the `hard_k` hardest tasks the model writes variations of, chosen deterministically.

  - from the trigger's rollouts file (`context.trigger.rollouts`, JSONL of {"prompt":
    messages or str, "score": float, "ground_truth"?}): rollouts of one prompt are
    averaged, lowest mean first, ties to the earlier line; `seed_index` = its first line;
  - else from the newest `seed_window` rows of the dataset: lowest `extra_info.score`
    first, then unscored rows, newest first; `seed_index` = the row's position.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from dyngen.errors import ConfigError
from dyngen.integrations.rollouts import question_of
from generators.proposer.checking import normalise


@dataclass(frozen=True)
class Seed:
    """One hard task the model writes variations of."""

    index: int
    question: str
    score: float | None
    truth: str | None = None  # the seed's ground truth, when known
    system: tuple[dict[str, str], ...] = ()  # the seed's system messages, kept for new rows


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value).strip()


def _system_of(prompt: Any) -> tuple[dict[str, str], ...]:
    if isinstance(prompt, str):
        return ()
    return tuple({"role": "system", "content": str(m["content"])} for m in prompt or ()
                 if isinstance(m, dict) and m.get("role") == "system" and m.get("content"))


def seeds_from_rollouts(path: str | Path, k: int) -> list[Seed]:
    """The `k` prompts with the lowest mean score in a rollouts JSONL file."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"trigger.rollouts: cannot read {path} ({exc.strerror or exc}); the "
                          "round reads it where it runs, so write it where the round's "
                          "process can see it.") from exc
    groups: dict[str, dict[str, Any]] = {}
    for line_no, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            score = float(rec["score"])
            if not math.isfinite(score):
                raise ValueError(f"score {score} is not finite")
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"rollouts file {path}, line {line_no + 1}: expected JSON "
                              f'{{"prompt": ..., "score": number}}, found {line[:80]!r} '
                              f"({exc}).") from exc
        question = question_of(rec.get("prompt"))
        if question:
            g = groups.setdefault(normalise(question), {
                "line": line_no, "q": question, "prompt": rec["prompt"], "s": [],
                "truth": rec.get("ground_truth")})
            g["s"].append(score)
    ranked = sorted(groups.values(), key=lambda g: (sum(g["s"]) / len(g["s"]), g["line"]))
    return [Seed(g["line"], g["q"], sum(g["s"]) / len(g["s"]), _text_or_none(g["truth"]),
                 _system_of(g["prompt"])) for g in ranked[:k]]


def seeds_from_dataset(rows: datasets.Dataset, k: int, window: int,
                       prompt_key: str = "prompt") -> list[Seed]:
    """Among the newest `window` rows: lowest extra_info.score first, then newest first."""
    start = max(0, len(rows) - window)
    recent = rows.select(range(start, len(rows)))
    extras = recent["extra_info"] if "extra_info" in recent.column_names else [None] * len(recent)
    order = []
    for i, extra in enumerate(extras):
        score = (extra or {}).get("score") if isinstance(extra, dict) else None
        score = float(score) if isinstance(score, (int, float)) else None
        order.append((score is None, score or 0.0, -i, i, score))
    out = []
    for *_, i, score in sorted(order):
        row = recent[i]
        question = question_of(row[prompt_key])
        if question:
            truth = _text_or_none((row.get("reward_model") or {}).get("ground_truth"))
            out.append(Seed(start + i, question, score, truth, _system_of(row[prompt_key])))
        if len(out) == k:
            break
    return out
