"""A dataset's rounds commit in the order of their batch ends' steps, whoever runs them.

Prefect hands a pool's runs to workers in no particular order, and its trigger service may
create the runs of batch ends sent back to back in any order. So before it takes its
dataset's slot (flows/round_guard.py), a round looks on the Prefect server for its dataset's
rounds of earlier steps that have not ended (Scheduled, Pending or Running), and waits
until none is left. The state is the server's: it holds for any number of workers on any
hosts.

A waiting round holds no dataset slot, so the earlier round can take it. It may hold a
place the earlier round needs to start at all: a place under the deployment's concurrency
limit, or one of a worker's `--limit` processes. So a round whose earlier step has not
started gives its place back: it puts its own run back to Scheduled, a little after the
earlier one's, and its process exits; a worker runs it again later (a run waiting for an
earlier step that has started stays where it is). After `round.order_wait_seconds` from
its first wait, a round goes on anyway, and says so in its log and its lineage.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from prefect import get_run_logger
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import (
    FlowFilter,
    FlowFilterId,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.client.schemas.sorting import FlowRunSort
from prefect.context import FlowRunContext
from prefect.exceptions import Abort
from prefect.states import Crashed, Scheduled

from dyngen.flows.round_guard import (
    PROCESS_LABEL,
    _process_identity,
    _process_is_gone,
    end_dead_round,
)

POLL_SECONDS = 1.0  # each look reads the flow's unfinished runs: keep the server's load low
SINCE_LABEL = "dyngen.round.order_wait_since"  # when this run first waited (epoch seconds)
GAVE_WAY_LABEL = "dyngen.round.order_gave_way"  # how many times it gave its place back
GIVE_WAY_AFTER_SECONDS = 1.0  # after the earlier run's start time
GIVE_WAY_MAX_SECONDS = 30.0  # the longest a run puts itself back for
EARLIER_RUNS = 200  # the most unfinished runs of the flow read per look
_NOT_ENDED = [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING]
GIVEN_WAY_STATE = "AwaitingEarlierStep"


@dataclass
class StepOrder:
    """How a round kept its dataset's step order: for its log and lineage."""

    waited_seconds: float = 0.0
    gave_way: int = 0  # times it put its run back for an earlier step that had not started
    went_ahead_of: list[int] = field(default_factory=list)  # steps still waiting at the bound

    def lineage(self) -> dict[str, Any] | None:
        """What the version record keeps (None when the round had nothing to wait for)."""
        if not (self.waited_seconds or self.gave_way or self.went_ahead_of):
            return None
        return {"waited_seconds": round(self.waited_seconds, 3), "gave_way": self.gave_way,
                "went_ahead_of": self.went_ahead_of}


def keep_step_order(dataset: str, step: int | None, bound_seconds: float) -> StepOrder:
    """Wait (at most `bound_seconds` from this run's first wait) for the dataset's rounds of
    earlier steps that have not ended; give this run's place back to one not started yet."""
    context = FlowRunContext.get()
    me = context.flow_run if context is not None else None  # as the engine read it: no call
    if me is None or step is None or bound_seconds <= 0:
        return StepOrder()
    logger = get_run_logger()
    with get_client(sync_client=True) as client:
        since = _label_float(me, SINCE_LABEL)
        order = StepOrder(gave_way=int(_label_float(me, GAVE_WAY_LABEL) or 0))
        said = False
        while earlier := _earlier_runs(client, me, dataset, step):
            now = time.time()
            if not said:  # this process waits: a later round can tell if it dies
                since = now if since is None else since
                client.update_flow_run_labels(me.id, {
                    SINCE_LABEL: f"{since:.3f}",
                    PROCESS_LABEL: _process_identity(os.getpid()) or ""})
            order.waited_seconds = now - since
            steps = sorted({_step(run) or 0 for run in earlier})
            if order.waited_seconds >= bound_seconds:
                order.went_ahead_of = steps
                logger.warning(
                    "dataset %r: going on before its earlier step(s) %s, which have not "
                    "ended after %.0f s (round.order_wait_seconds=%g): this round may commit "
                    "out of step order", dataset, steps, order.waited_seconds, bound_seconds)
                return order
            unstarted = [run for run in earlier if run.state and run.state.is_scheduled()]
            if unstarted and me.deployment_id is not None:
                _give_way(client, me, dataset, step, unstarted, order.gave_way)
            if not said:
                logger.info("dataset %r: step %d waits for its earlier step(s) %s to end "
                            "(round.order_wait_seconds=%g)", dataset, step, steps,
                            bound_seconds)
                said = True
            time.sleep(POLL_SECONDS)
    if since is not None:
        order.waited_seconds = time.time() - since
        logger.info("dataset %r: step %d's earlier steps have ended (waited %.1f s)",
                    dataset, step, order.waited_seconds)
    return order


