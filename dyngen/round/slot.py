"""One round per dataset at a time: a slot of the Prefect global concurrency limit
`dyngen-round-<dataset>`, held under a lease that a thread renews.

A SIGKILLed round cannot release its slot and stays Running on the server; its lease
lapses after LEASE_SECONDS (the server's minimum) plus the server's lease sweep. A waiting
round on the same machine does not wait for that: the holder's run is labelled with its
lease and process, and a holder whose process is gone is marked Crashed and its lease
released, by id, so no live round's slot is ever freed.
"""

from __future__ import annotations

import contextvars
import random
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import datetime, timezone
from uuid import UUID

import httpx
from prefect import get_run_logger
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
)
from prefect.client.schemas.objects import ConcurrencyLeaseHolder, FlowRun, State, StateType
from prefect.client.schemas.responses import SetStateStatus
from prefect.exceptions import ObjectAlreadyExists
from prefect.runtime import flow_run
from prefect.states import AwaitingRetry, Crashed

from dyngen.round.holders import PROCESS_LABEL, holder_labels, holder_of, process_is_gone
from dyngen.round.run_names import missing_tags

GUARD_TIMEOUT_SECONDS = 3600.0

LEASE_SECONDS = 60.0
GUARD_POLL_SECONDS = 0.25
DEAD_HOLDER_CHECK_SECONDS = 2.0
LEASE_LABEL = "dyngen.round.lease"
RERUNS_LABEL = "dyngen.round.dead_reruns"  # times the round was run again after its process died
DEAD_RERUNS = 3
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Limits this process created or found, per API address: later rounds skip the upsert.
_LIMITS_CREATED: set[tuple[str, str]] = set()


@contextmanager
def dataset_slot(dataset: str) -> Iterator[None]:
    """One round per dataset at a time, across processes and machines (a Prefect limit)."""
    held: list[UUID] = []  # the slot's lease, once the server has granted it
    try:
        _acquire_slot(dataset, held)
        _mark_holder(dataset, held[0])
        with _renewing(held[0]):
            yield
    finally:
        if held:
            try:
                with get_client(sync_client=True) as client:
                    client.release_concurrency_slots_with_lease(held[0])
            except Exception as exc:  # the round's outcome stands; the lease lapses
                get_run_logger().warning("could not release the round's concurrency lease "
                                         "(it lapses within %.0f s): %s", LEASE_SECONDS, exc)


def _acquire_slot(dataset: str, held: list[UUID] | None = None) -> UUID:
    """Wait for the dataset's slot, freeing it meanwhile from holders that died here; the
    lease is also appended to `held` as soon as the server grants it."""
    held = [] if held is None else held
    name = f"dyngen-round-{dataset}"
    holder = ConcurrencyLeaseHolder(type="flow_run", id=flow_run.id) if flow_run.id else None
    deadline = time.monotonic() + GUARD_TIMEOUT_SECONDS
    next_check = time.monotonic() + GUARD_POLL_SECONDS
    with get_client(sync_client=True) as client:
        known = (str(client.api_url), name)
        if known not in _LIMITS_CREATED:
            _create_limit(client, name)
        while True:
            try:
                # A round stopped (SIGTERM, Ctrl-C) while the server grants its slot stops
                # once the lease is in `held`, which dataset_slot then releases.
                with _signals_held():
                    body = client.increment_concurrency_slots_with_lease(
                        [name], 1, "concurrency", LEASE_SECONDS, holder).json()
                    held.append(UUID(body["lease_id"]))
                if known in _LIMITS_CREATED and not body["limits"]:
                    # The limit is gone (deleted, or a fresh server at the same address):
                    # the lease holds nothing, so create the limit and acquire again.
                    client.release_concurrency_slots_with_lease(held.pop())
                    _LIMITS_CREATED.discard(known)
                    _create_limit(client, name)
                    continue
                _LIMITS_CREATED.add(known)
                return held[-1]
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code != 423:  # 423 Locked: another round holds it
                    raise
            if time.monotonic() > deadline:
                raise TimeoutError(f"another round of dataset {dataset!r} held {name!r} for "
                                   f"over {GUARD_TIMEOUT_SECONDS:.0f} s; see its flow run")
            if time.monotonic() >= next_check:
                _release_dead_holders(client, dataset)
                next_check = time.monotonic() + DEAD_HOLDER_CHECK_SECONDS
            time.sleep(random.uniform(0.5, 1.0) * GUARD_POLL_SECONDS)


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGTERM and SIGINT while the block runs, then deliver them to the handlers in
    place (Prefect's turn them into exceptions). Python runs signal handlers in the main
    thread only, so elsewhere nothing needs holding."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}
    if any(handler is None for handler in previous.values()):
        yield  # a handler installed outside Python: it cannot be put back
        return
    for sig in _STOP_SIGNALS:
        signal.signal(sig, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum in caught:
            signal.raise_signal(signum)


def _create_limit(client: SyncPrefectClient, name: str) -> None:
    try:
        client.upsert_global_concurrency_limit_by_name(name, 1)
    except ObjectAlreadyExists:  # the upsert is not atomic: another round created it
        client.upsert_global_concurrency_limit_by_name(name, 1)


def _release_dead_holders(client: SyncPrefectClient, dataset: str) -> None:
    """Mark Crashed the Running rounds of `dataset` whose process died, and free their slot.

    Running → Crashed is accepted once, so of several waiters exactly one releases.
    """
    runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
        tags=FlowRunFilterTags(all_=[f"dataset:{dataset}"]),
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING]))))
    for run in runs:
        identity = holder_of(run)
        if not run.labels.get(LEASE_LABEL) or run.id == flow_run.id or not identity \
                or not process_is_gone(identity):
            continue
        crashed = Crashed(message="its process died while holding the round slot of "
                                  f"dataset {dataset!r}; a later round freed the slot")
        if end_dead_round(client, run, crashed):
            get_run_logger().warning("round %s (flow run %s) died holding the slot of %r; "
                                     "marked it Crashed and released its lease", run.name,
                                     run.id, dataset)


