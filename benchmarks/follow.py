"""`dyngen follow`: its cost per verl step, and emit → committed latency through it,
against a direct `emit_batch_end`, measured in the same run.

1. Overhead: one step's work in the follower (read the metrics line, convert the step's
   rollout dump of `--samples` lines, emit) against the direct emit alone, in-process,
   against a local Prefect server; the difference is what following costs per step.
2. Latency: the round served by `dyngen serve` (any dataset); steps alternate between a
   direct emit on dataset "direct" and a verl-format step (metrics line + rollout dump)
   written for `dyngen follow` on dataset "followed" (default poll, 1 s), each timed from
   the write (or the emit) to its version being committed.

    python benchmarks/follow.py [--events 8] [--samples 256]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dyngen.generators.arithmetic import arithmetic_task  # noqa: E402
from dyngen.server.local import LocalServer, spawn, stop, wait_for_automation  # noqa: E402
from dyngen.store import Store  # noqa: E402
from dyngen.trainers.events import emit_batch_end, trigger_name  # noqa: E402
from dyngen.trainers.rollouts import event_id_for  # noqa: E402
from dyngen.trainers.verl_follow import VerlFollower  # noqa: E402

ROUND = ["data.datagen.path=pkg://dyngen.generators.arithmetic",
         "data.datagen.name=ArithmeticCurriculum"]


def write_step(metrics: Path, dumps: Path, step: int, rows: list[dict], samples: int) -> None:
    """One verl V1 step: its rollout dump (`<step>.jsonl`), then its metrics line."""
    dumps.mkdir(parents=True, exist_ok=True)
    with open(dumps / f"{step}.jsonl", "w") as fh:
        for i in range(samples):
            row = rows[i % len(rows)]
            text = f"user\n{row['prompt'][-1]['content']}\nassistant\n"
            fh.write(json.dumps({"input": text, "output": "42", "gts": "42",
                                 "score": float(i % 2), "step": step}) + "\n")
    with open(metrics, "ab") as fh:
        data = {"training/global_step": step, "critic/score/mean": 0.5,
                **{f"timing_s/t{i}": 0.1 for i in range(60)}}
        fh.write(json.dumps({"step": step, "data": data}).encode() + b"\n")


def committed(store: Store, name: str, key: str) -> None:
    while store.find_idempotency_key(name, key) is None:
        time.sleep(0.05)


def overhead(store: Store, rows: list[dict], root: Path, api_url: str, steps: int,
             samples: int) -> tuple[list[float], list[float]]:
    """Seconds per step: the follower's poll for one step, and a direct emit alone."""
    metrics, dumps = root / "overhead" / "metrics.jsonl", root / "overhead" / "dumps"
    metrics.parent.mkdir(parents=True)
    follower = VerlFollower(store.root, "overhead", metrics, rollout_dir=dumps,
                            run_id="overhead", settle_seconds=0.0, api_url=api_url)
    followed, direct = [], []
    for step in range(1, steps + 1):
        write_step(metrics, dumps, step, rows, samples)
        t0 = time.perf_counter()
        assert follower.poll() == 1
        followed.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        assert emit_batch_end("overhead", 10_000 + step, {"score": 0.5}, api_url=api_url)
        direct.append(time.perf_counter() - t0)
    return followed, direct


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=8)
    ap.add_argument("--samples", type=int, default=256, help="rollouts per verl step")
    args = ap.parse_args()
    import random

    with tempfile.TemporaryDirectory(prefix="dyngen-follow-") as tmp:
        root = Path(tmp)
        os.environ["DYNGEN_OUTBOX"] = str(root / "outbox")
        store = Store(root / "store")
        rng = random.Random(0)
        rows = [arithmetic_task(rng, i, 1) for i in range(32)]
        for name in ("direct", "followed", "overhead"):
            store.create(name, rows)
        server = LocalServer(root / "prefect").start()
        os.environ.update(server.env())
        env = server.env(PYTHONPATH=str(REPO))
        dyngen = [sys.executable, "-m", "dyngen.cli", "--root", str(store.root)]
        metrics, dumps = root / "verl" / "metrics.jsonl", root / "verl" / "dumps"
        metrics.parent.mkdir()
        # Measured before anything serves rounds: its events trigger none.
        per_step, per_emit = overhead(store, rows, root, server.api_url, args.events,
                                      args.samples)
        serve = spawn([*dyngen, "serve", *ROUND], env, root / "serve.log", cwd=REPO)
        follow = spawn([*dyngen, "follow", "followed", "--verl-metrics", str(metrics),
                        "--rollout-dir", str(dumps), "--run-id", "bench"], env,
                       root / "follow.log", cwd=REPO)
        try:
            wait_for_automation(server.api_url, trigger_name(None))
            served, via_follow = [], []
            for step in range(1, args.events + 1):
                t0 = time.perf_counter()
                event_id = emit_batch_end("direct", step, {"score": 0.5},
                                          api_url=server.api_url)
                committed(store, "direct", f"event:{event_id}")
                served.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                write_step(metrics, dumps, step, rows, args.samples)
                committed(store, "followed", f"event:{event_id_for('bench', step)}")
                via_follow.append(time.perf_counter() - t0)
                print(f"step {step:>2}: direct emit {served[-1]:.2f} s, through follow "
                      f"{via_follow[-1]:.2f} s", flush=True)
        finally:
            stop(follow)
            stop(serve)
            server.stop()
    med = statistics.median
    print(f"\nper step ({args.samples} rollouts): follow {med(per_step) * 1000:.1f} ms "
          f"(poll: line + conversion + emit), direct emit {med(per_emit) * 1000:.1f} ms; "
          f"overhead {(med(per_step) - med(per_emit)) * 1000:.1f} ms, "
          f"ratio {med(per_step) / med(per_emit):.2f}")
    print(f"{'path':<14}{'events':>8}{'median s':>10}{'max s':>8}{'ratio':>8}")
    print(f"{'direct emit':<14}{len(served):>8}{med(served):>10.2f}{max(served):>8.2f}"
          f"{1.0:>8.2f}")
    print(f"{'follow':<14}{len(via_follow):>8}{med(via_follow):>10.2f}{max(via_follow):>8.2f}"
          f"{med(via_follow) / med(served):>8.2f}")
    print("follow = verl writes a step → follow's poll (1 s) → emit → automation → run → "
          "committed; direct = emit_batch_end → the same")


if __name__ == "__main__":
    main()
