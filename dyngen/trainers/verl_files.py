"""Reading what verl's trainer writes, as verl 0.9.1 writes it (no verl import).

- The metrics file: `trainer.logger=[console,file]` with `VERL_FILE_LOGGER_PATH` (else
  `$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl`); `verl.utils.tracking.FileLogger`
  opens it with mode "wb" (a restarted trainer truncates it) and writes one line per
  `log` call, `{"step": N, "data": {metrics}}`. A training step's metrics hold
  `training/global_step`; the validation before training is logged alone, its keys all
  `val-*`, at step 0 (or at the resumed step).
- The rollout dump: `trainer.rollout_data_dir=DIR`; `_write_generations` writes
  `DIR/<step>.jsonl` from a background thread, one line per sample
  `{"input", "output", "gts", "score", "step", ...}`, where `input` is the prompt as the
  tokenizer decodes it (chat template applied, special tokens skipped).
- The checkpoint: `trainer.default_local_dir/latest_checkpointed_iteration.txt` names the
  step N of the newest `global_step_N/`, whose `data.pt` is the training dataloader's
  `state_dict()` (torchdata's StatefulDataLoader: the dataset's own `state_dict()` inside,
  in the main process's part or in each worker's); `trainer.resume_mode` is auto (the
  newest), disable, or resume_path (`trainer.resume_from_path`, a `global_step_N` folder).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

VALIDATION_PREFIX = "val-"


@dataclass
class MetricsTail:
    """Complete lines appended to a growing JSONL file, surviving truncation and rewrites."""

    path: Path
    offset: int = 0
    last_line: bytes = b""  # the line before `offset`: if it changed, the file was rewritten
    restarts: int = 0

    def read(self) -> list[dict[str, Any]]:
        """The records of the complete lines written since the last call."""
        try:
            with open(self.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if self._rewritten(fh, size):
                    logger.warning("dyngen follow: %s was truncated or rewritten (a trainer "
                                   "restart); reading it again from the start", self.path)
                    self.offset, self.last_line = 0, b""
                    self.restarts += 1
                fh.seek(self.offset)
                chunk = fh.read(size - self.offset)
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []  # a partial last line: wait for its newline
        lines = chunk[: end + 1].splitlines(keepends=True)
        self.offset += end + 1
        self.last_line = lines[-1]
        return [rec for rec in map(self._parse, lines) if rec is not None]

    def _rewritten(self, fh: Any, size: int) -> bool:
        if self.offset == 0:
            return False
        if size < self.offset:
            return True
        fh.seek(self.offset - len(self.last_line))
        return fh.read(len(self.last_line)) != self.last_line

    def _parse(self, line: bytes) -> dict[str, Any] | None:
        if not line.strip():
            return None
        try:
            value = json.loads(line)
        except ValueError as exc:
            logger.warning("dyngen follow: %s: a line that is not JSON is skipped (%s): %r",
                           self.path, exc, line[:120])
            return None
        if not isinstance(value, dict):
            logger.warning("dyngen follow: %s: expected {\"step\": N, \"data\": {...}}, found "
                           "%r; skipped", self.path, line[:120])
            return None
        return value


@dataclass(frozen=True)
class StepMetrics:
    """One training step's line of the metrics file."""

    step: int
    metrics: dict[str, Any]


def training_step(record: dict[str, Any]) -> StepMetrics | None:
    """The step and metrics of a training step's line; None for validation-only lines."""
    step, data = record.get("step"), record.get("data")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0 \
            or not isinstance(data, dict):
        logger.warning("dyngen follow: expected {\"step\": N, \"data\": {metrics}}, found %s; "
                       "skipped", json.dumps(record)[:160])
        return None
    if not any(not str(key).startswith(VALIDATION_PREFIX) for key in data):
        return None  # verl's validation before training (or at resume): no batch ended
    return StepMetrics(step, data)


def dump_path(rollout_dir: Path, step: int) -> Path:
    """Where verl writes a step's rollouts: `<rollout_data_dir>/<step>.jsonl`."""
    return rollout_dir / f"{step}.jsonl"


