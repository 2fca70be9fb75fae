"""The trainer hook: tell Prefect that a training batch ended, never stopping training.

Given the store (`store=`), the batch end is first written into the dataset's inbox there
(dyngen.trainers.inbox_write: one immutable entry per training run and step, its rollouts
in the store; queued locally while the store cannot be reached), and only then is the
event sent: a wake-up for a round, which covers every batch end pending in the inbox. It
is sent once, with a short timeout, and never queued: one the server cannot take costs
nothing, as the next round (the serve's catch-up schedule, or the next batch end's event)
covers the batch end all the same.

Without a store (or when the store refused the batch end), the event is the batch end's
only record: one the server cannot take waits in the local outbox
(`dyngen.trainers.outbox`) and is delivered, in order, by the next emit or `dyngen emit
--flush`.

Event scheme (documented in the README; the deployment trigger matches on it):
  event     dyngen.batch.ended
  resource  prefect.resource.id = dyngen.dataset.<name>, dyngen.dataset = <name>
  payload   {"trigger": {"event_id", "step", "metrics", "rollouts", "run"}}
The trigger mapping is passed unchanged to `generation_round(trigger=...)`, which
validates it; its event id becomes the round's idempotency key. `run` (with a store only)
names the training run whose inbox entry (run, step) the event is about.
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
from dyngen.trainers import outbox as _outbox  # its send_events, looked up at each call
from dyngen.trainers.inbox_write import (
    STORE_WAIT_SECONDS,
    Recorded,
    clean_metrics,
    record_batch_end,
    store_metrics,
)
from dyngen.trainers.outbox import (
    FLUSH_BUDGET_SECONDS,
    LOCK_WAIT_SECONDS,
    SEND_TIMEOUT_SECONDS,
    Delivery,
    Outbox,
    SendError,
    Status,
)

EVENT_NAME = "dyngen.batch.ended"
RESOURCE_PREFIX = "dyngen.dataset."
DATASET_LABEL = "dyngen.dataset"
WAKE_TIMEOUT_SECONDS = 1.0  # a wake-up's one request
# The longest an emit can take: the store's write (with a store), then either one
# wake-up request (the store kept the batch end) or the outbox's delivery (no store, or
# one that refused it): waiting for another process's, draining a backlog within its
# budget, and the last batch's request. A dead server costs milliseconds.
MAX_EMIT_SECONDS = STORE_WAIT_SECONDS + max(
    WAKE_TIMEOUT_SECONDS, LOCK_WAIT_SECONDS + FLUSH_BUDGET_SECONDS + SEND_TIMEOUT_SECONDS)
START_SERVER = "Start the server (`prefect server start` or `dyngen demo --keep-server`) to resume."
LOCAL_API_URL = "http://127.0.0.1:4200/api"  # where `prefect server start` listens
SET_API_URL = (f"Point the trainer at the Prefect server `dyngen serve` uses: export "
               f"PREFECT_API_URL={LOCAL_API_URL} (for `prefect server start` on this machine).")
# What becomes of a batch end whose event was not sent, by what became of it in the store.
IN_INBOX = ("the batch end is in the store's inbox, and the next round covers it (the serve's "
            "catch-up schedule, or the next batch end's event)")
COVERED_LATER = {
    "written": IN_INBOX, "kept": IN_INBOX,
    "queued": "the batch end waits in the local retry queue for the store, and the first "
              "round after it is written covers it (the serve's catch-up schedule, or a later "
              "batch end's event)",
}

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
                      run: str | None = None) -> dict[str, Any]:
    """The event payload: the round's trigger, with an event id to make it idempotent (and
    the training run whose inbox entry it is, when it was recorded in the store). Only the
    metrics the store takes are kept (`store_metrics`)."""
    clean, _ = store_metrics(metrics)
    if rollouts is not None and "://" not in str(rollouts):
        # The round runs in another folder (or process) than the trainer: send the path
        # absolute, as the trainer meant it.
        rollouts = os.path.abspath(rollouts)
    trigger = {"event_id": event_id or str(uuid.uuid4()), "step": int(step),
               "metrics": clean, "rollouts": rollouts}
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
    emit to that store or by `dyngen emit --flush`. The event then only wakes a round: it
    is sent once and, if the server cannot take it, not kept (one warning per outage); the
    next round covers the batch end all the same, and the id is returned.

    Without `store` (or when the store refused the batch end), the event is all there is:
    one the server cannot take now waits in the local outbox (`dyngen.trainers.outbox`)
    and is delivered, in order, by the next emit that reaches the server or by `dyngen
    emit --flush`; its id is returned too. None: no server configured, or the outbox is
    full, and no store kept the batch end.

    Never raises and never waits more than a few seconds (MAX_EMIT_SECONDS). Metrics the
    store would refuse (not a finite number, a bool, a name it cannot hold) are left out,
    with or without a store.
    """
    delivery = send_batch_end(dataset, step, metrics, rollouts, event_id=event_id,
                              api_url=api_url, store=store, run=run)
    kept = delivery.status != "dropped" or delivery.inbox in ("written", "kept", "queued")
    return delivery.event_id if kept else None


