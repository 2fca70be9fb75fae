"""One round per dataset at a time: a slot of the Prefect global concurrency limit
`dyngen-round-<dataset>`, held under a lease that a thread renews.

A round that took the slot records which lease holds it, and who holds it, in a Prefect
variable of the dataset (`holder_record_name`: its flow run, its process, and until when
its lease is renewed), and labels its run with its lease and process. A round that waits
for the slot frees it, by that lease's id (so no live round's slot is ever freed), from a
holder that is over:

- its process on this machine is gone (a SIGKILLed round, or one stopped with its
  `dyngen serve`): a Running holder is also marked Crashed (and run again if served);
- its flow run has ended (Crashed, Failed, Cancelled, Completed) without releasing, or was
  deleted while its process was gone;
- its lease has not been renewed for LAPSE_GRACE_SECONDS past its end: the lease has lapsed,
  whether or not the server's lease sweep runs (a test server's does not: it is ephemeral).

A round waits at most `DYNGEN_ROUND_SLOT_TIMEOUT_SECONDS` (an environment variable, read at
each wait; GUARD_TIMEOUT_SECONDS when unset) and then fails with a TimeoutError that names
the holder and how to free its slot.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import math
import os
import random
import re
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import datetime, timezone
from typing import Any
from uuid import UUID

import httpx
from prefect import get_run_logger
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.actions import VariableCreate, VariableUpdate
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
)
from prefect.client.schemas.objects import ConcurrencyLeaseHolder, FlowRun, State, StateType
from prefect.client.schemas.responses import SetStateStatus
from prefect.exceptions import MissingContextError, ObjectAlreadyExists, ObjectNotFound
from prefect.logging import get_logger
from prefect.runtime import flow_run
from prefect.states import AwaitingRetry, Crashed

from dyngen.round.holders import (
    PROCESS_LABEL,
    holder_labels,
    holder_of,
    process_is_gone,
    this_process,
)
from dyngen.round.run_names import missing_tags

GUARD_TIMEOUT_SECONDS = 3600.0  # the longest a round waits for its slot, unless set:
SLOT_TIMEOUT_ENV = "DYNGEN_ROUND_SLOT_TIMEOUT_SECONDS"

LEASE_SECONDS = 60.0
# How long past its end a lease not renewed counts as lapsed (its holder's clock may differ).
LAPSE_GRACE_SECONDS = LEASE_SECONDS
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
        record = _mark_holder(dataset, held[0])
        with _renewing(held[0], dataset, record):
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
    timeout = slot_timeout()
    deadline = time.monotonic() + timeout
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
                raise TimeoutError(_timeout_message(client, dataset, name, timeout))
            if time.monotonic() >= next_check:
                _release_dead_holders(client, dataset)
                _release_holder_over(client, dataset)
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
            _logger().warning("round %s (flow run %s) died holding the slot of %r; marked "
                              "it Crashed and released its lease", run.name, run.id, dataset)


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
def _renewing(lease_id: UUID, dataset: str, record: dict[str, Any]) -> Iterator[None]:
    """Renew the lease several times per lease period while the round runs, and say so in
    the dataset's holder record (until when the lease holds)."""
    stop = threading.Event()
    logger = _logger()

    def renew() -> None:
        with get_client(sync_client=True) as client:
            while not stop.wait(LEASE_SECONDS / 4):
                try:
                    client.renew_concurrency_lease(lease_id, LEASE_SECONDS)
                    if not stop.is_set():  # the round may have released it meanwhile
                        _write_record(client, dataset,
                                      {**record, "until": time.time() + LEASE_SECONDS})
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


def _mark_holder(dataset: str, lease_id: UUID) -> dict[str, Any]:
    """Record the lease that now holds the dataset's slot and who holds it (a variable,
    which outlives the run), tag the run with its dataset and label it with its lease and
    process, so that a waiting round can find the holder, tell whether it is over, and free
    its slot. Returns the record."""
    record = {"lease": str(lease_id), "flow_run": str(flow_run.id) if flow_run.id else None,
              "process": this_process(), "until": time.time() + LEASE_SECONDS}
    with get_client(sync_client=True) as client:
        _write_record(client, dataset, record)
        if flow_run.id is None:
            return record
        tags = missing_tags(dataset)
        if tags is not None:  # tagged at creation: served for one dataset, or run_round
            client.update_flow_run(flow_run.id, tags=tags)
        client.update_flow_run_labels(flow_run.id, {
            LEASE_LABEL: str(lease_id), **holder_labels()})
    return record


