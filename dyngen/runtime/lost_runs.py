"""Runs for batch ends the Prefect server stored but made no run of (`dyngen serve`).

A batch end reaches the server in two steps: the server stores the event (the trainer's
outbox sends it again until it has), and its trigger service, in memory, turns it into a
run of the round's deployment. A server killed between the two has stored the event and
lost its run: nothing would ever run that step, and the dataset's later steps wait for it
(dyngen.round.step_order) until their bound. So `dyngen serve` looks, every
`CHECK_SECONDS`, for batch ends of its deployment's trigger older than `GRACE_SECONDS`
with no run, and makes each its run, as the trigger would have (what the chaos test
found).

Only where a run of that batch end is still due: the trigger makes a run of every batch
end (threshold 1), the event came after the deployment and its dataset were created, and
the dataset has committed neither its step nor a later one. A run made here and one the
trigger made late would both be rounds of one batch end; the round's idempotency commits
it once. So the grace counts from when the server received the batch end (when its trigger
service sees it), not from when the trainer says it happened: a backlog the trainer's outbox
delivers after an outage, or a trainer's clock behind the server's, is old by `occurred` and
new to the trigger. And the runs are read newest first, as the batch ends are: a look whose
page budget runs out leaves alone the batch ends received before the oldest run it read
(their runs may be among those it did not read).

A batch end whose trigger is larger than a round takes (`MAX_TRIGGER_BYTES`; the trainer
sent thousands of metrics) is given no run: the round would refuse it at once, and over the
Prefect server's parameter limit the server refuses the run (as it refused the trigger's).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import httpx
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterExpectedStartTime,
)
from prefect.client.schemas.sorting import FlowRunSort
from prefect.events.filters import (
    EventFilter,
    EventNameFilter,
    EventOccurredFilter,
    EventOrder,
    EventResourceFilter,
)
from prefect.exceptions import PrefectHTTPStatusError

from dyngen.round import last_step
from dyngen.round.context import MAX_METRICS, MAX_TRIGGER_BYTES
from dyngen.store import Store
from dyngen.trainers.events import DATASET_LABEL, EVENT_NAME, RESOURCE_PREFIX, resource_id

CHECK_SECONDS = 10.0
# The trigger service makes a run within a second or two, more under load: a run made here
# for a batch end it is only slow with is a second round of it (committed once).
GRACE_SECONDS = 30.0
FIRST_LOOKBACK_SECONDS = 24 * 3600.0  # the first look, when `dyngen serve` starts
LOOKBACK_SECONDS = 900.0  # every later one: an outbox backlog arrives with old times
EVENTS_PAGE = 50  # the most the server's events API answers with
EVENT_PAGES = 40  # per look, of events and of runs: a bounded cost on a long run
RUNS_PAGE = 200
RUN_PAGES = 10
RECOVERED_LABEL = "dyngen.round.recovered_from"  # the lost batch end's event id
SERVER_ERRORS = (httpx.HTTPError, PrefectHTTPStatusError, OSError)
logger = logging.getLogger("dyngen.serve")


@dataclass
class LostRuns:
    """The batch ends of one deployment's trigger left without a run, and their runs."""

    deployment_id: UUID
    dataset: str | None  # the trigger's dataset (None: every dataset's batch ends)
    config: Mapping[str, Any]  # the round's config, as the trigger passes it
    store: Mapping[str, Any]  # where the rounds commit (`Store.from_config`'s settings)
    threshold: int = 1
    _next: float = 0.0
    _looked: bool = False
    made: set[str] = field(default_factory=set)  # event ids this process looked at

    def check_now(self, client: SyncPrefectClient) -> int:
        """Look, once `CHECK_SECONDS` have passed since the last look; runs made."""
        if self.threshold != 1 or time.monotonic() < self._next:
            return 0
        self._next = time.monotonic() + CHECK_SECONDS
        try:
            made = self.recover(client)
        except Exception as exc:
            if _server_away(exc):
                raise  # the caller waits for the server
            # Serving goes on; the next look tries again.
            logger.warning("looking for batch ends without a run failed: %s: %s",
                           type(exc).__name__, exc)
            return 0
        self._looked = True
        return made

    def watch(self, client: SyncPrefectClient, stopping: threading.Event) -> None:
        """Look every `CHECK_SECONDS` until `stopping` (beside Prefect's own runner)."""
        while not stopping.wait(CHECK_SECONDS):
            with contextlib.suppress(*SERVER_ERRORS):
                self.check_now(client)

    def recover(self, client: SyncPrefectClient, now: datetime | None = None) -> int:
        """Make a run of each batch end still due that has none; how many were made. `now`:
        the time of the look (default: this process's clock)."""
        now = now or datetime.now(timezone.utc)
        created = client.read_deployment(self.deployment_id).created
        lookback = LOOKBACK_SECONDS if self._looked else FIRST_LOOKBACK_SECONDS
        since = max(now - timedelta(seconds=lookback), created or now)
        until = now - timedelta(seconds=GRACE_SECONDS)
        if since >= until:
            return 0
        # Old enough by the server's clock too: received, not only sent, GRACE_SECONDS ago.
        events = [e for e in self._batch_ends(client, since, until) if _received(e) <= until]
        if not events:
            return 0
        runs_since = min([since, *(_received(e) for e in events)])
        with_runs, read_from = self._event_ids_with_runs(client, runs_since)
        lost = [e for e in events if _event_id(e) and _event_id(e) not in with_runs
                and (read_from is None or _received(e) >= read_from)]
        if not lost:
            return 0
        store = Store.from_config(dict(self.store))
        made = 0
        for event in sorted(lost, key=lambda e: (_dataset(e), _step(e) or 0)):
            if self._still_due(store, event) and self._make_run(client, event):
                made += 1
        return made

    def _batch_ends(self, client: SyncPrefectClient, since: datetime,
                    until: datetime) -> list[Any]:
        resource = (EventResourceFilter(id=[resource_id(self.dataset)]) if self.dataset
                    else EventResourceFilter(id_prefix=[RESOURCE_PREFIX]))
        page = client.read_events(EventFilter(
            occurred=EventOccurredFilter(since=since, until=until),
            event=EventNameFilter(name=[EVENT_NAME]), resource=resource,
            order=EventOrder.DESC), limit=EVENTS_PAGE)
        events = list(page.events)
        for _ in range(EVENT_PAGES - 1):
            if page.next_page is None:
                break
            page = client.read_events_page(str(page.next_page))
            events += page.events
        return events

    def _event_ids_with_runs(self, client: SyncPrefectClient,
                             since: datetime) -> tuple[set[str], datetime | None]:
        """The event ids of the deployment's runs due since a little before `since` (a run
        is due when its trigger made it, or later: put back, or waiting for a retry), newest
        first; and, when the page budget ran out before the oldest, the expected start of the
        oldest run read (a batch end received before it may have its run among those unread).
        """
        runs_of = FlowRunFilter(expected_start_time=FlowRunFilterExpectedStartTime(
            after_=since - timedelta(seconds=GRACE_SECONDS)))
        ids: set[str] = set()
        oldest: datetime | None = None
        for page in range(RUN_PAGES):
            runs = client.read_flow_runs(
                deployment_filter=DeploymentFilter(
                    id=DeploymentFilterId(any_=[self.deployment_id])),
                flow_run_filter=runs_of, sort=FlowRunSort.EXPECTED_START_TIME_DESC,
                limit=RUNS_PAGE, offset=page * RUNS_PAGE)
            for run in runs:
                trigger = (run.parameters or {}).get("trigger")
                if isinstance(trigger, dict) and trigger.get("event_id"):
                    ids.add(str(trigger["event_id"]))
                if run.labels and run.labels.get(RECOVERED_LABEL):
                    ids.add(str(run.labels[RECOVERED_LABEL]))
                if run.expected_start_time is not None:
                    oldest = min(oldest or run.expected_start_time, run.expected_start_time)
            if len(runs) < RUNS_PAGE:
                return ids | self.made, None
        return ids | self.made, oldest

    def _still_due(self, store: Store, event: Any) -> bool:
        """Whether the batch end's round is still to run: its dataset is in the store, was
        created before the event, and has committed neither its step nor a later one."""
        dataset, step = _dataset(event), _step(event)
        if not dataset or step is None:
            return False
        try:
            if store.head_version(dataset) is None:
                return False
            first = store.record(dataset, 0)
        except Exception:  # a name the store refuses, a store not reachable: not ours
            return False
        if datetime.fromisoformat(first.created_at) > event.occurred:
            return False  # an event of an earlier dataset of that name
        last = last_step(store, dataset)
        return last is None or step > last

    def _make_run(self, client: SyncPrefectClient, event: Any) -> bool:
        trigger = (event.payload or {}).get("trigger")
        event_id = _event_id(event)
        if not isinstance(trigger, dict) or event_id is None:
            return False
        self.made.add(event_id)  # made, or refused: looked at once
        parameters = {"dataset": _dataset(event), "trigger": dict(trigger),
                      "config": dict(self.config)}
        too_large = _too_large(parameters)
        if too_large:
            logger.warning("the batch end of dataset %r step %s (event %s) has no run, and none "
                           "is made of it: %s", _dataset(event), _step(event), event_id,
                           too_large)
            return False
        try:
            run = client.create_flow_run_from_deployment(
                self.deployment_id, parameters=parameters,
                idempotency_key=f"dyngen-lost-run:{event_id}",
                labels={RECOVERED_LABEL: event_id})
        except PrefectHTTPStatusError as exc:
            if _server_away(exc):
                self.made.discard(event_id)
                raise
            # Refused as the trigger's own run was (its parameters too large, or not of the
            # flow's schema): the server's answer says why; nothing to make.
            logger.warning("the batch end of dataset %r step %s (event %s) has no run, and "
                           "the server refuses one: %s", _dataset(event), _step(event),
                           event_id, exc.response.text[:300])
            return False
        logger.warning(
            "the batch end of dataset %r step %s (event %s) reached the Prefect server at %s "
            "and has no run %.0f s later (its trigger service lost it in a restart, or is that "
            "far behind); made run %s of it", _dataset(event), _step(event), event_id,
            event.received.isoformat(timespec="seconds") if event.received else "?",
            GRACE_SECONDS, run.name)
        return True


