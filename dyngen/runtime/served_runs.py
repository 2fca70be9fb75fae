"""What `dyngen serve` does with its deployment's runs besides running them.

- `end_left_runs`: at start-up, holding the dataset's lease (dyngen.runtime.serve_lease), a
  serve forces Crashed the runs a killed serve left Pending or Running (Cancelled those left
  Cancelling). No process answers for them any more, and left so they would hold the
  deployment's concurrency slot for ever. They are not run again: the next round covers
  every batch end they would have (the store's inbox says what is pending).
- `superseded`: a catch-up run, or the wake-up of a batch end in the store, due while a
  later run of its dataset is due too does nothing the later one does not; such runs (the
  events of a trainer faster than rounds, a backlog the schedule made while nothing
  served) are taken out of the queue instead of run one after another: waiting rounds
  collapse into one, so the backlog stays bounded however fast batch ends come.
- `pause_catch_up`: on a clean exit, the serve's catch-up schedule is turned off, so runs
  do not pile up while nothing serves; the next serve turns it on again.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any
from uuid import UUID

import httpx
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterExpectedStartTime,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.client.schemas.sorting import FlowRunSort
from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError
from prefect.states import Cancelled, Completed, Crashed

SERVER_ERRORS = (httpx.HTTPError, PrefectHTTPStatusError, OSError)
CATCH_UP_SLUG = "dyngen-catch-up"  # the slug of a served deployment's catch-up schedule
PAGE = 200
logger = logging.getLogger("dyngen.serve")


def is_catch_up(run: Any) -> bool:
    """Whether a run is a catch-up round (its trigger `{"catch_up": true}`)."""
    trigger = (run.parameters or {}).get("trigger")
    return isinstance(trigger, dict) and trigger.get("catch_up") is True


def is_ours(run: Any, dataset: str | None) -> bool:
    """Whether a run of the deployment is this serve's to answer for: of its dataset (of
    any, serving every dataset), which its lease gives it alone."""
    return dataset is None or (run.parameters or {}).get("dataset") == dataset


def supersedable(run: Any) -> bool:
    """Whether a later round does everything this run would: a catch-up run, or the
    wake-up of a batch end in the store's inbox (its trigger names its training run). A
    run of an event sent without a store is its batch end's only record: never."""
    trigger = (run.parameters or {}).get("trigger")
    return is_catch_up(run) or isinstance(trigger, dict) and trigger.get("run") is not None


def superseded(due: Iterable[Any]) -> list[Any]:
    """Of runs due (by expected start), those a later due run of the same dataset makes
    pointless: that round starts after their batch ends were written (each was written
    before its event, which made the run) and covers everything pending."""
    runs = list(due)
    later: set[Any] = set()
    out = []
    for run in reversed(runs):
        dataset = (run.parameters or {}).get("dataset")
        if supersedable(run) and dataset in later:
            out.append(run)
        later.add(dataset)
    return out[::-1]


def drop(client: SyncPrefectClient, runs: Iterable[Any]) -> int:
    """Take superseded runs out of the queue: a catch-up run is deleted (it records
    nothing), a wake-up run ends Completed saying which run covers its batch end. How many
    were."""
    dropped = 0
    for run in runs:
        try:
            if is_catch_up(run):
                client.delete_flow_run(run.id)
            else:
                client.set_flow_run_state(run.id, Completed(
                    name="Superseded", message="a later round of its dataset, due after "
                    "it, covers its batch end (every round covers all that is pending)"),
                    force=True)
            dropped += 1
        except ObjectNotFound:
            continue
    return dropped


def end_left_runs(client: SyncPrefectClient, deployment_id: UUID, dataset: str | None) -> int:
    """End the runs a killed serve left unfinished and drop superseded catch-up runs; once,
    at start-up, by the serve holding the lease. How many runs were ended."""
    ended = 0
    for run in deployment_runs(client, deployment_id, [StateType.PENDING, StateType.RUNNING,
                                             StateType.CANCELLING]):
        if not is_ours(run, dataset):
            continue
        if run.state is not None and run.state.is_cancelling():
            state = Cancelled(message="cancelled while no `dyngen serve` ran it; the next "
                                      "serve of its dataset ended it at start-up")
        else:
            state = Crashed(message=(
                f"left {run.state.name if run.state else 'unfinished'} by a `dyngen serve` "
                "that was killed with its round; the next serve of its dataset ended it at "
                "start-up (the next round covers what it would have)"))
        client.set_flow_run_state(run.id, state, force=True)
        logger.warning("flow run %s (%s): %s", run.name, run.id, state.message)
        ended += 1
    now = datetime.now(timezone.utc)
    due = [r for r in deployment_runs(client, deployment_id, [StateType.SCHEDULED], before=now)
           if is_ours(r, dataset)]
    dropped = drop(client, superseded(due))
    if dropped:
        logger.warning("dropped %d runs due at start-up behind a newer one of their dataset "
                       "(which covers what they would)", dropped)
    return ended


def pause_catch_up(deployment_name: str, dataset: str | None,
                   wait_seconds: float = 3.0) -> None:
    """Turn the deployment's catch-up schedule of `dataset` off (a clean exit), waiting at
    most `wait_seconds` (a server that is down is not waited for). Other schedules (a
    user's own) are left as they are."""
    def pause() -> None:
        with get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name(deployment_name)
            for schedule in client.read_deployment_schedules(deployment.id):
                if schedule.active and schedule.slug == CATCH_UP_SLUG and \
                        (schedule.parameters or {}).get("dataset") == dataset:
                    # Its parameters restated: Prefect 3.9 clears what an update omits.
                    client.update_deployment_schedule(deployment.id, schedule.id,
                                                      active=False,
                                                      parameters=schedule.parameters)

    def guarded() -> None:
        try:
            pause()
        except (*SERVER_ERRORS, ObjectNotFound) as exc:
            logger.info("could not turn the catch-up schedule off: %s", exc)

    # In this thread's context: Prefect's settings (the server serve talks to) are a
    # context variable, which a new thread would otherwise see as at import.
    thread = threading.Thread(target=contextvars.copy_context().run, args=(guarded,),
                              name="dyngen-pause-catch-up", daemon=True)
    thread.start()
    thread.join(wait_seconds)


def deployment_runs(client: SyncPrefectClient, deployment_id: UUID, states: list[StateType],
                    before: datetime | None = None, limit: int | None = None) -> list[Any]:
    """The deployment's runs in `states` (due before `before`), by expected start: all of
    them, or the first `limit`."""
    found: list[Any] = []
    while limit is None or len(found) < limit:
        want = PAGE if limit is None else min(PAGE, limit - len(found))
        page = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=states)),
                expected_start_time=FlowRunFilterExpectedStartTime(before_=before)
                if before else None),
            sort=FlowRunSort.EXPECTED_START_TIME_ASC, limit=want, offset=len(found))
        found += page
        if len(page) < want:
            break
    return found
