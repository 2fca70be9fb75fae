"""Chaos: a real `prefect server start` (on its PostgreSQL), `dyngen serve --dataset chaos`
and trainers (emitter processes writing batch ends 1..N into the store's inbox at a steady
pace, each with its own training run id), a seeded schedule of faults, then everything
healed and the store's guarantee checked.

Used by tests/e2e/test_chaos.py (a small schedule, in CI) and benchmarks/chaos.py (every
kind of fault, the latency and backlog figures). Every process here is started by this
module, in its own process group, and stopped by its PID.

What must hold (`Chaos.problems`), read from the store alone (no Prefect state decides
coverage): each step 1..N of each training run is covered by exactly one version (the
records' `covers`); per run, the steps are covered in step order across versions; nothing
is pending in the inbox; `verify` and `dyngen verify` are clean; the trainers' local retry
queue is empty after their final flush (`flush_queues`, what `dyngen emit --flush` does);
no batch end was left unrecorded; and every flow run on the server ended (rounds in flight
when the checks begin, a catch-up round say, are given RUN_END_SECONDS to; runs the
catch-up schedule set for later are not runs left behind).

The faults (`KINDS`; each scheduled at a step the first trainer has sent):
- serve     SIGKILL of `dyngen serve`'s process group (the serve, its fork server, the
            round it runs); restarted after `down` seconds.
- server    SIGKILL of the Prefect server's process group; restarted on the same port and
            database (its PostgreSQL, a process of its own, runs on).
- emitter   SIGKILL of a trainer; restarted from its checkpoint, so it sends its last two
            steps again (the same run id: the store keeps the first of each).
- stop      SIGSTOP of the Prefect server's process group for `down` seconds, then
            SIGCONT: a server that hangs rather than dies.
- postgres  SIGKILL of the PostgreSQL postmaster under the server (LocalServer runs one
            where the server extra is installed; on SQLite the fault is skipped, said in
            its log entry); restarted on its port and data after `down` seconds. The
            Prefect server is restarted too only if it does not answer again on its own
            (the log says which).
- twice     a second `dyngen serve` of the same dataset while one serves: it must exit
            non-zero, quickly, and the first must keep its lease and serve on.
- startup   the serve killed and a new one killed during its start-up (`variant` early:
            0.2-0.5 s after it was spawned; lease: as soon as its lease is in the store),
            then a good one started.
- round     the serve killed while a round runs (its flow run left Running), then the next
            serve killed in the old window: as it ends that dead run (`variant` ending: the
            moment the run leaves Running) or as it takes the lease (lease); then a good
            one started.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from dyngen.generators.arithmetic import arithmetic_task
from dyngen.server.local import LocalServer, spawn, stop, wait_for_automation
from dyngen.store import Store, verify
from dyngen.trainers.events import trigger_name
from dyngen.trainers.inbox_queue import REFUSED_DIR, InboxQueue

REPO = Path(__file__).resolve().parents[2]
DATASET = "chaos"
ROUND = ["data.datagen.path=pkg://dyngen.generators.arithmetic",
         "data.datagen.name=ArithmeticCurriculum", "data.datagen.tasks_per_round=4",
         "data.filter_overlong_prompts=false"]


def slow_round(seconds: float) -> list[str]:
    """Round overrides whose generator sleeps `seconds` first (tests/e2e/slow_generator.py)."""
    return ["data.datagen.path=pkg://tests.e2e.slow_generator",
            "data.datagen.name=SlowArithmetic", f"data.datagen.seconds={float(seconds)}",
            "data.datagen.tasks_per_round=4", "data.filter_overlong_prompts=false"]


KINDS = ("serve", "server", "emitter", "stop", "postgres", "twice", "startup", "round")
RESENT_STEPS = 2  # a resumed trainer sends the steps since its checkpoint again
DOWN_SECONDS = (2.0, 5.0)
STOPPED_SECONDS = (4.0, 10.0)  # a SIGSTOPped server: longer than a wake-up's timeout
EARLY_KILL_SECONDS = (0.2, 0.5)  # startup, early: the kill this long after the spawn
SECOND_SERVE_SECONDS = 120.0  # a refused second serve exits within this (a loaded machine)
WAIT_SECONDS = 180.0  # the longest a fault waits for what it needs (a round, a lease)
SAMPLE_SECONDS = 0.5  # how often the harness counts the inbox's pending batch ends
RUN_END_SECONDS = 120.0  # the checks wait this long for rounds in flight to end
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}

# The trainer: training run `run`, steps from its checkpoint on, one batch end each `pace`
# seconds, written into the store's inbox and then announced (send_batch_end(store=...,
# run=...)). Each emit is logged before ("emit", when the trainer emits) and after
# ("sent": what became of it), and the checkpoint written after it, as a trainer
# checkpoints after its step. At the end it writes what waits in its local retry queue
# (`flush_queues`, as `dyngen emit --flush` does), until nothing does.
EMITTER = f"""
import json, sys, time
from pathlib import Path
from dyngen.trainers.events import send_batch_end
from dyngen.trainers.inbox_write import flush_queues
dataset, api_url, store, run, steps, pace, folder = sys.argv[1:8]
steps, pace, folder = int(steps), float(pace), Path(folder)
checkpoint = folder / "checkpoint"
done = int(checkpoint.read_text()) if checkpoint.exists() else 0
first = max(1, done - {RESENT_STEPS} + 1) if done else 1

