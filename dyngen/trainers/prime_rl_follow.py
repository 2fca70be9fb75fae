"""`dyngen follow --prime-rl-metrics`: a prime-rl run triggers rounds with no code change.

What prime-rl's orchestrator writes, read from its source (prime_rl/monitors/file.py
`FileMonitor`, prime_rl/orchestrator/orchestrator.py; the file monitor is on by default):

- `<output_dir>/metrics.jsonl`, opened for append (a restarted run adds to it), one line
  per `log` call: `{"step": N, "time": t, **metrics}`. A training step's line carries
  `progress/*`, `time/step` and `train/<env>/...` metrics; an evaluation's carries only
  `eval/<env>/...` (and `step`).
- `<output_dir>/rollouts/step_<N>/train/effective/traces.jsonl`: the step's trained-on
  episodes, one `vf.Episode.to_record()` per line, written (awaited) before the step's
  metrics line; `.../all/...` streams every arrival as it lands.

`PrimeRLFollower` is the verl follower (`dyngen.trainers.verl_follow`) with prime-rl's
lines and episodes: one batch end per training step, its metrics, its effective episodes
as dyngen rollouts (each trace's prompt, weighted reward and the task's `answer`, mapped
to the dataset's row by the task's own fields), nothing emitted twice across restarts of
the follower or of prime-rl. The training run's id (`--run`) defaults to the output_dir's
name (prime-rl's run) and path. It reads JSON only: it needs neither prime-rl nor verifiers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dyngen.trainers.rollouts import rollout_record, write_rollouts
from dyngen.trainers.verl_files import StepMetrics
from dyngen.trainers.verl_follow import VerlFollower

logger = logging.getLogger(__name__)

TRAIN_PREFIXES = ("progress/", "train/")  # keys only a training step's line carries


def episodes_path(output_dir: Path, step: int) -> Path:
    """Where prime-rl writes a training step's effective episodes."""
    return output_dir / "rollouts" / f"step_{step}" / "train" / "effective" / "traces.jsonl"


def training_step(record: dict[str, Any]) -> StepMetrics | None:
    """A training step's metrics line (its metrics without `step` and `time`), else None."""
    step = record.get("step")
    if isinstance(step, float) and step.is_integer():
        step = int(step)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        logger.warning("dyngen follow: expected {\"step\": N, ...metrics}, found %s; skipped",
                       json.dumps(record)[:160])
        return None
    if not any(str(k).startswith(TRAIN_PREFIXES) for k in record):
        return None  # an evaluation's line, or the trainer's own: no batch ended here
    return StepMetrics(step, {k: v for k, v in record.items() if k not in ("step", "time")})


def trace_rollouts(episode: dict[str, Any]) -> list[tuple[Any, Any, Any]]:
    """(prompt, weighted reward, ground truth) of each clean trace of an episode record."""
    out = []
    for trace in episode.get("traces") or ():
        if not isinstance(trace, dict) or trace.get("ok") is False:
            continue
        data = ((trace.get("task") or episode.get("task") or {}).get("data")) or {}
        rewards = trace.get("rewards") or {}
        parts = [float(r.get("score", math.nan)) * float(r.get("weight", 1.0))
                 for r in rewards.values() if isinstance(r, dict)]
        score = sum(parts) if parts else None
        out.append((data.get("prompt"), score, data.get("answer")))
    return out


@dataclass
class PrimeRLFollower(VerlFollower):
    """Tails a prime-rl orchestrator's metrics.jsonl and emits a batch end per step.

    `rollout_dir` is the orchestrator's output_dir (default: the metrics file's folder);
    None there emits batch ends without rollouts only when `with_rollouts` is False.
    """

    with_rollouts: bool = True

    def __post_init__(self) -> None:
        if self.rollout_dir is None and self.with_rollouts:
            self.rollout_dir = Path(self.metrics_path).parent
        super().__post_init__()

    def _default_run_id(self) -> str:
        """The output_dir's name (the run's), with a hash of its path."""
        folder = Path(self.metrics_path).resolve().parent
        digest = hashlib.sha256(str(folder).encode()).hexdigest()[:10]
        return f"{self.dataset}-{folder.name}-{digest}"

    def _training_step(self, record: dict[str, Any]) -> StepMetrics | None:
        return training_step(record)

    def _rollouts_for(self, step: int, since: float
                      ) -> tuple[str | None, list[dict[str, Any]]] | Literal[False]:
        """The step's effective episodes as a rollouts file; written before its metrics
        line, so a missing file means the step trained on none (or the monitor is off).

        No samples for the reward spread: prime-rl's buffer may drop a group whose rewards
        are all equal before it lands in `effective/`, and a spread computed from what is
        left would overstate the share of prompts the step could learn from."""
        if self.rollout_dir is None:
            return None, []
        source = episodes_path(self.rollout_dir, step)
        try:
            lines = source.read_bytes().splitlines()
        except FileNotFoundError:
            logger.warning("dyngen follow: step %d has no episodes file %s; its batch end is "
                           "emitted without rollouts", step, source)
            return None, []
        assert self._prompts is not None
        self._prompts.refresh()
        records, skipped = [], 0
        for line in lines:
            try:
                episode = json.loads(line)
            except ValueError:
                skipped += 1
                continue
            for prompt, score, truth in trace_rollouts(episode):
                if truth is None and prompt is not None:
                    truth = self._prompts.truth_of(prompt)
                record = rollout_record(prompt, score, truth)
                if record is None:
                    skipped += 1
                else:
                    records.append(record)
        if skipped:
            logger.warning("dyngen follow: %s: %d episode line(s) or trace(s) without a "
                           "finite reward skipped", source, skipped)
        return str(write_rollouts(self.folder / f"step-{step:08d}.jsonl", records)), []
