"""`dyngen demo`: the whole loop on one machine, with nothing else running.

It starts a local Prefect server (PostgreSQL under the demo folder where the extra
`dyngen[server]` is installed, else SQLite; 127.0.0.1 only), serves
the generation round with its batch-end trigger, seeds a small verl-format dataset,
runs a simulated training loop that emits batch-end events with metrics and rollouts
(each sampled prompt's rewards, so the report draws "Is the data helping?"), waits for
each triggered round to commit, prints the history with lineage and the UI address,
writes the history's report (report.html in the demo folder) and prints its path, then
stops everything it started, by PID (unless --keep-server).
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from rich.console import Console

from dyngen.generators.arithmetic import arithmetic_task
from dyngen.report import write_report
from dyngen.round.lineage import history_table
from dyngen.server.local import LocalServer, wait_for_automation
from dyngen.server.processes import spawn, stop
from dyngen.store import Store, VersionRecord, verify
from dyngen.trainers.events import emit_batch_end, trigger_name
from dyngen.trainers.rollouts import rollout_record, rollouts_dir, write_rollouts
from dyngen.trainers.spread import grouped, spread_metrics
from dyngen.trainers.verl_format import import_files

DATASET = "arith-demo"
ROUND_TIMEOUT_SECONDS = 120.0
PROMPTS_PER_BATCH = 4  # the simulated trainer's batch: prompts, each sampled SAMPLES times
SAMPLES = 4


def demo_config(store_root: Path) -> dict:
    """The rounds' config: the arithmetic curriculum, verl's keys under data."""
    return {
        "store": {"root": str(store_root)},
        "data": {"filter_overlong_prompts": False,
                 "datagen": {"path": "pkg://dyngen.generators.arithmetic",
                             "name": "ArithmeticCurriculum", "tasks_per_round": 8,
                             "target_score": 0.6}},
    }


def seed(store: Store, workdir: Path, console: Console) -> VersionRecord:
    """Import a 16-row verl-format parquet file as version 0 (once)."""
    if store.head_version(DATASET) is not None:
        head = store.head(DATASET)
        console.print(f"dataset {DATASET} exists at v{head.version} ({head.rows} rows); "
                      "continuing it")
        return head
    rng = random.Random(0)
    seed_file = workdir / "seed.parquet"
    pq.write_table(pa.Table.from_pylist(
        [arithmetic_task(rng, i, 1, "seed") for i in range(16)]), seed_file)
    rec = import_files(store, DATASET, [seed_file])
    console.print(f"seeded {DATASET} v0 from {seed_file} ({rec.rows} rows)")
    return rec


def simulated_batch(store: Store, rng: random.Random, score: float, path: Path
                    ) -> tuple[Path, dict[str, float]]:
    """A training batch as a GRPO trainer would report it: PROMPTS_PER_BATCH of the
    dataset's prompts, each sampled SAMPLES times and scored 1 with probability `score`,
    written as the rollouts file `path`; and the batch's reward spread (dyngen/...)."""
    rows = store.to_arrow(DATASET).to_pylist()
    records = []
    for row in rng.sample(rows, min(PROMPTS_PER_BATCH, len(rows))):
        truth = row["reward_model"]["ground_truth"]
        for _ in range(SAMPLES):
            record = rollout_record(row["prompt"], float(rng.random() < score), truth)
            if record is not None:
                records.append(record)
    spread = spread_metrics(grouped((r["prompt"], r["score"]) for r in records))
    return write_rollouts(path, records), spread


