"""prime-rl's run files, written as its orchestrator writes them (prime-rl is GPU-only).

Read from prime-rl's source (github PrimeIntellect-ai/prime-rl, main of 2026-08-21):
`prime_rl/monitors/file.py` `FileMonitor` appends each metrics dict as
`json.dumps({"step": step, "time": time.time(), **metrics})` to `<output_dir>/metrics.jsonl`
(opened "a", line-buffered) and each cohort of episodes as
`orjson.dumps(episode.to_record(), default=str, option=OPT_APPEND_NEWLINE |
OPT_SERIALIZE_NUMPY)` to `<output_dir>/rollouts/step_<N>/<kind>/<subset>/traces.jsonl`;
`prime_rl/orchestrator/orchestrator.py` logs a step's effective episodes, then its metrics
(`progress/*`, `time/step`, `train/agg/...`, `step`), and an evaluation's metrics
(`eval/<env>/...`, `step`) on lines of their own. The episodes are real `vf.Episode`s.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import orjson
import verifiers.v1 as vf
from verifiers.v1.trace import AgentInfo, TraceTask

from dyngen.trainers.verifiers import DyngenTask, DyngenTaskData


def episode(data: DyngenTaskData, score: float, step: int, ok: bool = True) -> vf.Episode:
    """One training episode of one trace over a dyngen task, scored `score`."""
    task = TraceTask(type=DyngenTask.__name__, data=data)
    trace = vf.Trace(task=task, agent=AgentInfo(config=vf.AgentConfig()), ok=ok,
                     is_completed=True)
    trace.record_reward("dyngen_reward", score)
    return vf.Episode(task=task, ok=ok, traces=[trace], run=vf.TrainRunInfo(
        id="run", work=vf.TrainWorkInfo(step=step)))


class PrimeRLRun:
    """An orchestrator's output_dir, written step by step as prime-rl writes it."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = output_dir
        output_dir.mkdir(parents=True, exist_ok=True)
        self.metrics = output_dir / "metrics.jsonl"

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        with open(self.metrics, "a", buffering=1) as fh:  # FileMonitor.log_metrics
            fh.write(json.dumps({"step": step, "time": time.time(), **metrics}) + "\n")

    def log_episodes(self, episodes: list[vf.Episode], step: int, kind: str = "train",
                     subset: str = "effective") -> None:
        path = self.output_dir / "rollouts" / f"step_{step}" / kind / subset / "traces.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        opts = orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY
        with open(path, "ab") as f:  # FileMonitor.log_episodes
            for ep in episodes:
                f.write(orjson.dumps(ep.to_record(), default=str, option=opts))

    def train_step(self, step: int, episodes: list[vf.Episode]) -> None:
        """A shipped batch: its effective episodes, then its metrics line."""
        self.log_episodes(episodes, step)
        rewards = [t.reward for ep in episodes for t in ep.traces]
        self.log_metrics({"train/agg/reward/mean": sum(rewards) / len(rewards),
                          "progress/rollouts": len(rewards), "time/step": 1.5,
                          "step": step}, step)

    def eval_step(self, step: int) -> None:
        self.log_metrics({"eval/sums/reward/mean": 0.5, "step": float(step)}, step)
