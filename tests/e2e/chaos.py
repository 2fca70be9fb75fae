"""Chaos: a real `prefect server start`, `dyngen serve` and a trainer (an emitter process
sending batch ends 1..N at a steady pace), and a seeded schedule of SIGKILLs of each; then
everything healed and what the store and the server hold, checked.

Used by tests/e2e/test_chaos.py (a small schedule, in CI) and benchmarks/chaos.py (~100
steps). Every process here is started by this module, in its own process group, and
stopped by its PID.

The faults:
- serve      SIGKILL of `dyngen serve`'s whole process group (the serve process, its fork
             server, the round it runs), restarted after `down_seconds`;
- server     SIGKILL of the Prefect server's process group, restarted on the same port and
             database (PostgreSQL, which runs on: it is a process of its own);
- emitter    SIGKILL of the trainer, restarted from its last checkpoint: it sends the last
             two steps again, as a resumed trainer does (new event ids, the same steps).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dyngen.generators.arithmetic import arithmetic_task
from dyngen.round import stepped_rounds
from dyngen.server.local import LocalServer, spawn, stop, wait_for_automation
from dyngen.store import Store, verify
from dyngen.trainers.events import trigger_name
from dyngen.trainers.outbox import Outbox

REPO = Path(__file__).resolve().parents[2]
DATASET = "chaos"
ROUND = ["data.datagen.path=pkg://dyngen.generators.arithmetic",
         "data.datagen.name=ArithmeticCurriculum", "data.datagen.tasks_per_round=4",
         "data.filter_overlong_prompts=false"]
KINDS = ("serve", "server", "emitter")
RESENT_STEPS = 2  # a resumed trainer sends the steps since its checkpoint again

# The trainer: steps from its checkpoint on, one batch end each `pace` seconds; each emit
# logged (step, event id, status, time) and the checkpoint written after it, as a trainer
# checkpoints after its step. At the end it delivers what waits in its outbox.
EMITTER = f"""
import json, sys, time
from pathlib import Path
from dyngen.trainers.events import flush_outbox, send_batch_end
dataset, api_url, steps, pace, folder = sys.argv[1], sys.argv[2], int(sys.argv[3]), \\
    float(sys.argv[4]), Path(sys.argv[5])
checkpoint = folder / "checkpoint"
done = int(checkpoint.read_text()) if checkpoint.exists() else 0
first = max(1, done - {RESENT_STEPS} + 1) if done else 1
for step in range(first, steps + 1):
    time.sleep(pace)  # the batch
    sent = send_batch_end(dataset, step, {{"score": round(step / steps, 3)}}, api_url=api_url)
    with open(folder / "emits.jsonl", "a") as log:
        log.write(json.dumps({{"step": step, "event_id": sent.event_id, "status": sent.status,
                              "at": time.time()}}) + "\\n")
    (folder / "checkpoint.tmp").write_text(str(step))
    (folder / "checkpoint.tmp").replace(checkpoint)  # atomic, as a trainer's checkpoint
deadline = time.monotonic() + 120
while time.monotonic() < deadline:  # until the server has stored every event
    done = flush_outbox(api_url)
    if done.status == "sent" and not done.unconfirmed:
        break
    time.sleep(1)