def _server_away(exc: BaseException) -> bool:
    """Whether `exc` says the server is unreachable or failing (not that a request was bad)."""
    if isinstance(exc, PrefectHTTPStatusError):
        return exc.response.status_code >= 500
    return isinstance(exc, SERVER_ERRORS)


def _too_large(parameters: Mapping[str, Any]) -> str | None:
    """Why a run of these parameters cannot be a round (its trigger larger than a round takes,
    or the whole over the Prefect server's limit), or None."""
    from prefect.settings import get_current_settings

    trigger = parameters["trigger"]
    size = len(json.dumps(trigger, default=str))  # as the round measures it
    metrics = trigger.get("metrics")
    found = (f"{len(metrics):,} metrics" if isinstance(metrics, Mapping)
             else f"fields {sorted(map(str, trigger))}")
    fix = ("Send at most a few numbers as a batch end's metrics and rollouts as a file path "
           "(dyngen.trainers.events.emit_batch_end); this batch end's round is not run.")
    if size > MAX_TRIGGER_BYTES:
        return (f"its trigger is {size:,} bytes as JSON ({found}), and a round takes a trigger "
                f"of at most {MAX_TRIGGER_BYTES:,} bytes (at most {MAX_METRICS} metrics) and "
                f"refuses a larger one. {fix}")
    limit = get_current_settings().server.api.max_parameter_size
    total = len(json.dumps(parameters, separators=(",", ":"), default=str).encode())
    if 0 < limit < total:
        return (f"its run's parameters (the dataset, the trigger and the round's config) are "
                f"{total:,} bytes as JSON, and the Prefect server takes at most {limit:,} "
                f"(PREFECT_SERVER_API_MAX_PARAMETER_SIZE). Make the round's config smaller (a "
                f"large value as a file path), or raise the server's limit.")
    return None


def _received(event: Any) -> datetime:
    """When the server received the event (when its trigger service could first see it)."""
    return getattr(event, "received", None) or event.occurred


def _event_id(event: Any) -> str | None:
    trigger = (event.payload or {}).get("trigger")
    found = trigger.get("event_id") if isinstance(trigger, dict) else None
    return str(found) if found else None


def _step(event: Any) -> int | None:
    trigger = (event.payload or {}).get("trigger")
    step = trigger.get("step") if isinstance(trigger, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _dataset(event: Any) -> str:
    return str(event.resource.get(DATASET_LABEL, "") or "")