def _earlier_runs(client: SyncPrefectClient, me: FlowRun, dataset: str,
                  step: int) -> list[FlowRun]:
    """The flow's runs of `dataset` with a lower trigger step that have not ended."""
    runs = client.read_flow_runs(
        flow_filter=FlowFilter(id=FlowFilterId(any_=[me.flow_id])),
        flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
            type=FlowRunFilterStateType(any_=_NOT_ENDED))),
        sort=FlowRunSort.EXPECTED_START_TIME_ASC, limit=EARLIER_RUNS)
    earlier = []
    for run in runs:
        other = _step(run)
        if run.id == me.id or other is None or other >= step or \
                (run.parameters or {}).get("dataset") != dataset:
            continue
        if _died_here(client, run, dataset):
            continue
        earlier.append(run)
    return earlier


def _died_here(client: SyncPrefectClient, run: FlowRun, dataset: str) -> bool:
    """Whether `run` is a Running round whose process on this machine is gone (then it is
    marked Crashed): nobody waits for a round that cannot end by itself."""
    identity = str(run.labels.get(PROCESS_LABEL, ""))
    if not (run.state and run.state.is_running() and identity and _process_is_gone(identity)):
        return False
    end_dead_round(client, run, Crashed(
        message=f"its process died before the round of dataset {dataset!r} ended"))
    return True


def _give_way(client: SyncPrefectClient, me: FlowRun, dataset: str, step: int,
              unstarted: list[FlowRun], gave_way: int) -> None:
    """Put this run back to Scheduled, after the earlier runs that have not started, and
    end its process (Prefect's Abort: the engine exits without touching the run again)."""
    latest = max((run.next_scheduled_start_time or run.expected_start_time
                  or datetime.now(timezone.utc)) for run in unstarted)
    # Longer each time, so a run stuck behind one that never starts does not spin.
    pause = min(GIVE_WAY_AFTER_SECONDS * 2 ** gave_way, GIVE_WAY_MAX_SECONDS)
    when = max(latest, datetime.now(timezone.utc)) + timedelta(seconds=pause)
    steps = sorted({_step(run) or 0 for run in unstarted})
    # No process of this run is left to tell about until a worker runs it again.
    client.update_flow_run_labels(me.id, {GAVE_WAY_LABEL: str(gave_way + 1), PROCESS_LABEL: ""})
    get_run_logger().info("dataset %r: step %d gives its place back to earlier step(s) %s, "
                          "which have not started; it runs again from %s", dataset, step,
                          steps, when.isoformat(timespec="seconds"))
    client.set_flow_run_state(me.id, Scheduled(
        scheduled_time=when, name=GIVEN_WAY_STATE,
        message=f"waiting for earlier step(s) {steps} of dataset {dataset!r}"), force=True)
    raise Abort(f"step {step} of dataset {dataset!r} gave way to earlier step(s) {steps}")


def _step(run: FlowRun) -> int | None:
    trigger = (run.parameters or {}).get("trigger")
    step = trigger.get("step") if isinstance(trigger, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _label_float(run: FlowRun, key: str) -> float | None:
    try:
        return float(run.labels[key])
    except (KeyError, TypeError, ValueError):
        return None
