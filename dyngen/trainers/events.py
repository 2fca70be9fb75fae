"""The trainer hook: tell Prefect that a training batch ended, never stopping training.

Given the store (`store=`), the batch end is first written into the dataset's inbox there
(dyngen.trainers.inbox_write: one immutable entry per training run and step, its rollouts
in the store; queued locally while the store cannot be reached), and only then is the
event sent: a wake-up for a round, which reads the inbox.

Event scheme (documented in the README; the deployment trigger matches on it):
  event     dyngen.batch.ended
  resource  prefect.resource.id = dyngen.dataset.<name>, dyngen.dataset = <name>
  payload   {"trigger": {"event_id", "step", "metrics", "rollouts", "previous", "run"}}
The trigger mapping is passed unchanged to `generation_round(trigger=...)`, which
validates it; its event id becomes the round's idempotency key. `run` (with a store only)
names the training run whose inbox entry (run, step) the event is about.
`previous` names the batch end sent before it (dyngen.trainers.chain), for step order.
Events go out through `POST /api/events` (the server answers once it has taken them);
one the server cannot take waits in the local outbox (`dyngen.trainers.outbox`) until it can.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from dyngen.errors import ConfigError
from dyngen.server.auth import AUTH_HINT
from dyngen.trainers.chain import linked
from dyngen.trainers.inbox_write import STORE_WAIT_SECONDS, Recorded, record_batch_end
from dyngen.trainers.outbox import (
    FLUSH_BUDGET_SECONDS,
    LOCK_WAIT_SECONDS,
    SEND_TIMEOUT_SECONDS,
    Delivery,
    Outbox,
    Status,
)
from dyngen.trainers.spread import finite

EVENT_NAME = "dyngen.batch.ended"
RESOURCE_PREFIX = "dyngen.dataset."
DATASET_LABEL = "dyngen.dataset"
# The longest an emit can take: the store's write (with a store), waiting for another
# process's delivery, draining a backlog within its budget, and the last batch's request.
# A dead server costs milliseconds.
MAX_EMIT_SECONDS = (STORE_WAIT_SECONDS + LOCK_WAIT_SECONDS + FLUSH_BUDGET_SECONDS
                    + SEND_TIMEOUT_SECONDS)
START_SERVER = "Start the server (`prefect server start` or `dyngen demo --keep-server`) to resume."
LOCAL_API_URL = "http://127.0.0.1:4200/api"  # where `prefect server start` listens
SET_API_URL = (f"Point the trainer at the Prefect server `dyngen serve` uses: export "
               f"PREFECT_API_URL={LOCAL_API_URL} (for `prefect server start` on this machine).")

logger = logging.getLogger(__name__)
_server_down = False  # warn once per outage, not once per batch


def trigger_name(dataset: str | None) -> str:
    """The name of the deployment trigger (automation) for a dataset, or for all."""
    return f"dyngen batch end ({dataset or 'any dataset'})"


def resource_id(dataset: str) -> str:
    """The Prefect resource id of a dataset."""
    return f"{RESOURCE_PREFIX}{dataset}"


def batch_end_payload(step: int, metrics: Mapping[str, float] | None = None,
                      rollouts: str | None = None, event_id: str | None = None,
                      previous: Mapping[str, Any] | None = None,
                      run: str | None = None) -> dict[str, Any]:
    """The event payload: the round's trigger, with an event id to make it idempotent (and
    the batch end sent before it, when there is one; and the training run whose inbox
    entry it is, when it was recorded in the store)."""
    clean = {str(k): float(v) for k, v in (metrics or {}).items() if finite(v)}
    if rollouts is not None and "://" not in str(rollouts):
        # The round runs in another folder (or process) than the trainer: send the path
        # absolute, as the trainer meant it.
        rollouts = os.path.abspath(rollouts)
    trigger = {"event_id": event_id or str(uuid.uuid4()), "step": int(step),
               "metrics": clean, "rollouts": rollouts}
    if previous is not None:
        trigger["previous"] = dict(previous)
    if run is not None:
        trigger["run"] = run
    return {"trigger": trigger}


def batch_end_event(dataset: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """The Prefect event for a batch end, as the JSON the server's `POST /events` takes."""
    from prefect.events import Event

    event = Event(event=EVENT_NAME,
                  resource={"prefect.resource.id": resource_id(dataset),
                            "prefect.resource.name": dataset, DATASET_LABEL: dataset},
                  payload=dict(payload))
    return event.model_dump(mode="json")


def emit_batch_end(dataset: str, step: int, metrics: Mapping[str, float] | None = None,
                   rollouts: Any = None, *, event_id: str | None = None,
                   api_url: str | None = None, store: Any = None,
                   run: str | None = None) -> str | None:
    """Record a batch end of `dataset` and emit `dyngen.batch.ended`; return the event id,
    or None if neither the store nor the server kept it.

    `store` (a root, a `Store`, or a config's store section): the batch end is first
    written into the dataset's inbox there, as training run `run`'s step `step` (`run`:
    else $DYNGEN_RUN, else "default"); `rollouts` (a JSONL file's path, a list of JSON
    values, or a table) are copied into the store, so a round on any host reads them. A
    re-sent (run, step) writes nothing, and its event carries the first one's id. A store
    that cannot be reached keeps the batch end in a local retry queue, written by the next
    emit to that store or by `dyngen emit --flush`. Without `store`, only the event.

    Never raises and never waits more than a few seconds (MAX_EMIT_SECONDS). An event the
    server cannot take now waits in the local outbox (`dyngen.trainers.outbox`) and is
    delivered, in order, by the next emit that reaches the server or by `dyngen emit
    --flush`; its id is returned too. None means it was not kept: no server configured,
    or the outbox is full, and no store recorded it.
    """
    delivery = send_batch_end(dataset, step, metrics, rollouts, event_id=event_id,
                              api_url=api_url, store=store, run=run)
    kept = delivery.status != "dropped" or delivery.inbox in ("written", "kept", "queued")
    return delivery.event_id if kept else None