def slot_timeout() -> float:
    """How long a round waits for its dataset's slot: $DYNGEN_ROUND_SLOT_TIMEOUT_SECONDS, or
    GUARD_TIMEOUT_SECONDS when unset."""
    raw = os.environ.get(SLOT_TIMEOUT_ENV, "").strip()
    if not raw:
        return float(GUARD_TIMEOUT_SECONDS)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{SLOT_TIMEOUT_ENV}: expected a number of seconds > 0; found "
                         f"{raw!r}. Set it like {SLOT_TIMEOUT_ENV}=600, or unset it.")
    return seconds


def holder_record_name(dataset: str) -> str:
    """The Prefect variable that records who holds `dataset`'s slot (variable names are
    lowercase letters, digits, '-' and '_': the hash keeps distinct datasets apart)."""
    readable = re.sub(r"[^a-z0-9_-]", "-", dataset.lower())[:100]
    return f"dyngen-round-slot-{readable}-{hashlib.sha256(dataset.encode()).hexdigest()[:12]}"


def _write_record(client: SyncPrefectClient, dataset: str, record: dict[str, Any]) -> None:
    name = holder_record_name(dataset)
    try:
        client.update_variable(VariableUpdate(name=name, value=record))
        return
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code != 404:
            raise
    try:
        client.create_variable(VariableCreate(name=name, value=record))
    except ObjectAlreadyExists:  # created meanwhile by a round that held the slot before
        client.update_variable(VariableUpdate(name=name, value=record))


def _holder_record(client: SyncPrefectClient, dataset: str) -> dict[str, Any] | None:
    """The record of the last round that took the dataset's slot, if any."""
    variable = client.read_variable_by_name(holder_record_name(dataset))
    record = variable.value if variable is not None else None
    if not isinstance(record, dict):
        return None
    with suppress(ValueError):
        UUID(str(record.get("lease")))
        return record
    return None


def _judge_holder(client: SyncPrefectClient, record: dict[str, Any]) -> tuple[str, str | None]:
    """Who holds the slot by `record` (for messages), and why that holder is over (None: it
    may still be working)."""
    run_id, until = record.get("flow_run"), record.get("until")
    process = str(record.get("process") or "")
    run = None
    if run_id:
        with suppress(ObjectNotFound, ValueError):
            run = client.read_flow_run(UUID(str(run_id)))
    if run is not None:
        state = run.state.name if run.state is not None else "no state"
        who = f"flow run {run.name!r} ({run.id}, {state})"
    else:
        who = f"flow run {run_id} (deleted)" if run_id else "a process outside any flow run"
    who += f" under lease {record['lease']}"
    if run is not None and run.state is not None and run.state.is_final():
        return who, "its flow run has ended"
    if process and process_is_gone(process):
        return who, "its process is gone"
    if isinstance(until, (int, float)) and time.time() > until + LAPSE_GRACE_SECONDS:
        return who, (f"its lease has not been renewed for "
                     f"{time.time() - until + LEASE_SECONDS:.0f} s")
    return who, None


def _release_holder_over(client: SyncPrefectClient, dataset: str) -> None:
    """Free the dataset's slot from the lease its record names, if that holder is over and
    the lease still holds (renewing it fails once it was released or revoked)."""
    record = _holder_record(client, dataset)
    if record is None:
        return
    who, over = _judge_holder(client, record)
    if over is None:
        return
    lease = UUID(str(record["lease"]))
    try:
        client.renew_concurrency_lease(lease, LEASE_SECONDS)
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code in (404, 410):
            return  # released already: the slot is held by a round not recorded yet
        raise
    client.release_concurrency_slots_with_lease(lease)
    _logger().warning("the round slot of dataset %r was held by %s, but %s without releasing "
                      "it: released its lease", dataset, who, over)


def _timeout_message(client: SyncPrefectClient, dataset: str, name: str,
                     waited: float) -> str:
    try:
        record = _holder_record(client, dataset)
        found = f"held by {_judge_holder(client, record)[0]}" if record is not None else (
            "held by a lease no round recorded (taken outside dyngen's rounds, or by a "
            "round stopped before it could record it)")
    except Exception as exc:  # the message must not hide the timeout
        found = f"held by a holder that could not be read ({exc})"
    return (f"dataset {dataset!r}: no round slot after {waited:g} s. Expected the round "
            f"holding the Prefect global concurrency limit {name!r} to end or its lease to "
            f"lapse; found it {found}. If that round is still working, wait for it (set "
            f"{SLOT_TIMEOUT_ENV} to wait longer); if no round of {dataset!r} is running, "
            f"free the slot: prefect gcl update {name} --active-slots 0")


def _logger() -> logging.Logger | logging.LoggerAdapter:
    try:  # the run's logger in a flow run, else the module's (a slot taken outside a run)
        return get_run_logger()
    except MissingContextError:
        return get_logger(__name__)
