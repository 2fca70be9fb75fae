"""A dataset's rounds commit in the order of their batch ends' steps, whoever runs them.

Prefect hands a pool's runs to workers in no particular order, and its trigger service may
create the runs of batch ends sent back to back in any order. So before it takes its
dataset's slot (round/slot.py), a round looks on the Prefect server for its dataset's
rounds of earlier steps that have not ended (Scheduled, Pending or Running), and waits
until none is left. The state is the server's: it holds for any number of workers on any
hosts.

Rounds look at runs, and the run of an earlier batch end may not exist yet: Prefect's trigger
service creates the runs of a burst in any order, and a worker may start a later one before
the earlier one is created. So a batch end names the one its trainer sent before it
(`trigger.previous`, dyngen.trainers.chain), and a round also waits for that one's run to
exist, when its deployment's trigger makes a run of every batch end (a throttled trigger,
`threshold: N`, makes none for most of them) and it was sent within the bound.

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
    FlowRunFilterDeploymentId,
    FlowRunFilterExpectedStartTime,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.client.schemas.sorting import FlowRunSort
from prefect.context import FlowRunContext
from prefect.events.filters import (
    EventFilter,
    EventNameFilter,
    EventOccurredFilter,
    EventResourceFilter,
)
from prefect.events.schemas.automations import EventTrigger, Posture
from prefect.exceptions import Abort
from prefect.states import Crashed, Scheduled

from dyngen.round.context import PreviousEvent, Trigger
from dyngen.round.holders import (
    LEFT_LABEL,
    PROCESS_LABEL,
    holder_labels,
    holder_of,
    process_is_gone,
    this_process,
)
from dyngen.round.slot import end_dead_round
from dyngen.trainers.events import EVENT_NAME, resource_id

POLL_SECONDS = 1.0  # each look reads the flow's unfinished runs: keep the server's load low
SINCE_LABEL = "dyngen.round.order_wait_since"  # when this run first waited (epoch seconds)
GAVE_WAY_LABEL = "dyngen.round.order_gave_way"  # how many times it gave its place back
GIVE_WAY_AFTER_SECONDS = 1.0  # after the earlier run's start time
GIVE_WAY_MAX_SECONDS = 30.0  # the longest a run puts itself back for
EARLIER_RUNS = 200  # the most unfinished runs of the flow read per look
# Where the previous batch end's run is looked for: from its send time (the server's clock
# and the trainer's may differ, and an outbox may deliver late), a page of runs at a time.
PREVIOUS_MARGIN_SECONDS = 300.0
PREVIOUS_PAGES = 10
EVENTS_PAGE = 100  # batch ends of the dataset read per page, looking for the previous one
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


def keep_step_order(dataset: str, trigger: Trigger, bound_seconds: float,
                    store_root: str | None = None) -> StepOrder:
    """Wait (at most `bound_seconds` from this run's first wait) for the dataset's rounds of
    earlier steps that have not ended, and for the previous batch end's run to exist; give
    this run's place back to one not started (or not created) yet. A round of a dataset of
    the same name in another store (`store_root`, where both runs name theirs) is not one
    of them."""
    context = FlowRunContext.get()
    me = context.flow_run if context is not None else None  # as the engine read it: no call
    step = trigger.step
    if me is None or step is None or bound_seconds <= 0:
        return StepOrder()
    logger = get_run_logger()
    with get_client(sync_client=True) as client:
        awaited = _awaited_previous(client, me, trigger.previous, step, bound_seconds)
        since = _label_float(me, SINCE_LABEL)
        order = StepOrder(gave_way=int(_label_float(me, GAVE_WAY_LABEL) or 0))
        said = False
        while True:
            # First whether the previous run exists, then the unfinished runs: read the
            # other way round, a run created in between would be seen by neither.
            if awaited is not None and _run_of(client, me, awaited):
                awaited = None  # it exists: from now on it is one of the earlier runs
            earlier = _earlier_runs(client, me, dataset, step, store_root)
            if not earlier and awaited is None:
                break
            now = time.time()
            if not said:  # this process waits: a later round can tell if it dies
                since = now if since is None else since
                client.update_flow_run_labels(me.id, {
                    SINCE_LABEL: f"{since:.3f}", **holder_labels()})
            order.waited_seconds = now - since
            missing = [awaited.step] if awaited is not None else []
            steps = sorted({_step(run) or 0 for run in earlier} | set(missing))
            if order.waited_seconds >= bound_seconds:
                order.went_ahead_of = steps
                logger.warning(
                    "dataset %r: going on before its earlier step(s) %s, which have not "
                    "ended%s after %.0f s (round.order_wait_seconds=%g): this round may "
                    "commit out of step order", dataset, steps,
                    f" (step {missing[0]}'s run was never created)" if missing else "",
                    order.waited_seconds, bound_seconds)
                return order
            unstarted = [run for run in earlier if run.state and run.state.is_scheduled()]
            if (unstarted or missing) and me.deployment_id is not None:
                _give_way(client, me, dataset, step, unstarted, missing, order.gave_way)
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


def _awaited_previous(client: SyncPrefectClient, me: FlowRun, previous: PreviousEvent | None,
                      step: int, bound_seconds: float) -> PreviousEvent | None:
    """The previous batch end whose run this round waits to exist, if any: one of an
    earlier step, sent within the bound, under a trigger that makes a run of each."""
    if previous is None or previous.step >= step or previous.seconds_before > bound_seconds:
        return None
    # When it reached the server: a batch end sent before the deployment was last applied
    # (`dyngen serve` started, `prefect deploy` run) may have met no trigger, and has no run
    # to wait for. The server's record of it says; else this run's own batch end's arrival,
    # or this run's creation (later by the trigger service's lag), less the gap between.
    sent = _received(client, me, previous)
    return previous if _every_batch_end_runs(client, me, sent) else None


def _received(client: SyncPrefectClient, me: FlowRun, previous: PreviousEvent) -> datetime:
    """When the server received the `previous` batch end (its clock), as near as it tells."""
    created = me.created or datetime.now(timezone.utc)
    mine = ((me.parameters or {}).get("trigger") or {}).get("event_id")
    dataset = (me.parameters or {}).get("dataset")
    own: datetime | None = None
    try:
        page = client.read_events(EventFilter(
            occurred=EventOccurredFilter(since=created - timedelta(
                seconds=previous.seconds_before + PREVIOUS_MARGIN_SECONDS),
                until=created + timedelta(seconds=PREVIOUS_MARGIN_SECONDS)),
            event=EventNameFilter(name=[EVENT_NAME]),
            resource=EventResourceFilter(id=[resource_id(str(dataset))])), limit=EVENTS_PAGE)
        for _ in range(PREVIOUS_PAGES):
            for event in page.events:
                event_id = ((event.payload or {}).get("trigger") or {}).get("event_id")
                if event_id == previous.event_id and event.received is not None:
                    return event.received
                if event_id == mine and event.received is not None:
                    own = event.received
            if page.next_page is None:
                break
            page = client.read_events_page(str(page.next_page))
    except Exception:  # events not readable (an old server, a hiccup): estimate
        pass
    return (own or created) - timedelta(seconds=previous.seconds_before)


def _every_batch_end_runs(client: SyncPrefectClient, me: FlowRun, since: datetime) -> bool:
    """Whether `me` was made by an automation that makes a run of every matching event (a
    reactive trigger with threshold 1), and its deployment was as it is `since`: only then
    is the run of a batch end sent then coming."""
    made_by = me.created_by
    if made_by is None or made_by.type != "AUTOMATION" or made_by.id is None \
            or me.deployment_id is None:
        return False
    try:
        applied = client.read_deployment(me.deployment_id).updated
        automation = client.read_automation(made_by.id)
    except Exception:  # deleted since, or not readable: nothing to count on
        return False
    if applied is None or applied > since:
        return False
    trigger = automation.trigger if automation is not None else None
    return bool(automation is not None and automation.enabled
                and isinstance(trigger, EventTrigger) and trigger.posture == Posture.Reactive
                and trigger.threshold == 1 and not trigger.after)


def _run_of(client: SyncPrefectClient, me: FlowRun, previous: PreviousEvent) -> bool:
    """Whether the server holds a run (in any state) of the `previous` batch end."""
    created = me.created or datetime.now(timezone.utc)
    since = created - timedelta(seconds=previous.seconds_before + PREVIOUS_MARGIN_SECONDS)
    runs_of = FlowRunFilter(
        expected_start_time=FlowRunFilterExpectedStartTime(after_=since),
        deployment_id=FlowRunFilterDeploymentId(any_=[me.deployment_id])
        if me.deployment_id is not None else None)
    for page in range(PREVIOUS_PAGES):
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(id=FlowFilterId(any_=[me.flow_id])),
            flow_run_filter=runs_of, sort=FlowRunSort.EXPECTED_START_TIME_ASC,
            limit=EARLIER_RUNS, offset=page * EARLIER_RUNS)
        if any(_event_id(run) == previous.event_id for run in runs):
            return True
        if len(runs) < EARLIER_RUNS:
            return False
    return False


def _earlier_runs(client: SyncPrefectClient, me: FlowRun, dataset: str,
                  step: int, store_root: str | None = None) -> list[FlowRun]:
    """The flow's runs of `dataset` (in this store) with a lower trigger step that have not
    ended."""
    runs = client.read_flow_runs(
        flow_filter=FlowFilter(id=FlowFilterId(any_=[me.flow_id])),
        flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
            type=FlowRunFilterStateType(any_=_NOT_ENDED))),
        sort=FlowRunSort.EXPECTED_START_TIME_ASC, limit=EARLIER_RUNS)
    earlier = []
    for run in runs:
        other = _step(run)
        if run.id == me.id or other is None or other >= step or \
                (run.parameters or {}).get("dataset") != dataset or \
                not _same_store(_store_root(run), store_root):
            continue
        if _died_here(client, run, dataset):
            continue
        earlier.append(run)
    return earlier


def _died_here(client: SyncPrefectClient, run: FlowRun, dataset: str) -> bool:
    """Whether `run` is a Running round whose process on this machine is gone (then it is
    marked Crashed): nobody waits for a round that cannot end by itself."""
    identity = holder_of(run)
    if not (run.state and run.state.is_running() and identity and process_is_gone(identity)):
        return False
    end_dead_round(client, run, Crashed(
        message=f"its process died before the round of dataset {dataset!r} ended"))
    return True


def _give_way(client: SyncPrefectClient, me: FlowRun, dataset: str, step: int,
              unstarted: list[FlowRun], missing: list[int], gave_way: int) -> None:
    """Put this run back to Scheduled, after the earlier runs that have not started (or
    been created), and end its process (Prefect's Abort: the engine exits without touching
    the run again)."""
    now = datetime.now(timezone.utc)
    latest = max([(run.next_scheduled_start_time or run.expected_start_time or now)
                  for run in unstarted], default=now)
    # Longer each time, so a run stuck behind one that never starts does not spin.
    pause = min(GIVE_WAY_AFTER_SECONDS * 2 ** gave_way, GIVE_WAY_MAX_SECONDS)
    when = max(latest, now) + timedelta(seconds=pause)
    steps = sorted({_step(run) or 0 for run in unstarted} | set(missing))
    # This process answers for the run only while it is still in the state it leaves: if the
    # server is lost before the state below lands, the run stays Running and a later round
    # or serve can tell its process is gone (a label cleared here could not: what the chaos
    # test found); once it runs again, its new process labels it.
    left = client.read_flow_run(me.id).state_id
    client.update_flow_run_labels(me.id, {GAVE_WAY_LABEL: str(gave_way + 1),
                                          PROCESS_LABEL: this_process(), LEFT_LABEL: str(left)})
    get_run_logger().info("dataset %r: step %d gives its place back to earlier step(s) %s, "
                          "which have not started%s; it runs again from %s", dataset, step,
                          steps, " (or been created)" if missing else "",
                          when.isoformat(timespec="seconds"))
    client.set_flow_run_state(me.id, Scheduled(
        scheduled_time=when, name=GIVEN_WAY_STATE,
        message=f"waiting for earlier step(s) {steps} of dataset {dataset!r}"), force=True)
    raise Abort(f"step {step} of dataset {dataset!r} gave way to earlier step(s) {steps}")


def _step(run: FlowRun) -> int | None:
    trigger = (run.parameters or {}).get("trigger")
    step = trigger.get("step") if isinstance(trigger, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _store_root(run: FlowRun) -> str | None:
    """The store root a run's parameters name, if they do."""
    config = (run.parameters or {}).get("config")
    store = config.get("store") if isinstance(config, dict) else None
    root = store.get("root") if isinstance(store, dict) else None
    return root if isinstance(root, str) else None


def _same_store(a: str | None, b: str | None) -> bool:
    """Whether two store roots may be one store: unless both are absolute (a path or a URL)
    and differ (a relative one, or one not named, may be either)."""
    def absolute(root: str | None) -> str | None:
        if root is None:
            return None
        if "://" in root:
            return root.rstrip("/")
        return os.path.normpath(root) if os.path.isabs(root) else None

    first, second = absolute(a), absolute(b)
    return first is None or second is None or first == second


def _event_id(run: FlowRun) -> str | None:
    trigger = (run.parameters or {}).get("trigger")
    return trigger.get("event_id") if isinstance(trigger, dict) else None


def _label_float(run: FlowRun, key: str) -> float | None:
    try:
        return float(run.labels[key])
    except (KeyError, TypeError, ValueError):
        return None
