"""The closed loop's rounds (closed_loop.py): the dyngen arms' round config, a local Prefect
server with a `dyngen serve` per arm running their rounds, and the versions they commit."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TASKS = Path(__file__).with_name("closed_loop_tasks.py")
DATASETS = {"dyngen": "closed-loop", "frontier": "closed-loop-frontier"}


def round_config(root: Path, out: Path, sizes: Any) -> dict[str, Any]:
    """The dyngen arm's rounds: the family's candidates, the band against `out`'s newest
    checkpoint, sampled as the trainer samples."""
    return {
        "store": {"root": str(root / "store")},
        "data": {"datagen": {"path": str(TASKS), "name": "ClosedLoopCandidates",
                             "candidates": sizes.candidates, "seed": sizes.seed,
                             "eval_size": sizes.eval_size}},
        "round": {"retries": 1, "solve_rate": {
            "enabled": True, "model_path": str(out), "samples": sizes.generations,
            "keep": list(sizes.band), "temperature": 1.0, "max_tokens": sizes.max_tokens,
            "seed": sizes.seed}}}


def wait_for_versions(store: Any, name: str, timeout: float = 900.0) -> None:
    """Until no batch end the trainer wrote into `name`'s inbox is pending (or `timeout`
    seconds): each covered by a committed version, its own round's or another's that
    covered it first (its own round then commits nothing: no version carries its event)."""
    deadline = time.monotonic() + timeout
    while store.pending(name):
        if time.monotonic() > deadline:
            print(f"warning: batch ends still pending after {timeout:.0f} s", flush=True)
            return
        time.sleep(0.5)


def versions_of(store: Any, name: str) -> list[dict[str, Any]]:
    """Each round's version: trigger step, policy step, band counts, the trainer's report."""
    from dyngen.report.history import round_point

    out = []
    for rec in store.history(name):
        point = round_point(rec)
        stage = (rec.lineage or {}).get("solve_rate") or {}
        if point is None:
            continue
        out.append({"version": rec.version, "step": point.step,
                    "policy_step": stage.get("policy_step"), "graded": stage.get("graded"),
                    "kept": stage.get("kept"), "histogram": stage.get("histogram"),
                    "completion_tokens": stage.get("completion_tokens"),
                    "samples_spent": stage.get("samples_spent"),
                    "seconds": stage.get("seconds"), "effective": point.effective_share,
                    "metrics": point.metrics, "rows": rec.rows})
    return out


def served_rounds(root: Path, sizes: Any, arms: list[str]) -> Any:
    """A local Prefect server and a `dyngen serve` per dyngen arm, running its rounds."""
    from omegaconf import OmegaConf

    from dyngen.server.local import LocalServer, spawn, stop, wait_for_automation
    from dyngen.trainers.events import trigger_name

    server = LocalServer(root / "prefect").start()
    os.environ.update(server.env())
    os.environ["DYNGEN_OUTBOX"] = str(root / "outbox")
    serves = []
    for arm in [a for a in arms if a in DATASETS]:
        config = root / f"rounds-{arm}.yaml"
        OmegaConf.save(OmegaConf.create(round_config(root, root / arm, sizes)), config)
        serves.append(spawn([sys.executable, "-m", "dyngen.cli", "--root", str(root / "store"),
                             "--config", str(config), "serve", "--dataset", DATASETS[arm]],
                            server.env(), root / f"serve-{arm}.log", cwd=REPO))
        wait_for_automation(server.api_url, trigger_name(DATASETS[arm]))

    def close() -> None:
        for serve in serves:
            stop(serve)
        server.stop()

    return close
