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
import os
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
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
from prefect.client.schemas.objects import ConcurrencyLeaseHolder, StateType
from prefect.client.schemas.responses import SetStateStatus
from prefect.exceptions import ObjectAlreadyExists
from prefect.runtime import flow_run
from prefect.states import Crashed

GUARD_TIMEOUT_SECONDS = 3600.0

LEASE_SECONDS = 60.0
GUARD_POLL_SECONDS = 0.25
DEAD_HOLDER_CHECK_SECONDS = 2.0
LEASE_LABEL = "dyngen.round.lease"
PROCESS_LABEL = "dyngen.round.process"
_DEAD = ("Z", "X")  # /proc states of a process that has exited (zombie, dead)


@contextmanager
def round_guard(dataset: str) -> Iterator[None]:
    """One round per dataset at a time, across processes and machines (a Prefect limit)."""
    lease_id = _acquire_slot(dataset)
    try:
        label_run(dataset, None, {LEASE_LABEL: str(lease_id),
                                   PROCESS_LABEL: _process_identity(os.getpid()) or ""})
        with _renewing(lease_id):
            yield
    finally:
        try:
            with get_client(sync_client=True) as client:
                client.release_concurrency_slots_with_lease(lease_id)
        except Exception as exc:  # the round's outcome stands; the lease lapses on its own
            get_run_logger().warning("could not release the round's concurrency lease (it "
                                     "lapses within %.0f s): %s", LEASE_SECONDS, exc)


def _acquire_slot(dataset: str) -> UUID:
    """Wait for the dataset's slot, freeing it meanwhile from holders that died here."""
    name = f"dyngen-round-{dataset}"
    holder = ConcurrencyLeaseHolder(type="flow_run", id=flow_run.id) if flow_run.id else None
    deadline = time.monotonic() + GUARD_TIMEOUT_SECONDS
    next_check = time.monotonic() + GUARD_POLL_SECONDS
    with get_client(sync_client=True) as client:
        try:
            client.upsert_global_concurrency_limit_by_name(name, 1)
        except ObjectAlreadyExists:  # the upsert is not atomic: another round created it
            client.upsert_global_concurrency_limit_by_name(name, 1)
        while True:
            try:
                response = client.increment_concurrency_slots_with_lease(
                    [name], 1, "concurrency", LEASE_SECONDS, holder)
                return UUID(response.json()["lease_id"])
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


def _release_dead_holders(client: SyncPrefectClient, dataset: str) -> None:
    """Mark Crashed the Running rounds of `dataset` whose process died, and free their slot.

    Running → Crashed is accepted once, so of several waiters exactly one releases.
    """
    runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
        tags=FlowRunFilterTags(all_=[f"dataset:{dataset}"]),
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING]))))
    for run in runs:
        lease = run.labels.get(LEASE_LABEL)
        if not lease or run.id == flow_run.id or not _process_is_gone(
                str(run.labels.get(PROCESS_LABEL, ""))):
            continue
        crashed = Crashed(message="its process died while holding the round slot of "
                                  f"dataset {dataset!r}; a later round freed the slot")
        if client.set_flow_run_state(run.id, crashed).status == SetStateStatus.ACCEPT:
            client.release_concurrency_slots_with_lease(UUID(str(lease)))
            get_run_logger().warning("round %s (flow run %s) died holding the slot of %r; "
                                     "marked it Crashed and released its lease", run.name,
                                     run.id, dataset)


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


def _process_identity(pid: int) -> str | None:
    """`<boot id>:<pid namespace>/<pid>/<start time>`: one process of one machine, ever.

    None where /proc cannot tell (not Linux, or no such live process).
    """
    machine, stat = _machine(), _proc_stat(pid)
    if machine is None or stat is None or stat[0] in _DEAD:
        return None
    return f"{machine}/{pid}/{stat[1]}"


def _process_is_gone(identity: str) -> bool:
    """True only if `identity` names a process of this machine that no longer runs."""
    machine, _, rest = identity.partition("/")
    pid, _, started = rest.partition("/")
    if not pid.isdigit() or machine != _machine():
        return False  # another machine (or unknown): its lease lapses on its own
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, owned by another user
    stat = _proc_stat(int(pid))
    # A zombie has died; a different start time means the pid now names another process.
    return stat is not None and (stat[0] in _DEAD or stat[1] != started)


def _machine() -> str | None:
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}:{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks after boot) of a process, from /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()  # the command name may hold spaces and ')'
    return fields[0], fields[19]


def label_run(dataset: str, round_no: int | None,
               labels: dict[str, str] | None = None) -> None:
    """Name the flow run after the dataset and round, and tag (and label) it."""
    if flow_run.id is None:
        return
    name = f"{dataset}-v{round_no}" if round_no is not None else None
    with get_client(sync_client=True) as client:
        current = client.read_flow_run(flow_run.id)
        tags = sorted(set(current.tags) | {f"dataset:{dataset}", "dyngen"})
        client.update_flow_run(flow_run.id, name=name, tags=tags)
        if labels:
            client.update_flow_run_labels(flow_run.id, labels)