def end_dead_round(client: SyncPrefectClient, run: FlowRun, state: State) -> bool:
    """Move a round whose process is gone to a final `state`, free its round slot, and run
    it again (`rerun_dead_round`).

    Only the caller whose state change is accepted releases the lease and reruns, so of
    several callers (waiting rounds, the serve process) exactly one does.
    """
    if client.set_flow_run_state(run.id, state).status != SetStateStatus.ACCEPT:
        return False
    release_round_slot(client, run)
    rerun_dead_round(client, run)
    return True


def rerun_dead_round(client: SyncPrefectClient, run: FlowRun) -> bool:
    """Put a deployment's round whose process died back to Scheduled (AwaitingRetry), at
    most DEAD_RERUNS times: its worker or `dyngen serve` runs the same flow run again, and
    its trigger's key makes it land once if it had committed before it died.

    Without this the round of that batch end never runs (Prefect does not retry a crashed
    run): its step is never committed. A round run in a process of its own (run_round) has
    no one to run it again: its caller sees the failure.
    """
    count = str(run.labels.get(RERUNS_LABEL) or "0")
    reruns = int(count) if count.isdigit() else DEAD_RERUNS
    if run.deployment_id is None or reruns >= DEAD_RERUNS:
        return False
    client.update_flow_run_labels(run.id, {RERUNS_LABEL: str(reruns + 1), PROCESS_LABEL: "",
                                           LEASE_LABEL: ""})
    client.set_flow_run_state(run.id, AwaitingRetry(
        scheduled_time=datetime.now(timezone.utc),
        message=f"its process died; run again ({reruns + 1} of {DEAD_RERUNS})"), force=True)
    return True


def release_round_slot(client: SyncPrefectClient, run: FlowRun) -> None:
    """Free the round slot `run` holds, if any (its lease is named in its labels)."""
    lease = run.labels.get(LEASE_LABEL)
    if lease:
        with suppress(httpx.HTTPStatusError):  # released or lapsed already
            client.release_concurrency_slots_with_lease(UUID(str(lease)))


@contextmanager
def _renewing(lease_id: UUID) -> Iterator[None]:
    """Renew the lease several times per lease period while the round runs."""
    stop = threading.Event()
    logger = get_run_logger()

    def renew() -> None:
        with get_client(sync_client=True) as client:
            while not stop.wait(LEASE_SECONDS / 4):
                try:
                    client.renew_concurrency_lease(lease_id, LEASE_SECONDS)
                except Exception as exc:  # the store's optimistic commit still protects data
                    logger.warning("could not renew the round's concurrency lease: %s", exc)

    # The copied context carries Prefect's settings (API URL) and run context to the thread.
    thread = threading.Thread(target=contextvars.copy_context().run, args=(renew,),
                              name=f"dyngen-lease-{lease_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def _mark_holder(dataset: str, lease_id: UUID) -> None:
    """Tag the run with its dataset and label it with its lease and process, so that a
    waiting round can find it, tell whether it died, and free its slot."""
    if flow_run.id is None:
        return
    with get_client(sync_client=True) as client:
        tags = missing_tags(dataset)
        if tags is not None:  # tagged at creation: served for one dataset, or run_round
            client.update_flow_run(flow_run.id, tags=tags)
        client.update_flow_run_labels(flow_run.id, {
            LEASE_LABEL: str(lease_id), **holder_labels()})