def wait_for_event(store: Store, event_id: str, timeout: float) -> VersionRecord:
    """The version whose round was triggered by `event_id`, once committed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = store.find_idempotency_key(DATASET, f"event:{event_id}")
        if found is not None:
            return found
        time.sleep(0.25)
    raise TimeoutError(f"no version was committed for event {event_id} within {timeout:.0f} s; "
                       "see the serve log in the demo folder.")


def run_demo(workdir: Path, console: Console, *, batches: int = 3,
             keep_server: bool = False) -> Store:
    """Run the demo under `workdir`; return the store it grew."""
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    store = Store(workdir / "store")
    server = LocalServer(workdir / "prefect")
    # Prefect code in this process (the event client) must use the demo's server and
    # home, never ~/.prefect or a temporary in-process server.
    os.environ.update(server.env())
    serve = None
    try:
        kind = "PostgreSQL" if server.database == "postgresql" else "SQLite"
        console.print(f"starting a Prefect server on {server.ui_url} ({kind} in {server.home})…",
                      markup=False, soft_wrap=True)
        if server.note:
            console.print(f"  {server.note}", markup=False, soft_wrap=True)
        t0 = time.monotonic()
        server.start()
        console.print(f"  up in {time.monotonic() - t0:.0f} s")
        start = seed(store, workdir, console)
        config_file = workdir / "rounds.yaml"
        config_file.write_text(yaml.safe_dump(demo_config(store.root)))
        serve = spawn([sys.executable, "-m", "dyngen.cli", "--config", str(config_file),
                       "serve", "--dataset", DATASET], server.env(), workdir / "serve.log")
        console.print(f"serving the round for {DATASET} (PID {serve.pid}; log "
                      f"{workdir / 'serve.log'})…")
        wait_for_automation(server.api_url, trigger_name(DATASET))
        console.print("  its batch-end trigger is registered")
        rng = random.Random(1)
        score = 0.5
        for step in range(start.version + 1, start.version + 1 + batches):
            time.sleep(0.5)  # "training"
            score = min(1.0, max(0.0, score + rng.uniform(-0.1, 0.3)))
            rollouts, spread = simulated_batch(  # where the round may read it
                store, rng, score, rollouts_dir(store.root, DATASET, "demo") / f"step-{step}.jsonl")
            t_emit = time.monotonic()
            event_id = emit_batch_end(DATASET, step, {"score": round(score, 3), **spread},
                                      rollouts, api_url=server.api_url)
            if event_id is None:
                raise RuntimeError("the batch-end event could not be sent; see the warning")
            console.print(f"step {step}: batch ended (score {score:.2f}) → event "
                          f"{event_id[:8]}…, waiting for its round")
            rec = wait_for_event(store, event_id, ROUND_TIMEOUT_SECONDS)
            counts = rec.lineage.get("counts", {})
            console.print(f"  committed v{rec.version} in {time.monotonic() - t_emit:.1f} s: "
                          f"kept {counts.get('kept')} of {counts.get('generated')}, "
                          f"{rec.rows} rows")
        show_history(store, console)
        problems = verify(store, DATASET)
        console.print("verify: ok" if not problems else f"verify: {problems}")
        console.print(ui_line(server.ui_url, keep_server), markup=False, soft_wrap=True)
        report = write_report(store, DATASET, workdir / "report.html")
        console.print(f"report: {report} (charts of the history; open it in a browser)",
                      markup=False, soft_wrap=True)
        if keep_server:
            pid = server.process.pid if server.process else "?"
            database = (f", PostgreSQL PID {server.postgres.pid}"
                        if server.postgres is not None else "")
            console.print(f"--keep-server: server PID {pid}, serve PID {serve.pid}{database}; "
                          f"stop each with `kill -INT -<PID>`. Use "
                          f"PREFECT_API_URL={server.api_url}")
    finally:
        if not keep_server:
            if serve is not None:
                stop(serve)
            server.stop()
            console.print("stopped the serve process and the Prefect server")
    return store


def ui_line(ui_url: str, keep_server: bool) -> str:
    """Where the UI is, and (unless it stays up) that the demo stops it and how to keep it."""
    what = f"Prefect UI: {ui_url} (flow runs, artifacts dyngen-{DATASET}-round / -history)"
    if keep_server:
        return what
    return (f"{what}; the demo stops this server when it ends: run `dyngen demo "
            "--keep-server` to keep it up and browse it")


def show_history(store: Store, console: Console) -> None:
    """The version history with lineage, as `dyngen log` prints it."""
    console.print(history_table(store, DATASET))

