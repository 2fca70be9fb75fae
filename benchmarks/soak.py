"""Soak: N rounds back to back through the served deployment; store health and memory.

Starts a local Prefect server (SQLite or PostgreSQL) and `dyngen serve` for one dataset,
then emits a batch-end event, waits for its version, and emits the next, N times. Prints
every 20 rounds the RSS of the serve process and of its fork server (rounds run in
children of the fork server, which end with their round), and at the end: rounds
committed, versions contiguous, `verify` result, orphans `gc` finds, emit → commit
latency (median, p95), and the RSS growth of both from round 20 (warm) to the end, as
ratios (target: within 1.20).

    python benchmarks/soak.py [--rounds 200] [--database sqlite|postgresql]
        [--isolation fork|process]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dyngen.generators.arithmetic import arithmetic_task  # noqa: E402
from dyngen.server.local import LocalServer, spawn, stop, wait_for_automation  # noqa: E402
from dyngen.store import Store, gc, verify  # noqa: E402
from dyngen.trainers.events import emit_batch_end, trigger_name  # noqa: E402

WARM = 20


def rss_mb(pid: int) -> float:
    """Resident memory of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for PID {pid}")


def fork_server_pid(serve_pid: int) -> int | None:
    """The fork server `dyngen serve` started (a child of it running forkserver's main)."""
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text().rpartition(")")[2].split()
            cmdline = (proc / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if int(stat[1]) == serve_pid and b"forkserver" in cmdline:
            return int(proc.name)
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--database", default="sqlite", choices=["sqlite", "postgresql"])
    ap.add_argument("--isolation", default="fork", choices=["fork", "process"])
    ap.add_argument("--workdir", type=Path, default=None,
                    help="Keep the server, store and logs here (default: a temporary folder).")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dyngen-soak-") as tmp:
        os.chmod(tmp, 0o711)  # under root, PostgreSQL runs as nobody and must reach it
        root = (args.workdir or Path(tmp)).resolve()
        root.mkdir(parents=True, exist_ok=True)
        store = Store(root / "store")
        rng = random.Random(0)
        store.create("soak", [arithmetic_task(rng, i, 1, "seed") for i in range(16)])
        server = LocalServer(root / "prefect", database=args.database).start()
        serve = spawn([sys.executable, "-m", "dyngen.cli", "--root", str(store.root), "serve",
                       "--dataset", "soak", "--isolation", args.isolation,
                       "data.datagen.path=pkg://dyngen.generators.arithmetic",
                       "data.datagen.name=ArithmeticCurriculum"],
                      server.env(PYTHONPATH=str(REPO)), root / "serve.log", cwd=REPO)
        latencies: list[float] = []
        rss: dict[str, dict[int, float]] = {"serve": {}, "fork server": {}}
        try:
            wait_for_automation(server.api_url, trigger_name("soak"))
            for step in range(1, args.rounds + 1):
                t0 = time.perf_counter()
                score = 0.3 + 0.6 * (step % 7) / 6  # moves the curriculum up and down
                event_id = emit_batch_end("soak", step, {"score": score}, api_url=server.api_url)
                if event_id is None:
                    raise RuntimeError(f"event {step} was not sent")
                deadline = time.monotonic() + 300
                while store.find_idempotency_key("soak", f"event:{event_id}") is None:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"round {step} did not commit; see "
                                           f"{root / 'serve.log'}")
                    time.sleep(0.05)
                latencies.append(time.perf_counter() - t0)
                if step == WARM or step % 20 == 0 or step == args.rounds:
                    rss["serve"][step] = rss_mb(serve.pid)
                    forks = fork_server_pid(serve.pid)
                    if forks is not None:
                        rss["fork server"][step] = rss_mb(forks)
                    print(f"round {step:>4}: " + ", ".join(
                        f"{k} RSS {v[step]:7.1f} MB" for k, v in rss.items() if step in v)
                        + f", latency {latencies[-1]:.2f} s", flush=True)
        finally:
            stop(serve)
            server.stop()
        history = store.history("soak")
        contiguous = [r.version for r in history] == list(range(len(history)))
        problems = verify(store, "soak")
        orphans = gc(store, "soak", grace_seconds=0)
        lat = sorted(latencies)
        print(f"database, isolation  {args.database}, {args.isolation}")
        rounds = sum(r.operation == "append" for r in history)
        compactions = sum(r.operation == "compact" for r in history)
        print(f"rounds committed     {rounds} of {args.rounds} (and {compactions} compactions)")
        print(f"versions contiguous  {contiguous}")
        print(f"verify problems      {len(problems)}")
        print(f"orphans found by gc  {len(orphans)}")
        print(f"latency median / p95 {statistics.median(lat):.2f} s / "
              f"{lat[int(0.95 * (len(lat) - 1))]:.2f} s")
        for name, sizes in rss.items():
            if not sizes:
                continue
            warm, last = sizes.get(WARM, next(iter(sizes.values()))), sizes[max(sizes)]
            print(f"{name} RSS round {WARM} → {max(sizes)}: {warm:.1f} → {last:.1f} MB, "
                  f"ratio {last / warm:.2f} (target ≤ 1.20)")


if __name__ == "__main__":
    main()
