"""Emit → committed-version latency through the served deployment, against a direct round.

Starts a local Prefect server, serves the round with its batch-end trigger (runner poll
interval 1 s), emits N events one at a time and times each from `emit_batch_end` to the
version committed for that event. The baseline, measured in the same run, is the same
round called directly in-process (no event, no scheduling, no subprocess).

    python benchmarks/trigger_latency.py [--events 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dyngen.events import emit_batch_end, trigger_name  # noqa: E402
from dyngen.local_server import LocalServer, spawn, stop, wait_for_automation  # noqa: E402
from dyngen.store import Store  # noqa: E402
from generators.arithmetic import arithmetic_task  # noqa: E402

ROUND = ["data.datagen.path=pkg://generators.arithmetic",
         "data.datagen.name=ArithmeticCurriculum"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10)
    args = ap.parse_args()
    import random

    with tempfile.TemporaryDirectory(prefix="dyngen-latency-") as tmp:
        root = Path(tmp)
        store = Store(root / "store")
        rng = random.Random(0)
        store.create("served", [arithmetic_task(rng, i, 1) for i in range(16)])
        store.create("direct", [arithmetic_task(rng, i, 1) for i in range(16)])
        server = LocalServer(root / "prefect").start()
        os.environ.update(server.env())
        serve = spawn([sys.executable, "-m", "dyngen.cli", "--root", str(store.root), "serve",
                       "--dataset", "served", *ROUND], server.env(PYTHONPATH=str(REPO)),
                      root / "serve.log", cwd=REPO)
        try:
            wait_for_automation(server.api_url, trigger_name("served"))
            served, direct = [], []
            from flows.generation_round import generation_round

            config = {"store": {"root": str(store.root)},
                      "data": {"datagen": {"path": "pkg://generators.arithmetic",
                                           "name": "ArithmeticCurriculum"}}}
            for step in range(1, args.events + 1):
                t0 = time.perf_counter()
                event_id = emit_batch_end("served", step, {"score": 0.7}, api_url=server.api_url)
                assert event_id is not None, "event not sent"
                while store.find_idempotency_key("served", f"event:{event_id}") is None:
                    time.sleep(0.05)
                served.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                generation_round("direct", config, {"step": step, "metrics": {"score": 0.7}})
                direct.append(time.perf_counter() - t0)
                print(f"event {step:>2}: served {served[-1]:.2f} s, direct {direct[-1]:.2f} s",
                      flush=True)
        finally:
            stop(serve)
            server.stop()
    med_s, med_d = statistics.median(served), statistics.median(direct)
    print(f"{'mode':<8}{'events':>8}{'median s':>10}{'max s':>8}{'ratio':>8}")
    print(f"{'direct':<8}{len(direct):>8}{med_d:>10.2f}{max(direct):>8.2f}{1.0:>8.2f}")
    print(f"{'served':<8}{len(served):>8}{med_s:>10.2f}{max(served):>8.2f}{med_s / med_d:>8.2f}")
    print("served = emit → event → automation → scheduled run → runner (1 s poll) → committed; "
          "target: median <= 5 s")


if __name__ == "__main__":
    main()