@dataclass(frozen=True)
class BatchEndDelivery:
    """An emitted event's id and what became of it: sent, queued in the outbox, or dropped
    (not sent and not queued: a wake-up the server did not take, whose batch end the store
    keeps, is dropped too; see `inbox`)."""

    event_id: str
    status: Status
    delivered: int = 0  # events the server took in this call (the outbox's backlog included)
    pending: int = 0  # the server's events left in the outbox (a wake-up never looks: 0)
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
        return _deliver(dataset, step, clean_metrics(metrics, dataset, step), rollouts,
                        event_id, api_url)
    try:
        recorded = record_batch_end(store, dataset, run, step, metrics, rollouts, event_id)
    except Exception as exc:  # never expected (it logs its own failures): never raised
        logger.warning("dyngen: batch end of %r step %s not recorded in the store: %s: %s",
                       dataset, step, type(exc).__name__, exc)
        recorded = Recorded("unrecorded", event_id, reason=str(exc))
    if not isinstance(rollouts, (str, os.PathLike)):
        rollouts = None  # rows travel in the store only; an event names a file
    if recorded.status == "unrecorded":  # the event is the batch end's only record
        sent = _deliver(dataset, step, clean_metrics(metrics, dataset, step), rollouts,
                        recorded.event_id, api_url)
    else:
        sent = _wake(dataset, step, rollouts, recorded, api_url)
    return replace(sent, inbox=recorded.status, run=recorded.run)


def _api_url(api_url: str | None) -> str | None:
    from prefect.settings import PREFECT_API_URL

    return api_url or PREFECT_API_URL.value() or None


def _wake(dataset: str, step: int, rollouts: Any, recorded: Recorded,
          api_url: str | None) -> BatchEndDelivery:
    """Send the event of a batch end the store keeps: once, never queued."""
    event_id = recorded.event_id
    try:
        url = _api_url(api_url)
        if not url:
            _not_sent(dataset, step, "PREFECT_API_URL is not set", fix=SET_API_URL,
                      inbox=recorded.status)
            return BatchEndDelivery(event_id, "dropped", reason="PREFECT_API_URL is not set")
        payload = batch_end_payload(step, recorded.metrics, rollouts, event_id, recorded.run)
        _outbox.send_events(url, [batch_end_event(dataset, payload)],
                            timeout=WAKE_TIMEOUT_SECONDS)
    except Exception as exc:  # a trainer must never die because of a wake-up
        why = str(exc) if isinstance(exc, SendError) else f"{type(exc).__name__}: {exc}"
        unauthorized = isinstance(exc, SendError) and exc.unauthorized
        _not_sent(dataset, step, why, inbox=recorded.status,
                  fix=f"To send it, {AUTH_HINT}." if unauthorized else START_SERVER)
        return BatchEndDelivery(event_id, "dropped", reason=why)
    _reachable("")
    return BatchEndDelivery(event_id, "sent", delivered=1)


def _deliver(dataset: str, step: int, metrics: Mapping[str, float], rollouts: Any,
             event_id: str, api_url: str | None) -> BatchEndDelivery:
    """Send the event through the outbox: queued when the server cannot take it."""
    try:
        url = _api_url(api_url)
        if not url:
            _not_sent(dataset, step, "PREFECT_API_URL is not set", fix=SET_API_URL)
            return BatchEndDelivery(event_id, "dropped", reason="PREFECT_API_URL is not set")
        payload = batch_end_payload(step, metrics, rollouts, event_id)
        result = Outbox().deliver(url, batch_end_event(dataset, payload))
    except Exception as exc:  # a trainer must never die because of bookkeeping
        why = f"{type(exc).__name__}: {exc}"
        _not_sent(dataset, step, why)
        return BatchEndDelivery(event_id, "dropped", reason=why)
    if result.status == "sent":
        _reachable(f" ({result.delivered - 1} sent from the outbox)")
    elif result.status == "queued":
        # Refused credentials need the setting, not a server start.
        _not_sent(dataset, step, result.reason, queued=True,
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


def _not_sent(dataset: str, step: int, why: str, *, queued: bool = False,
              fix: str = START_SERVER, inbox: str = "") -> None:
    """Say once per outage that an event was not sent, and what becomes of its batch end."""
    global _server_down
    if not _server_down:
        what = ("it waits in the outbox and is sent, in order, once the server takes it (the "
                "next emit, or `dyngen emit --flush`)" if queued
                else COVERED_LATER.get(inbox, "no generation round runs for it"))
        logger.warning("dyngen: batch-end event for dataset %r step %s was not sent: %s. "
                       "Training continues; %s. %s", dataset, step, why, what, fix)
        _server_down = True
    else:
        logger.debug("dyngen: batch-end event for %r step %s not sent: %s", dataset, step, why)


def _reachable(detail: str) -> None:
    """Say once that the server takes events again, after an outage was said."""
    global _server_down
    if _server_down:
        logger.warning("dyngen: the Prefect server is reachable again; batch-end events "
                       "resume%s", detail)
        _server_down = False
