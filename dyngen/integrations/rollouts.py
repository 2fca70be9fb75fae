"""Rollouts files for rounds: one JSONL file per training step, where rounds may read it.

A record is `{"prompt": messages or text, "score": number, "ground_truth": str | None}`,
the format the proposer's hard-seed selection reads (generators/proposer/seeds.py). Files
go under `<store root>/rollouts/<dataset>/<run>/`, the folder a round accepts rollouts
from by default, and are written whole (temp file, then rename): a round never reads half
of one.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dyngen.store.names import validate_name

ROLLOUTS_DIR = "rollouts"


def rollouts_dir(store_root: str | os.PathLike[str], dataset: str, run: str) -> Path:
    """`<store root>/rollouts/<dataset>/<run>`: where a run's rollouts files go."""
    return Path(store_root) / ROLLOUTS_DIR / validate_name(dataset) / safe_run_name(run)


def safe_run_name(run: str) -> str:
    """A run id as one safe path component (other characters become '-')."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", run).strip(".-")[:100]
    return cleaned or "run"


def question_of(prompt: Any) -> str:
    """The task text of a prompt: a plain string, or its last user message."""
    if isinstance(prompt, str):
        return prompt.strip()
    users = [m.get("content") or "" for m in prompt or () if isinstance(m, dict)
             and m.get("role") == "user"]
    return str(users[-1]).strip() if users else ""


def rollout_record(prompt: Any, score: Any, ground_truth: Any = None) -> dict[str, Any] | None:
    """One rollouts line, or None when the score is not a finite number."""
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        return None
    truth = None if ground_truth is None else str(ground_truth)
    return {"prompt": prompt, "score": float(score), "ground_truth": truth}


def write_rollouts(path: Path, records: Iterable[Mapping[str, Any]]) -> Path:
    """Write a rollouts JSONL file whole (temp file, fsync, rename); return its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path