def log(**entry):
    with open(folder / "emits.jsonl", "a") as out:
        out.write(json.dumps({{"run": run, **entry}}) + "\\n")

for step in range(first, steps + 1):
    time.sleep(pace)  # the batch
    log(phase="emit", step=step, at=time.time())
    sent = send_batch_end(dataset, step, {{"score": round(step / steps, 3)}}, store=store,
                          run=run, api_url=api_url)
    log(phase="sent", step=step, at=time.time(), event_id=sent.event_id, status=sent.status,
        inbox=sent.inbox)
    (folder / "checkpoint.tmp").write_text(str(step))
    (folder / "checkpoint.tmp").replace(checkpoint)  # atomic, as a trainer's checkpoint
deadline = time.monotonic() + 120
while True:  # the batch ends the store could not take yet, written
    flushed = flush_queues(store)
    if not flushed.pending or time.monotonic() > deadline:
        break
    time.sleep(1)
print(f"emitter done: {{flushed.written}} written from the retry queue, "
      f"{{flushed.pending}} still queued {{flushed.reason}}", flush=True)
"""


@dataclass(frozen=True)
class Fault:
    """One fault: of what, once the first trainer has sent `at_step`, for `down` seconds
    (startup, early: the kill's delay after the spawn), in which `variant` (startup,
    round)."""

    kind: str
    at_step: int
    down: float
    variant: str = ""


def schedule(seed: int, steps: int, counts: dict[str, int],
             quiet_steps: int = 0) -> list[Fault]:
    """A seeded schedule: `counts[kind]` faults of each kind at distinct steps, in order,
    none before step `quiet_steps` + 1 (a steady stretch to measure)."""
    unknown = sorted(set(counts) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}; expected some of {KINDS}")
    rng = random.Random(seed)
    total = sum(counts.values())
    # Faults start after the first step (and the quiet ones) and leave the last two for
    # the end to be checked.
    where = range(max(2, quiet_steps + 1), steps - 1)
    if total > len(where):
        raise ValueError(f"{total} faults need {total} steps between step {where.start} and "
                         f"step {steps - 2}, found {len(where)}")
    at = sorted(rng.sample(where, total))
    kinds = [kind for kind in KINDS for _ in range(counts.get(kind, 0))]
    rng.shuffle(kinds)
    faults, startups, rounds = [], 0, 0
    for kind, step in zip(kinds, at, strict=True):
        variant = ""
        down = round(rng.uniform(*DOWN_SECONDS), 1)
        if kind == "stop":
            down = round(rng.uniform(*STOPPED_SECONDS), 1)
        elif kind == "startup":
            variant = ("early", "lease")[startups % 2]
            startups += 1
            down = round(rng.uniform(*EARLY_KILL_SECONDS), 2) if variant == "early" else 0.0
        elif kind == "round":
            variant = ("ending", "lease")[rounds % 2]
            rounds += 1
        elif kind == "twice":
            down = 0.0
        faults.append(Fault(kind, step, down, variant))
    return faults


@dataclass
class Emitter:
    """One trainer process: its training run id, its folder (checkpoint, emits log)."""

    run: str
    folder: Path
    process: subprocess.Popen[bytes] | None = None

    def emits(self) -> list[dict[str, Any]]:
        path = self.folder / "emits.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(line) for line in lines if line.endswith("}")]


@dataclass
class Chaos:
    """The processes of one chaos run under `folder`, and what happened to them."""

    folder: Path
    steps: int
    pace: float
    runs: int = 1  # training runs, one trainer process each
    round_args: list[str] = field(default_factory=lambda: list(ROUND))
    catch_up_seconds: float | None = 10.0  # the serve's catch-up interval (None: its default)
    server: LocalServer = field(init=False)
    store: Store = field(init=False)
    serve: subprocess.Popen[bytes] | None = None
    emitters: list[Emitter] = field(default_factory=list)
    log: list[dict[str, Any]] = field(default_factory=list)  # each fault and its recovery
    fault_problems: list[str] = field(default_factory=list)  # what a fault itself saw fail
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (t, step, pending)
    started_at: float = 0.0
    _spawned: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _serves: int = 0
    _sampling: threading.Event = field(default_factory=threading.Event)
    _sampler: threading.Thread | None = None
    _stopped: bool = False  # the server's process group is SIGSTOPped

    def __post_init__(self) -> None:
        self.server = LocalServer(self.folder / "prefect")
        self.store = Store(self.folder / "store")
        self.outbox = self.folder / "outbox"
        self.emitters = [Emitter(f"run-{chr(ord('a') + i)}", self.folder / f"trainer-{i}")
                         for i in range(self.runs)]

    def env(self) -> dict[str, str]:
        return self.server.env(PYTHONPATH=str(REPO), DYNGEN_OUTBOX=str(self.outbox))

    # ---- processes -------------------------------------------------------------------
    def start(self) -> None:
        rng = random.Random(0)
        self.store.create(DATASET, [arithmetic_task(rng, i, 1, "seed") for i in range(8)])
        self.server.start()
        self.serve = self.spawn_serve()
        wait_for_automation(self.server.api_url, trigger_name(DATASET))
        self.started_at = time.time()
        self._sampler = threading.Thread(target=self._sample, name="chaos-pending",
                                         daemon=True)
        self._sampler.start()
        for emitter in self.emitters:
            self.start_emitter(emitter)

    def serve_command(self) -> list[str]:
        extra = ([] if self.catch_up_seconds is None
                 else ["--catch-up-seconds", f"{self.catch_up_seconds:g}"])
        return [sys.executable, "-m", "dyngen.cli", "--root", str(self.store.root), "serve",
                "--dataset", DATASET, *extra, *self.round_args]

    def spawn_serve(self, log_name: str = "serve.log") -> subprocess.Popen[bytes]:
        """Start a `dyngen serve` of the dataset, its output appended to `log_name`."""
        self._serves += 1
        log = self.folder / log_name
        with open(log, "a") as out:
            out.write(f"\n===== serve #{self._serves} spawned at {time.time():.3f}\n")
        proc = spawn(self.serve_command(), self.env(), log, cwd=REPO)
        self._spawned.append(proc)
        return proc

    def start_emitter(self, emitter: Emitter) -> None:
        emitter.folder.mkdir(parents=True, exist_ok=True)
        emitter.process = spawn(
            [sys.executable, "-c", EMITTER, DATASET, self.server.api_url,
             str(self.store.root), emitter.run, str(self.steps), str(self.pace),
             str(emitter.folder)], self.env(), emitter.folder / "emitter.log", cwd=REPO)
        self._spawned.append(emitter.process)

    def stop(self) -> None:
        """Stop everything this run started, by PID (a SIGSTOPped server is continued)."""
        self._sampling.set()
        if self._sampler is not None:
            self._sampler.join(timeout=10)
        self._continue_server()
        for proc in self._spawned:
            stop(proc)
        self.server.stop()

    def sent_step(self) -> int:
        """The highest step the first trainer has sent (written, kept or queued)."""
        return max((e["step"] for e in self.emitters[0].emits() if e["phase"] == "sent"),
                   default=0)

    def _sample(self) -> None:
        """Count the inbox's pending batch ends every SAMPLE_SECONDS, with the step sent."""
        while not self._sampling.wait(SAMPLE_SECONDS):
            try:
                pending = len(Store(self.store.root).pending(DATASET))
                self.samples.append((time.time(), self.sent_step(), pending))
            except Exception:  # a read racing a commit: the next sample counts
                continue

    # ---- faults ----------------------------------------------------------------------
    def inject(self, fault: Fault, timeout: float) -> None:
        """Wait for the first trainer to reach the fault's step, then inflict it."""
        deadline = time.monotonic() + timeout
        while self.sent_step() < fault.at_step:
            if time.monotonic() > deadline:
                raise AssertionError(f"the trainer never reached step {fault.at_step}; "
                                     f"{self.tail(self.emitters[0].folder / 'emitter.log')}")
            time.sleep(0.05)
        entry: dict[str, Any] = {"kind": fault.kind, "at_step": fault.at_step,
                                 "down": fault.down, "variant": fault.variant,
                                 "killed_at": time.time(), "note": ""}
        getattr(self, f"_fault_{fault.kind}")(fault, entry)
        entry["restarted_at"] = time.time()
        self.log.append(entry)

    def _fault_serve(self, fault: Fault, entry: dict[str, Any]) -> None:
        _kill_group(self.serve)
        time.sleep(fault.down)
        self.serve = self.spawn_serve()

    def _fault_server(self, fault: Fault, entry: dict[str, Any]) -> None:
        _kill_group(self.server.process)
        self.server.process = None
        time.sleep(fault.down)
        self.server.start()

    def _fault_emitter(self, fault: Fault, entry: dict[str, Any]) -> None:
        kills = sum(1 for f in self.log if f["kind"] == "emitter")
        emitter = self.emitters[kills % len(self.emitters)]
        entry["note"] = f"trainer of {emitter.run}"
        _kill_group(emitter.process)
        time.sleep(fault.down)
        self.start_emitter(emitter)

    def _fault_stop(self, fault: Fault, entry: dict[str, Any]) -> None:
        assert self.server.process is not None
        os.killpg(self.server.process.pid, signal.SIGSTOP)
        self._stopped = True
        try:
            time.sleep(fault.down)
        finally:
            self._continue_server()

    def _continue_server(self) -> None:
        if self._stopped and self.server.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.server.process.pid, signal.SIGCONT)
        self._stopped = False

    def _fault_postgres(self, fault: Fault, entry: dict[str, Any]) -> None:
        postgres = self.server.postgres
        if postgres is None or postgres.pid is None:
            entry["note"] = (f"skipped: the server runs on {self.server.database}, not on a "
                             "PostgreSQL of its own")
            return
        pid = postgres.pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # the postmaster alone, as an OOM kill would
        time.sleep(fault.down)
        postgres.start()  # a supervisor's restart: same data, same port
        started = time.monotonic()
        if _answers(self.server.api_url, timeout=60):
            entry["note"] = (f"postmaster {pid} killed; PostgreSQL restarted, the server "
                             f"answered again after {time.monotonic() - started:.1f} s")
            return
        entry["note"] = (f"postmaster {pid} killed; PostgreSQL restarted, the server did not "
                         "answer within 60 s, so it was restarted too")
        self.fault_problems.append(
            f"postgres at step {fault.at_step}: the Prefect server did not answer within 60 s "
            "of its PostgreSQL's restart (restarted)")
        _kill_group(self.server.process)
        self.server.process = None
        self.server.start()

    def _fault_twice(self, fault: Fault, entry: dict[str, Any]) -> None:
        first = self.serve
        log = self.folder / "second-serve.log"
        offset = log.stat().st_size if log.exists() else 0
        started = time.monotonic()
        second = self.spawn_serve("second-serve.log")
        try:
            code = second.wait(timeout=SECOND_SERVE_SECONDS)
        except subprocess.TimeoutExpired:
            code = None
            _kill_group(second)
        took = time.monotonic() - started
        output = log.read_bytes()[offset:].decode(errors="replace").splitlines()
        lines = [line for line in output if line.strip() and not line.startswith("=====")]
        entry["note"] = (f"second serve exited {code} after {took:.1f} s, {len(lines)} "
                         f"line(s): {' | '.join(lines)[:400]}")
        where = f"twice at step {fault.at_step}"
        if code is None:
            self.fault_problems.append(f"{where}: the second serve still ran after "
                                       f"{SECOND_SERVE_SECONDS:.0f} s (killed)")
        elif code == 0:
            self.fault_problems.append(f"{where}: the second serve exited 0: {lines}")
        if len(lines) != 1:
            self.fault_problems.append(f"{where}: the second serve said {len(lines)} lines, "
                                       f"expected one: {lines}")
        if first is None or first.poll() is not None:
            self.fault_problems.append(f"{where}: the first serve is gone (exit "
                                       f"{first.returncode if first else None})")
        elif self._lease_pid() != first.pid:
            self.fault_problems.append(f"{where}: the lease names PID {self._lease_pid()}, "
                                       f"not the first serve's {first.pid}")

    def _fault_startup(self, fault: Fault, entry: dict[str, Any]) -> None:
        _kill_group(self.serve)
        doomed = self.spawn_serve()
        if fault.variant == "early":
            time.sleep(fault.down)
            entry["note"] = f"killed {fault.down} s after its spawn"
        else:
            took = self._wait_for_lease(doomed)
            entry["note"] = (f"killed {took:.1f} s after its spawn, its lease taken" if took
                             is not None else "its lease never appeared; killed after "
                             f"{WAIT_SECONDS:.0f} s")
        _kill_group(doomed)
        self.serve = self.spawn_serve()

    def _fault_round(self, fault: Fault, entry: dict[str, Any]) -> None:
        running = self._wait_for_running_round()
        _kill_group(self.serve)
        notes = [f"killed while run {running['name']} ran" if running
                 else f"no round ran within {WAIT_SECONDS:.0f} s; killed anyway"]
        time.sleep(fault.down)
        ending = self.spawn_serve()
        if fault.variant == "lease" or running is None:
            took = self._wait_for_lease(ending)
            notes.append(f"the next serve killed {took:.1f} s after its spawn, as it took the "
                         "lease" if took is not None else "the next serve never took the lease")
        else:
            took = self._wait_until_ended(running["id"], ending)
            notes.append(f"the next serve killed {took:.1f} s after its spawn, as it ended "
                         "that run" if took is not None else
                         "the next serve never ended that run; killed")
        _kill_group(ending)
        if running:
            notes.append(f"run {running['name']} then {self._run_state(running['id'])}")
        entry["note"] = "; ".join(notes)
        self.serve = self.spawn_serve()

    def _lease_pid(self) -> int | None:
        """The PID of the newest lease of the dataset in the store (None without one)."""
        files = sorted((self.store.root / "_serve" / DATASET).glob("*.json"))
        for path in reversed(files):
            with contextlib.suppress(OSError, ValueError, KeyError):
                return int(json.loads(path.read_text())["pid"])
        return None

    def _wait_for_lease(self, proc: subprocess.Popen[bytes]) -> float | None:
        """Seconds until `proc` holds the dataset's lease; None if it exits or never does."""
        started = time.monotonic()
        while time.monotonic() - started < WAIT_SECONDS and proc.poll() is None:
            if self._lease_pid() == proc.pid:
                return time.monotonic() - started
            time.sleep(0.02)
        return None

    def _wait_for_running_round(self) -> dict[str, Any] | None:
        """A flow run in state Running (waited for), as JSON; None if none ran in time."""
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                running = _flow_runs(self.server.api_url, states=["RUNNING"], limit=1)
                if running:
                    return running[0]
            time.sleep(0.1)
        return None

    def _wait_until_ended(self, run_id: str, proc: subprocess.Popen[bytes]) -> float | None:
        """Seconds until flow run `run_id` is no longer Running (a serve ended it); None if
        `proc` exits or WAIT_SECONDS pass first."""
        started = time.monotonic()
        while time.monotonic() - started < WAIT_SECONDS and proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError, ValueError, IndexError):
                if _flow_runs(self.server.api_url, ids=[run_id])[0]["state_type"] != "RUNNING":
                    return time.monotonic() - started
            time.sleep(0.02)
        return None

    def _run_state(self, run_id: str) -> str:
        try:
            runs = _flow_runs(self.server.api_url, ids=[run_id])
        except (httpx.HTTPError, ValueError) as exc:
            return f"unreadable ({exc})"
        return str(runs[0]["state_name"]) if runs else "not found"

    # ---- healing ---------------------------------------------------------------------
    def heal(self, timeout: float) -> None:
        """Wait, with a bound, for the trainers to finish, every batch end to be covered,
        nothing pending and every flow run ended (runs scheduled ahead aside)."""
        deadline = time.monotonic() + timeout
        while True:
            trainers = [e.run for e in self.emitters if e.process and e.process.poll() is None]
            missing = self._missing()
            pending = self._pending_keys() if not trainers and not missing else None
            open_runs = self._open_runs() if pending == [] else None
            if open_runs == []:
                self._sampling.set()  # healed: the backlog's story is told
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"not healed within {timeout:.0f} s: trainers running {trainers}, "
                    f"not covered {missing[:20]}, pending {pending}, runs not ended "
                    f"{open_runs}\nruns:\n{self.describe_runs()}\n"
                    f"{self.tail(self.folder / 'serve.log')}")
            time.sleep(0.5)

    def expected(self) -> list[tuple[str, int]]:
        """Every (run, step) the trainers send."""
        return [(e.run, s) for e in self.emitters for s in range(1, self.steps + 1)]

    def _missing(self) -> list[tuple[str, int]]:
        covered = {key for _, keys in self.covers() for key in keys}
        return [key for key in self.expected() if key not in covered]

    def _pending_keys(self) -> list[tuple[str, int]]:
        return [b.key for b in Store(self.store.root).pending(DATASET)]

    def _open_runs(self) -> list[str] | None:
        """Flow runs not ended, runs the catch-up schedule has set ahead aside (None when
        the server cannot say)."""
        try:
            runs = _flow_runs(self.server.api_url)
        except (httpx.HTTPError, ValueError):
            return None
        return [f"{r['name']} {r['state_name']}" for r in runs if not _ended_or_ahead(r)]

    def covers(self) -> list[tuple[int, tuple[tuple[str, int], ...]]]:
        """(version, the (run, step) it covers) of every version, oldest first: the store's
        records, nothing else."""
        return [(rec.version, tuple(rec.covers))
                for rec in Store(self.store.root).history(DATASET)]

    def tail(self, path: Path, chars: int = 4000) -> str:
        return (f"{path.name}:\n{path.read_text(errors='replace')[-chars:]}" if path.exists()
                else f"no {path}")

    # ---- what must hold --------------------------------------------------------------
    def problems(self) -> list[str]:
        """Everything the healed run breaks of what must hold (empty: all holds)."""
        found = list(self.fault_problems)
        found += self._coverage_problems()
        pending = self._pending_keys()
        if pending:
            found.append(f"pending in the inbox after healing: {pending}")
        store = Store(self.store.root)
        issues = verify(store, DATASET)
        if issues:
            found.append(f"verify: {issues}")
        cli = subprocess.run([sys.executable, "-m", "dyngen.cli", "--root", str(self.store.root),
                              "verify", DATASET], env=self.env(), cwd=REPO,
                             capture_output=True, text=True, timeout=300)
        if cli.returncode != 0:
            found.append(f"dyngen verify exited {cli.returncode}: {cli.stdout}{cli.stderr}")
        found += self._trainer_problems()
        open_runs = self.settled_runs(RUN_END_SECONDS)
        if open_runs is None:
            found.append("the flow runs are unreadable")
        elif open_runs:
            found.append(f"runs not ended {RUN_END_SECONDS:.0f} s on: {open_runs}")
        return found

    def settled_runs(self, timeout: float) -> list[str] | None:
        """The flow runs not ended (runs set for later aside) once `timeout` seconds pass
        or none is left; None when the server cannot say. A round the catch-up schedule
        started meanwhile ends within moments; a run nothing answers for does not."""
        deadline = time.monotonic() + timeout
        while True:
            open_runs = self._open_runs()
            if open_runs == [] or time.monotonic() > deadline:
                return open_runs
            time.sleep(0.5)

    def _coverage_problems(self) -> list[str]:
        """Each expected (run, step) covered by exactly one version; per run, every version
        covers steps after those of the versions before it."""
        found = []
        by_key: dict[tuple[str, int], list[int]] = {}
        for version, keys in self.covers():
            for key in keys:
                by_key.setdefault(key, []).append(version)
        expected = set(self.expected())
        twice = {k: v for k, v in by_key.items() if len(v) > 1}
        if twice:
            found.append(f"covered by more than one version: {sorted(twice.items())}")
        missing = sorted(expected - set(by_key))
        if missing:
            found.append(f"never covered: {missing}")
        unexpected = sorted(set(by_key) - expected)
        if unexpected:
            found.append(f"covered but never sent: {unexpected}")
        for emitter in self.emitters:
            last, order = 0, []
            for version, keys in self.covers():
                steps = sorted(s for r, s in keys if r == emitter.run)
                if steps:
                    order.append((version, steps))
                    if steps[0] <= last:
                        found.append(f"{emitter.run}: version {version} covers steps {steps} "
                                     f"after step {last} was covered (by versions in order: "
                                     f"{order})")
                    last = max(last, steps[-1])
        return found

    def _trainer_problems(self) -> list[str]:
        """The trainers ended well, recorded every batch end, and left no retry queue."""
        found = []
        for emitter in self.emitters:
            proc = emitter.process
            if proc is None or proc.returncode != 0:
                found.append(f"trainer {emitter.run} exited {proc and proc.returncode}: "
                             f"{self.tail(emitter.folder / 'emitter.log', 2000)}")
            unrecorded = [e["step"] for e in emitter.emits()
                          if e["phase"] == "sent" and e["inbox"] not in ("written", "kept",
                                                                          "queued")]
            if unrecorded:
                found.append(f"trainer {emitter.run}: steps {unrecorded} not recorded in the "
                             "store nor queued for it")
        queue = InboxQueue(self.outbox / "inbox-queue")
        left = queue.pending(self.store.root)
        if left:
            found.append(f"{len(left)} batch ends left in the local retry queue: "
                         f"{[str(p) for p in left[:5]]}")
        refused = [p for p in (queue.folder(self.store.root) / REFUSED_DIR).rglob("*")
                   if p.is_file()]
        if refused:
            found.append(f"{len(refused)} batch ends the store refused, set aside in the retry "
                         f"queue: {[str(p) for p in refused[:5]]}")
        return found

    def describe_runs(self) -> str:
        """Every flow run (name, trigger's run and step, state), those the catch-up
        schedule set for later counted only (for a failure's report)."""
        try:
            runs = _flow_runs(self.server.api_url)
        except (httpx.HTTPError, ValueError) as exc:  # the report must not hide the failure
            return f"(runs unreadable: {exc})"
        lines, ahead = [], 0
        for run in sorted(runs, key=lambda r: r.get("created") or ""):
            if run.get("state_type") not in FINAL and _ended_or_ahead(run):
                ahead += 1
                continue
            trigger = (run.get("parameters") or {}).get("trigger") or {}
            message = ((run.get("state") or {}).get("message") or "")[:160]
            lines.append(f"  {run['name']} run={trigger.get('run')} step={trigger.get('step')} "
                         f"{run['state_name']}: {message}")
        return "\n".join([*lines, f"  and {ahead} runs the catch-up schedule set for later"])

    # ---- the benchmark's figures -----------------------------------------------------
    def first_emits(self) -> dict[tuple[str, int], float]:
        """(run, step) → when its trainer first emitted it (before the store's write)."""
        first: dict[tuple[str, int], float] = {}
        for emitter in self.emitters:
            for e in emitter.emits():
                if e["phase"] == "emit":
                    key = (emitter.run, e["step"])
                    first[key] = min(first.get(key, e["at"]), e["at"])
        return first

    def covered_at(self) -> dict[tuple[str, int], float]:
        """(run, step) → when the version covering it was committed (its `created_at`)."""
        out = {}
        for rec in Store(self.store.root).history(DATASET):
            for key in rec.covers:
                out.setdefault(tuple(key), _epoch(rec.created_at))
        return out

    def windows(self) -> list[tuple[float, float]]:
        """Each fault's window: from its start to the first version committed after it
        ended (its end, when none was)."""
        commits = sorted(_epoch(rec.created_at) for rec in Store(self.store.root).history(DATASET))
        out = []
        for fault in self.log:
            after = [t for t in commits if t >= fault["restarted_at"]]
            fault["recovery"] = (after[0] - fault["restarted_at"]) if after else None
            out.append((fault["killed_at"], after[0] if after else fault["restarted_at"]))
        return out

    def latencies(self) -> tuple[list[float], list[float]]:
        """Emit → covered seconds of the batch ends no fault touched, and of those a fault
        touched (first emitted before its window ended and covered after it began)."""
        clean, touched, _ = self.latency_parts()
        return clean, touched

    def latency_parts(self) -> tuple[list[float], list[float], list[float]]:
        """`latencies`, and for each touched batch end how long it had waited uncovered
        when the first fault that touched it began: a lower bound of what it would have
        waited without that fault (a batch end overdue before any fault is overdue)."""
        first, covered, windows = self.first_emits(), self.covered_at(), self.windows()
        clean, touched, waited = [], [], []
        for key, at in first.items():
            if key not in covered:
                continue
            hits = [start for start, end in windows if at <= end and covered[key] >= start]
            if hits:
                touched.append(covered[key] - at)
                waited.append(max(0.0, min(hits) - at))
            else:
                clean.append(covered[key] - at)
        return clean, touched, waited

    def recoveries(self) -> list[float]:
        """Seconds from each fault's end to the next version committed."""
        self.windows()
        return [f["recovery"] for f in self.log if f.get("recovery") is not None]

    def round_durations(self) -> tuple[list[float], str]:
        """Seconds of each round that committed a version, and where they come from: the
        flow runs' start and end times on the server, else the lineage's stage timings."""
        history = [rec for rec in Store(self.store.root).history(DATASET) if rec.covers]
        ids = {str(rec.lineage.get("flow_run_id")) for rec in history}
        with contextlib.suppress(httpx.HTTPError, ValueError):
            runs = [r for r in _flow_runs(self.server.api_url) if r["id"] in ids
                    and r.get("start_time") and r.get("end_time")]
            if runs:
                return [_epoch(r["end_time"]) - _epoch(r["start_time"]) for r in runs], \
                    "flow runs' start → end"
        timings = [sum(float(v) for v in (rec.lineage.get("timings") or {}).values())
                   for rec in history]
        return [t for t in timings if t > 0], "lineage timings (the round's stages)"

    def pending_report(self) -> dict[str, Any]:
        """The pending count sampled over the run: its maximum; the maxima over the first
        and the second half of the steps; and, for judging growth, the maxima over the two
        halves (by step) of the steady samples: taken while the first trainer was still
        sending (step < N) and outside every fault's window (`steady_*`, each with its
        step range; None for a half without samples)."""
        windows = self.windows()
        half = self.steps / 2
        steady = [s for s in self.samples if s[1] < self.steps
                  and not any(a <= s[0] <= b for a, b in windows)]
        out: dict[str, Any] = {
            "max": max((p for *_, p in self.samples), default=0),
            "first_half": max((p for _, st, p in self.samples if st <= half), default=0),
            "second_half": max((p for _, st, p in self.samples if st > half), default=0),
            "samples": len(self.samples), "steady_samples": len(steady),
            "steady_first": None, "steady_second": None}
        if steady:
            low, high = min(st for _, st, _ in steady), max(st for _, st, _ in steady)
            mid = (low + high) / 2
            for name, part in (("steady_first", [x for x in steady if x[1] <= mid]),
                               ("steady_second", [x for x in steady if x[1] > mid])):
                if part:
                    out[name] = (max(p for *_, p in part), min(x[1] for x in part),
                                 max(x[1] for x in part))
        return out

    def pending_series(self, every: float = 5.0) -> list[tuple[float, int, int]]:
        """(seconds since the trainers started, step sent, the most pending) per `every`
        seconds of samples."""
        buckets: dict[int, tuple[float, int, int]] = {}
        for t, step, pending in self.samples:
            slot = int((t - self.started_at) // every)
            old = buckets.get(slot)
            if old is None or pending > old[2]:
                buckets[slot] = (slot * every, step, pending)
            elif step > old[1]:
                buckets[slot] = (old[0], step, old[2])
        return [buckets[k] for k in sorted(buckets)]


def run_chaos(folder: Path, seed: int, steps: int, counts: dict[str, int], pace: float,
              heal_seconds: float, *, runs: int = 1, round_args: list[str] | None = None,
              catch_up_seconds: float | None = 10.0, quiet_steps: int = 0) -> Chaos:
    """A whole chaos run (`schedule(seed, steps, counts, quiet_steps)`'s faults); the caller
    reads `.problems()` and the figures, then `.stop()`."""
    chaos = Chaos(folder, steps, pace, runs, list(round_args or ROUND), catch_up_seconds)
    try:
        chaos.start()
        for fault in schedule(seed, steps, counts, quiet_steps):
            chaos.inject(fault, timeout=steps * pace * 4 + 300)
        chaos.heal(heal_seconds)
    except BaseException:
        chaos.stop()
        raise
    return chaos


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of `values` (not empty)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def summary(values: list[float]) -> str:
    if not values:
        return "none"
    return (f"median {statistics.median(values):.2f} s, p95 {percentile(values, 0.95):.2f} s "
            f"(n={len(values)})")


def _kill_group(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _flow_runs(api_url: str, states: list[str] | None = None, ids: list[str] | None = None,
               limit: int | None = None) -> list[dict[str, Any]]:
    """The server's flow runs (optionally of these state types or ids), as JSON."""
    runs: list[dict[str, Any]] = []
    query: dict[str, Any] = {}
    if states:
        query["state"] = {"type": {"any_": states}}
    if ids:
        query["id"] = {"any_": ids}
    page = min(limit or 200, 200)
    while True:
        response = httpx.post(f"{api_url}/flow_runs/filter", timeout=30,
                              json={"flow_runs": query, "limit": page, "offset": len(runs),
                                    "sort": "EXPECTED_START_TIME_ASC"})
        response.raise_for_status()
        batch = response.json()
        runs += batch
        if len(batch) < page or (limit is not None and len(runs) >= limit):
            return runs


def _ended_or_ahead(run: dict[str, Any]) -> bool:
    """Whether a flow run ended, or is one its schedule set for later (not yet due)."""
    if run.get("state_type") in FINAL:
        return True
    if run.get("state_type") != "SCHEDULED" or run.get("state_name") != "Scheduled":
        return False
    due = run.get("next_scheduled_start_time") or run.get("expected_start_time")
    return bool(due) and _epoch(due) > time.time() + 1


def _answers(api_url: str, timeout: float) -> bool:
    """Whether the server answers a request that reads its database, within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            _flow_runs(api_url, limit=1)
            return True
        time.sleep(0.5)
    return False


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()