def read_complete_dump(path: Path, settle_seconds: float) -> list[dict[str, Any]] | None:
    """verl's rollout lines once the file is whole, else None (not there, or still growing).

    verl writes it line by line from a thread, after or before the step's metrics line:
    whole means it ends with a newline, every line parses, and it has not been written to
    for `settle_seconds`.
    """
    try:
        if time.time() - path.stat().st_mtime < settle_seconds:
            return None
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if not data.endswith(b"\n"):
        return None
    rows = []
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            return None
        if isinstance(row, dict):
            rows.append(row)
    return rows


CHECKPOINT_TRACKER = "latest_checkpointed_iteration.txt"
STEP_FOLDER = "global_step_"


def resume_folder(trainer: Any) -> Path | None:
    """The `global_step_N` folder verl's trainer resumes from, as its `_load_checkpoint`
    finds it from the `trainer` config section; None for a run from scratch."""
    mode = trainer.get("resume_mode", "auto") if trainer is not None else "disable"
    if mode == "disable" or trainer.get("default_hdfs_dir") is not None:
        return None
    if mode == "resume_path":
        given = trainer.get("resume_from_path")
        return Path(os.path.abspath(given)) if isinstance(given, str) and STEP_FOLDER in given \
            else None
    root = trainer.get("default_local_dir")
    if not isinstance(root, str):
        return None
    tracker = Path(os.path.abspath(root)) / CHECKPOINT_TRACKER
    try:
        step = int(tracker.read_text().strip())
    except (OSError, ValueError):
        return None
    folder = tracker.parent / f"{STEP_FOLDER}{step}"
    return folder if folder.is_dir() else None


def resumed_state(trainer: Any, marker: str, name: Any) -> tuple[int, dict[str, Any]] | None:
    """(step, state) of the checkpoint verl resumes from, where a dataset's state holds
    `marker: name`; None for a run from scratch or a checkpoint without it."""
    folder = resume_folder(trainer)
    if folder is None:
        return None
    states = [s for s in dataset_states(folder, marker) if s.get(marker) == name]
    return (int(str(folder).rsplit(STEP_FOLDER, 1)[-1]), states[0]) if states else None


def dataset_states(folder: Path, marker: str) -> list[dict[str, Any]]:
    """The states of a dataset that `state_dict()` returned into the folder's `data.pt`: each
    a dict holding key `marker`, wherever the dataloader nested it (one per worker)."""
    path = folder / "data.pt"
    if not path.is_file():
        return []
    import torch  # only a verl trainer's process reads its checkpoint

    found: list[dict[str, Any]] = []
    pending: list[Any] = [torch.load(path, weights_only=False, map_location="cpu")]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            if marker in item:
                found.append(item)
            else:
                pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return found


def batch_metrics(batch: Any) -> dict[str, float]:
    """The round's trigger metrics from a verl `DataProto`; empty if it has no scores.

    `score/mean|max|min`: each sequence's summed `token_level_scores` (verl's
    `critic/score/*`, before KL), or else the `score` non-tensor field (the reward
    function's extra info); `acc/mean`: the `acc` non-tensor field, if present.
    """
    import numpy as np

    tensors = getattr(batch, "batch", None)
    extra = getattr(batch, "non_tensor_batch", None) or {}
    scores = None
    # A TensorDict refuses `key in td`; its keys() view answers.
    if tensors is not None and "token_level_scores" in tensors.keys():  # noqa: SIM118
        scores = tensors["token_level_scores"].sum(-1).float().cpu().numpy()
    elif "score" in extra:
        scores = np.asarray(extra["score"], dtype=np.float64)
    metrics: dict[str, float] = {}
    if scores is not None and scores.size:
        metrics.update({"score/mean": float(scores.mean()), "score/max": float(scores.max()),
                        "score/min": float(scores.min())})
    if "acc" in extra and len(extra["acc"]):
        metrics["acc/mean"] = float(np.asarray(extra["acc"], dtype=np.float64).mean())
    return metrics


def global_step(batch: Any) -> int | None:
    """verl's step of a batch (`meta_info["global_steps"]`), if it has one."""
    meta = getattr(batch, "meta_info", None) or {}
    step = meta.get("global_steps")
    return step if isinstance(step, int) and not isinstance(step, bool) else None