@dataclass(frozen=True)
class BatchEndDelivery:
    """An emitted event's id and what became of it (see `dyngen.trainers.outbox.Delivery`)."""

    event_id: str
    status: Status
    delivered: int = 0
    pending: int = 0
    reason: str = ""  # why it was not sent (empty when it was)
    # With a store: what became of the batch end there (`Recorded.status`: written, kept,
    # queued or unrecorded), and the training run it is under; empty without a store.
    inbox: str = ""
    run: str | None = None


def send_batch_end(dataset: str, step: int, metrics: Mapping[str, float] | None = None,
                   rollouts: Any = None, *, event_id: str | None = None,
                   api_url: str | None = None, store: Any = None,
                   run: str | None = None) -> BatchEndDelivery:
    """`emit_batch_end`, telling whether the event was sent, queued or dropped, and what
    became of the batch end in the store."""
    event_id = event_id or str(uuid.uuid4())
    if store is None:
        return _send(dataset, step, metrics, rollouts, event_id, api_url)
    try:
        recorded = record_batch_end(store, dataset, run, step, metrics, rollouts, event_id)
    except Exception as exc:  # never expected (it logs its own failures): never raised
        logger.warning("dyngen: batch end of %r step %s not recorded in the store: %s: %s",
                       dataset, step, type(exc).__name__, exc)
        recorded = Recorded("unrecorded", event_id, reason=str(exc))
    if recorded.status != "unrecorded":
        metrics = recorded.metrics
    if not isinstance(rollouts, (str, os.PathLike)):
        rollouts = None  # rows travel in the store only; an event names a file
    sent = _send(dataset, step, metrics, rollouts, recorded.event_id, api_url, recorded)
    return replace(sent, inbox=recorded.status, run=recorded.run)


def _send(dataset: str, step: int, metrics: Mapping[str, float] | None, rollouts: Any,
          event_id: str, api_url: str | None,
          recorded: Recorded | None = None) -> BatchEndDelivery:
    """Send the batch end's event (its trigger naming the run it was recorded under)."""
    global _server_down
    run = recorded.run if recorded is not None else None
    in_store = recorded is not None and recorded.status != "unrecorded"
    try:
        from prefect.settings import PREFECT_API_URL

        url = api_url or PREFECT_API_URL.value()
        if not url:
            _not_sent(dataset, step, "PREFECT_API_URL is not set", kept=False, fix=SET_API_URL,
                      in_store=in_store)
            return BatchEndDelivery(event_id, "dropped")
        outbox = Outbox()
        with linked(outbox.folder(url), dataset, int(step)) as link:
            payload = batch_end_payload(step, metrics, rollouts, event_id, link.previous, run)
            result = outbox.deliver(url, batch_end_event(dataset, payload))
            if result.status != "dropped":  # sent, or on its way: the next one names it
                link.record(event_id, int(step))
    except Exception as exc:  # a trainer must never die because of bookkeeping
        _not_sent(dataset, step, f"{type(exc).__name__}: {exc}", kept=False, in_store=in_store)
        return BatchEndDelivery(event_id, "dropped")
    if result.status == "sent":
        if _server_down:
            logger.warning("dyngen: the Prefect server is reachable again; batch-end events "
                           "resume (%d sent from the outbox)", result.delivered - 1)
            _server_down = False
    elif result.status == "queued":
        # Refused credentials need the setting, not a server start.
        _not_sent(dataset, step, result.reason, kept=True,
                  fix=f"To send it, {AUTH_HINT}." if result.unauthorized else START_SERVER)
    return BatchEndDelivery(event_id, result.status, result.delivered, result.pending,
                            result.reason)


def flush_outbox(api_url: str | None = None) -> Delivery:
    """Deliver the events queued for the server (default: PREFECT_API_URL), in order."""
    from prefect.settings import PREFECT_API_URL

    url = api_url or PREFECT_API_URL.value()
    if not url:
        raise ConfigError("PREFECT_API_URL is not set: expected the address of the Prefect "
                          "server the queued events are for. Set it (e.g. export "
                          f"PREFECT_API_URL={LOCAL_API_URL}) and flush again.")
    return Outbox().deliver(url)


def _not_sent(dataset: str, step: int, why: str, *, kept: bool,
              fix: str = START_SERVER, in_store: bool = False) -> None:
    global _server_down
    if not _server_down:
        what = ("it waits in the outbox and is sent, in order, once the server takes it (the "
                "next emit, or `dyngen emit --flush`)" if kept
                else "the batch end is in the store's inbox, for the next round to cover"
                if in_store else "no generation round runs for it")
        logger.warning("dyngen: batch-end event for dataset %r step %s was not sent: %s. "
                       "Training continues; %s. %s", dataset, step, why, what, fix)
        _server_down = True
    else:
        logger.debug("dyngen: batch-end event for %r step %s not sent: %s", dataset, step, why)
