"""Run a served deployment's scheduled flow runs in processes forked from a warm one.

Prefect's runner (`prefect.serve`) starts every run in a fresh interpreter, which imports
Prefect, datasets and the round again: 1.5-2 s before the round begins. Here a fork server
(`multiprocessing`'s "forkserver") imports the flow's module once; each run is a child
forked from it, running the flow run through Prefect's own engine (`run_flow`), so it
starts in tens of milliseconds and is still an ordinary, recorded flow run with its
deployment, tasks, logs, artifacts and heartbeats. Runs are claimed in the order Prefect
expects them to start, within the deployment's own concurrency limit (ENQUEUE): Prefect
records and wakes, the store decides what each round covers.

Each run keeps its own process, so what happens to it cannot take the serve process down:
- a child that dies (a crash, a kill, an exit) before its run is final leaves the run forced
  Crashed, saying so, which frees the deployment's concurrency slot; it is not run again:
  the next round covers what it would have;
- a child still running after `max_round_seconds` is stopped (SIGTERM, then SIGKILL) and
  its run TimedOut (Failed);
- a run cancelled from the UI or CLI has its child stopped the same way, and ends Cancelled;
- at start-up, the runs a killed serve left unfinished are ended; and, always, catch-up
  and wake-up runs made pointless by a later one are dropped (dyngen.runtime.served_runs).
Code is imported when serving starts: restart `dyngen serve` after changing it.

Why a runner of dyngen's own beside Prefect's: `--isolation fork` is `dyngen serve`'s
default and a flag users rely on, and a round starting in milliseconds rather than seconds
is most of a served round's latency (emit -> commit, benchmarks/trigger_latency.py). It
keeps to Prefect's rules (the deployment's concurrency limit, its states) and decides
nothing; if the benchmark stops showing the difference, `--isolation process` is Prefect's
runner as is.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from uuid import UUID

from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
)
from prefect.client.schemas.objects import State, StateType
from prefect.deployments.runner import RunnerDeployment
from prefect.exceptions import Abort
from prefect.flows import Flow
from prefect.states import Cancelled, Crashed, Failed, Pending
from prefect.utilities.engine import propose_state_sync

from dyngen.runtime.served_runs import SERVER_ERRORS as _SERVER_ERRORS
from dyngen.runtime.served_runs import deployment_runs, drop, end_left_runs, superseded

logger = logging.getLogger("dyngen.serve")

# Reporting to the server as the deployment's poller (once in a while) keeps it Ready in
# the UI; that call also writes, so the frequent polls are plain reads.
READY_SECONDS = 10.0
SHUTDOWN_GRACE_SECONDS = 15.0
REFUSED_WAIT_SECONDS = 1.0  # between claims the concurrency limit refuses
WAITING_RUNS = 50  # the oldest runs due, read at each poll
KILL_GRACE_SECONDS = 10.0
# What Prefect imports only once a flow runs: imported once in the fork server instead.
RUN_MODULES = ("prefect.task_engine", "prefect.concurrency.sync",
               "prefect.utilities.visualization", "anyio._backends._asyncio")


@dataclass
class _Child:
    """A forked process running one flow run."""

    process: Any  # multiprocessing's forkserver Process
    flow_run_id: UUID
    deadline: float  # then SIGTERM; once stopping, then SIGKILL
    ending: State | None = None  # the final state dyngen serve gave the run


class WarmRunner:
    """Poll one deployment for scheduled runs and run each in a child of a warm process."""

    def __init__(self, flow: Flow[..., Any], deployment: RunnerDeployment,
                 poll_seconds: float = 0.2, max_round_seconds: float = 3600.0,
                 preload: tuple[str, ...] = (), dataset: str | None = None) -> None:
        self.deployment = deployment
        # The runs this serve answers for at start-up (dyngen.runtime.served_runs.is_ours):
        # those of its dataset (None: every dataset), which its lease gives it alone.
        self.dataset = dataset
        # While our runs fill the deployment's concurrency limit, claiming another is
        # refused and re-queued for later (ENQUEUE): wait and claim it the moment one ends.
        limit = deployment.concurrency_limit
        self.limit: int | None = getattr(limit, "limit", limit)
        # Children find the flow by name in the module the fork server imported.
        self.flow_ref = (flow.fn.__module__, flow.fn.__name__)
        self.poll_seconds = poll_seconds
        self.max_round_seconds = max_round_seconds
        self.context = multiprocessing.get_context("forkserver")
        # fork_server_exit first: its exit handler must run after every other one.
        self.context.set_forkserver_preload(["dyngen.runtime.fork_server_exit",
                                             self.flow_ref[0], __name__, *RUN_MODULES,
                                             *preload])
        self.children: dict[UUID, _Child] = {}
        self.stopping = threading.Event()
        self._server_down = False
        self._claim_after = 0.0  # after a refusal, when to ask for the slot again

    def serve(self) -> None:
        """Register the deployment (with its triggers) and run its runs until SIGINT/SIGTERM.

        A server that is down (or goes down while it starts) is waited for: a `dyngen serve`
        restarted during an outage must not exit (what the chaos test found)."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self.stopping.set())
        deployment_id = self._while_down(self.deployment.apply)
        if deployment_id is None:
            return  # stopped before the server came back
        warm = self.context.Process(target=time.sleep, args=(0,))  # starts the fork server
        warm.start()
        warm.join()
        print(f"dyngen: serving deployment {self.deployment.flow_name}/{self.deployment.name}"
              f" ({deployment_id}), runs forked from a warm process", flush=True)
        self._while_down(lambda: self._serve_runs(deployment_id))

    def _while_down(self, call: Callable[[], Any]) -> Any:
        """`call()`, again each second while the server cannot be reached (None if stopped)."""
        while not self.stopping.is_set():
            try:
                result = call()
                self._report_server(up=True)
                return result
            except _SERVER_ERRORS as exc:
                self._report_server(up=False, error=exc)
                self.stopping.wait(1.0)
        return None

    def _serve_runs(self, deployment_id: UUID) -> None:
        next_ready = 0.0
        left_ended = False
        with get_client(sync_client=True) as client:
            while not self.stopping.is_set():
                try:
                    if not left_ended:  # once: this serve holds the lease now
                        end_left_runs(client, deployment_id, self.dataset)
                        left_ended = True
                    if time.monotonic() >= next_ready:
                        client.get_scheduled_flow_runs_for_deployments([deployment_id],
                                                                       limit=1)
                        next_ready = time.monotonic() + READY_SECONDS
                    running = self._watch_children(client)
                    self._start_due_runs(client, deployment_id,
                                         None if self.limit is None else self.limit - running)
                    self._report_server(up=True)
                except _SERVER_ERRORS as exc:
                    self._report_server(up=False, error=exc)
                    self.stopping.wait(1.0)
                self.stopping.wait(self.poll_seconds)
            self._shut_down(client)

    def _start_due_runs(self, client: SyncPrefectClient, deployment_id: UUID,
                        room: int | None) -> None:
        """Claim and start the deployment's due runs, at most `room` of them (None: all),
        in the order Prefect expects them to start.

        A run refused for a full concurrency limit (ENQUEUE) is put back as Scheduled for
        later; a refusal stops the claiming, so no run overtakes one waiting for the slot.
        A catch-up or wake-up run with a later run of its dataset due is dropped, not run:
        the later round covers everything pending (dyngen.runtime.served_runs.superseded).
        """
        if time.monotonic() < self._claim_after:
            return
        runs = deployment_runs(client, deployment_id, [StateType.SCHEDULED],
                               before=datetime.now(timezone.utc), limit=WAITING_RUNS)
        pointless = {r.id for r in superseded(r for r in runs if r.id not in self.children)}
        if pointless:
            drop(client, (r for r in runs if r.id in pointless))
        for run in runs:
            if run.id in self.children or run.id in pointless:
                continue
            if room is not None and room <= 0:
                return
            # Pending claims the run; a full concurrency limit answers with a later
            # Scheduled state instead: the run waits, and so do the runs after it.
            try:
                claimed = propose_state_sync(client, Pending(), flow_run_id=run.id)
            except Abort:  # another process claimed it, or it was deleted
                continue
            if not claimed.is_pending():  # the slot is taken (a run not of this process?)
                self._claim_after = time.monotonic() + REFUSED_WAIT_SECONDS
                return
            process = self.context.Process(target=execute_flow_run,
                                           args=(*self.flow_ref, str(run.id)),
                                           name=f"dyngen-run-{run.id}")
            process.start()
            self.children[run.id] = _Child(process, run.id,
                                           time.monotonic() + self.max_round_seconds)
            room = None if room is None else room - 1

    def _watch_children(self, client: SyncPrefectClient) -> int:
        """Stop children past their deadline or cancelled; end the runs of those gone.
        Return how many runs of ours are not final yet (they hold deployment slots)."""
        live = [c for c in self.children.values() if c.process.is_alive()]
        states = {r.id: r.state for r in client.read_flow_runs(flow_run_filter=FlowRunFilter(
            id=FlowRunFilterId(any_=[c.flow_run_id for c in live])))} if live else {}
        cancelling = {i for i, state in states.items() if state and state.is_cancelling()}
        for child in live:
            if child.ending is None and child.flow_run_id in cancelling:
                self._stop(child, Cancelled(
                    message="cancelled; dyngen serve stopped the round's process"))
            elif child.ending is None and time.monotonic() > child.deadline:
                self._stop(child, Failed(name="TimedOut", message=(
                    f"the round ran for over {self.max_round_seconds:.0f} s (dyngen serve "
                    "--max-round-seconds); dyngen serve stopped its process")))
            elif child.ending is not None and time.monotonic() > child.deadline:
                child.process.kill()  # it ignored SIGTERM for KILL_GRACE_SECONDS
        for child in [c for c in self.children.values() if not c.process.is_alive()]:
            self._end_run(client, child)
            del self.children[child.flow_run_id]
        # A child lives on briefly after its run ends (Prefect's heartbeat thread, events).
        return sum(1 for i, state in states.items()
                   if i in self.children and not (state and state.is_final()))

    def _stop(self, child: _Child, state: State) -> None:
        """Stop a child with SIGTERM, which lets its round end on the way out (SIGKILL
        follows after KILL_GRACE_SECONDS); its run ends in `state`."""
        child.ending = state
        child.deadline = time.monotonic() + KILL_GRACE_SECONDS
        logger.warning("flow run %s: %s", child.flow_run_id, state.message)
        child.process.terminate()

    def _end_run(self, client: SyncPrefectClient, child: _Child) -> None:
        """Leave the run of a finished child in a final state (which frees the deployment's
        concurrency slot: Prefect releases it on any final state, a forced one too)."""
        run = client.read_flow_run(child.flow_run_id)
        final = run.state is not None and run.state.is_final()
        if child.ending is not None:
            # Stopped by us: the state we meant, not the Crashed its engine reported on
            # SIGTERM (unless it finished by itself first).
            if not final or run.state.is_crashed():
                client.set_flow_run_state(run.id, child.ending, force=True)
            return
        if final or run.state is not None and run.state.is_scheduled():
            return  # ended, or put back by Prefect (a retry, a concurrency refusal)
        state = Crashed(message=(
            f"the round's process exited with code {child.process.exitcode} before its flow "
            "run finished; it is not run again: the next round covers what it would have"))
        client.set_flow_run_state(run.id, state, force=True)
        logger.warning("flow run %s (%s): %s", run.name, run.id, state.message)

    def _shut_down(self, client: SyncPrefectClient) -> None:
        """Give running rounds a moment to end, then kill them and end their runs."""
        deadline = time.monotonic() + SHUTDOWN_GRACE_SECONDS
        for child in self.children.values():
            child.process.join(max(0.0, deadline - time.monotonic()))
            if child.process.is_alive():
                child.process.kill()
                child.process.join(5)
            try:
                self._end_run(client, child)
            except _SERVER_ERRORS as exc:
                logger.warning("could not end flow run %s: %s", child.flow_run_id, exc)

    def _report_server(self, up: bool, error: BaseException | None = None) -> None:
        """One warning per outage, one line when the server answers again."""
        if not up and not self._server_down:
            logger.warning("the Prefect server is unreachable (%s); retrying", error)
        elif up and self._server_down:
            logger.warning("the Prefect server is reachable again")
        self._server_down = not up


def drain_prefect_workers(timeout: float) -> None:
    """Deliver the events (task runs, assets) and logs Prefect's background workers hold:
    before a process ends without Prefect's exit hooks, or the server they are for stops."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    EventsWorker.drain_all(timeout=timeout)
    APILogWorker.drain_all(timeout=timeout)


def execute_flow_run(module: str, name: str, flow_run_id: str) -> None:
    """In a forked child: run one flow run through Prefect's engine, as a worker would."""
    from prefect.engine import handle_engine_signals
    from prefect.flow_engine import run_flow

    flow = getattr(importlib.import_module(module), name)
    try:
        with handle_engine_signals(UUID(flow_run_id)), get_client(sync_client=True) as client:
            run = client.read_flow_run(UUID(flow_run_id))
            run_flow(flow, flow_run=run, return_type="state")
    finally:
        drain_prefect_workers(timeout=30)  # a forked child ends with os._exit