print("emitter done", flush=True)
"""


@dataclass(frozen=True)
class Fault:
    """One SIGKILL: of what, once the trainer has sent `at_step`, down for `down` seconds."""

    kind: str
    at_step: int
    down: float


def schedule(seed: int, steps: int, counts: dict[str, int],
             down: tuple[float, float] = (2.0, 5.0)) -> list[Fault]:
    """A seeded schedule: `counts[kind]` faults of each kind at distinct steps, in order."""
    rng = random.Random(seed)
    total = sum(counts.values())
    # Faults start after the first step and leave the last two for the end to be checked.
    at = sorted(rng.sample(range(2, steps - 1), total))
    kinds = [kind for kind in KINDS for _ in range(counts.get(kind, 0))]
    rng.shuffle(kinds)
    return [Fault(kind, step, round(rng.uniform(*down), 1))
            for kind, step in zip(kinds, at, strict=True)]


@dataclass
class Chaos:
    """The processes of one chaos run under `folder`, and what happened to them."""

    folder: Path
    steps: int
    pace: float
    server: LocalServer = field(init=False)
    store: Store = field(init=False)
    serve: subprocess.Popen[bytes] | None = None
    emitter: subprocess.Popen[bytes] | None = None
    log: list[dict[str, Any]] = field(default_factory=list)  # each fault and its recovery

    def __post_init__(self) -> None:
        self.server = LocalServer(self.folder / "prefect")
        self.store = Store(self.folder / "store")
        self.outbox = self.folder / "outbox"

    def env(self) -> dict[str, str]:
        return self.server.env(PYTHONPATH=str(REPO), DYNGEN_OUTBOX=str(self.outbox))

    # ---- processes -------------------------------------------------------------------
    def start(self) -> None:
        rng = random.Random(0)
        self.store.create(DATASET, [arithmetic_task(rng, i, 1, "seed") for i in range(8)])
        self.server.start()
        self.start_serve()
        wait_for_automation(self.server.api_url, trigger_name(DATASET))
        self.start_emitter()

    def start_serve(self) -> None:
        self.serve = spawn([sys.executable, "-m", "dyngen.cli", "--root", str(self.store.root),
                            "serve", "--dataset", DATASET, *ROUND], self.env(),
                           self.folder / "serve.log", cwd=REPO)

    def start_emitter(self) -> None:
        self.emitter = spawn([sys.executable, "-c", EMITTER, DATASET, self.server.api_url,
                              str(self.steps), str(self.pace), str(self.folder)], self.env(),
                             self.folder / "emitter.log", cwd=REPO)

    def stop(self) -> None:
        """Stop everything this run started, by PID."""
        for proc in (self.emitter, self.serve):
            if proc is not None:
                stop(proc)
        self.server.stop()

    def emits(self) -> list[dict[str, Any]]:
        path = self.folder / "emits.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(line) for line in lines if line.endswith("}")]

    def sent_step(self) -> int:
        """The highest step the trainer has sent (or queued)."""
        return max((e["step"] for e in self.emits()), default=0)

    # ---- faults ----------------------------------------------------------------------
    def inject(self, fault: Fault, timeout: float) -> None:
        """Wait for the trainer to reach the fault's step, kill, wait, restart."""
        deadline = time.monotonic() + timeout
        while self.sent_step() < fault.at_step:
            if time.monotonic() > deadline:
                raise AssertionError(f"the trainer never reached step {fault.at_step}; "
                                     f"{self.tail('emitter.log')}")
            time.sleep(0.05)
        killed_at = time.time()
        if fault.kind == "serve":
            _kill_group(self.serve)
            time.sleep(fault.down)
            self.start_serve()
        elif fault.kind == "server":
            _kill_group(self.server.process)
            self.server.process = None
            time.sleep(fault.down)
            self.server.start()
        else:
            _kill_group(self.emitter)
            time.sleep(fault.down)
            self.start_emitter()
        self.log.append({"kind": fault.kind, "at_step": fault.at_step, "down": fault.down,
                         "killed_at": killed_at, "restarted_at": time.time()})

    def heal(self, timeout: float) -> None:
        """Wait, with a bound, for the trainer to finish and every step to commit."""
        deadline = time.monotonic() + timeout
        assert self.emitter is not None
        while self.emitter.poll() is None or self._missing():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"not healed within {timeout:.0f} s: trainer "
                    f"{'running' if self.emitter.poll() is None else 'done'}, steps not "
                    f"committed {self._missing()}\nruns:\n{self.describe_runs()}\n"
                    f"{self.tail('serve.log')}")
            time.sleep(0.5)

    def _missing(self) -> list[int]:
        committed = {step for step, _ in self.committed_steps()}
        return [s for s in range(1, self.steps + 1) if s not in committed]

    def committed_steps(self) -> list[tuple[int, int]]:
        """(trigger step, version) of every round's version, in version order."""
        return [(step, rec.version) for step, rec in reversed(self._rounds())]

    def _rounds(self) -> list[tuple[int, Any]]:
        """(trigger step, record) of the rounds' versions, newest first (not compactions)."""
        return list(stepped_rounds(Store(self.store.root), DATASET))

    def tail(self, name: str, chars: int = 4000) -> str:
        path = self.folder / name
        return f"{name}:\n{path.read_text()[-chars:]}" if path.exists() else f"no {name}"

    # ---- what must hold --------------------------------------------------------------
    def problems(self) -> list[str]:
        """Everything the healed run breaks of what must hold (empty: all holds)."""
        found = []
        steps = [step for step, _ in self.committed_steps()]
        if sorted(set(steps)) != list(range(1, self.steps + 1)) or len(steps) != len(set(steps)):
            found.append(f"steps committed (in version order) {steps}, expected each of "
                         f"1..{self.steps} exactly once")
        if steps != sorted(steps):
            found.append(f"steps committed out of step order: {steps}")
        issues = verify(Store(self.store.root), DATASET)
        if issues:
            found.append(f"verify: {issues}")
        cli = subprocess.run([sys.executable, "-m", "dyngen.cli", "--root", str(self.store.root),
                              "verify", DATASET], env=self.env(), cwd=REPO,
                             capture_output=True, text=True, timeout=120)
        if cli.returncode != 0:
            found.append(f"dyngen verify exited {cli.returncode}: {cli.stdout}{cli.stderr}")
        outbox = Outbox(self.outbox)
        pending = outbox.pending(self.server.api_url) + outbox.unconfirmed(self.server.api_url)
        if pending:
            found.append(f"{len(pending)} events left in the outbox")
        found += self._run_problems()
        return found

    def _run_problems(self) -> list[str]:
        """Every run ended; each Crashed or Failed one retried or superseded by a run of
        the same step that committed the step's version."""
        from prefect.client.orchestration import get_client

        versions = dict(self._rounds())
        found = []
        with self.server.client_settings(), get_client(sync_client=True) as client:
            runs = _all_runs(client)
            by_id = {run.id: run for run in runs}
            for run in runs:
                step = ((run.parameters or {}).get("trigger") or {}).get("step")
                state = run.state
                if state is None or not state.is_final():
                    found.append(f"run {run.name} (step {step}) never ended: "
                                 f"{state.name if state else None}")
                    continue
                if not (state.is_crashed() or state.is_failed()):
                    continue
                rec = versions.get(step)
                committer = by_id.get(_uuid(rec.lineage.get("flow_run_id"))) if rec else None
                if rec is None or committer is None or not committer.state.is_completed():
                    found.append(f"run {run.name} (step {step}) ended {state.name} and "
                                 "no retry or later run of its step committed it")
        return found

    def describe_runs(self) -> str:
        """Every flow run: name, step, state and its message (for a failure's report)."""
        from prefect.client.orchestration import get_client

        try:
            with self.server.client_settings(), get_client(sync_client=True) as client:
                runs = _all_runs(client)
        except Exception as exc:  # the report must not hide the failure it explains
            return f"(runs unreadable: {exc})"
        lines = []
        for run in sorted(runs, key=lambda r: r.created or 0):
            step = ((run.parameters or {}).get("trigger") or {}).get("step")
            state = run.state
            lines.append(f"  {run.name} step={step} {state.name if state else None}: "
                         f"{(state.message or '')[:160] if state else ''}")
        return "\n".join(lines)

    # ---- the benchmark's figures -----------------------------------------------------
    def latencies(self) -> tuple[list[float], list[float]]:
        """Emit → commit seconds of the steps no fault touched, and recovery seconds after
        each fault (restart → the next version committed)."""
        commits, first_emit, touched = self._timings()
        clean = [commits[s] - at for s, at in first_emit.items()
                 if s in commits and s not in touched]
        for fault in self.log:
            after = [t for t in commits.values() if t >= fault["restarted_at"]]
            fault["recovery"] = (min(after) - fault["restarted_at"]) if after else None
        return clean, [f["recovery"] for f in self.log if f.get("recovery") is not None]

    def touched_latencies(self) -> list[float]:
        """Emit → commit seconds of the steps a fault touched (in flight while it hit)."""
        commits, first_emit, touched = self._timings()
        return [commits[s] - first_emit[s] for s in sorted(touched) if s in commits]

    def _timings(self) -> tuple[dict[int, float], dict[int, float], set[int]]:
        commits = {step: _epoch(rec.created_at) for step, rec in self._rounds()}
        first_emit: dict[int, float] = {}
        for emit in self.emits():
            first_emit.setdefault(emit["step"], emit["at"])
        touched: set[int] = set()
        for fault in self.log:
            touched |= {s for s, at in first_emit.items()
                        if at <= fault["restarted_at"] and commits.get(s, 0) >= fault["killed_at"]}
        return commits, first_emit, touched


def run_chaos(folder: Path, seed: int, steps: int, counts: dict[str, int], pace: float,
              heal_seconds: float) -> Chaos:
    """A whole chaos run; the caller reads `.problems()` and `.latencies()`, then `.stop()`."""
    chaos = Chaos(folder, steps, pace)
    try:
        chaos.start()
        for fault in schedule(seed, steps, counts):
            chaos.inject(fault, timeout=steps * pace * 4 + 120)
        chaos.heal(heal_seconds)
    except BaseException:
        chaos.stop()
        raise
    return chaos


def summary(values: list[float]) -> str:
    if not values:
        return "none"
    ordered = sorted(values)
    p95 = ordered[max(0, round(0.95 * len(ordered)) - 1)]
    return f"median {statistics.median(values):.2f} s, p95 {p95:.2f} s (n={len(values)})"


def _kill_group(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _all_runs(client: Any) -> list[Any]:
    runs, offset = [], 0
    while True:
        page = client.read_flow_runs(limit=200, offset=offset)
        runs += page
        if len(page) < 200:
            return runs
        offset += 200


def _uuid(value: Any) -> Any:
    from uuid import UUID

    try:
        return UUID(str(value))
    except ValueError:
        return None


def _epoch(created_at: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(created_at).timestamp()
