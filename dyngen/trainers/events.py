"""The trainer hook: tell Prefect that a training batch ended, never stopping training.

Event scheme (documented in the README; the deployment trigger matches on it):
  event     dyngen.batch.ended
  resource  prefect.resource.id = dyngen.dataset.<name>, dyngen.dataset = <name>
  payload   {"trigger": {"event_id", "step", "metrics", "rollouts", "previous"}}
The trigger mapping is passed unchanged to `generation_round(trigger=...)`, which
validates it; its event id becomes the round's idempotency key.
`previous` names the batch end sent before it (dyngen.trainers.chain), for step order.
Events go out through `POST /api/events` (the server answers once it has taken them);
one the server cannot take waits in the local outbox (`dyngen.trainers.outbox`) until it can.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dyngen.errors import ConfigError
from dyngen.server.auth import AUTH_HINT
from dyngen.trainers.chain import linked
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
# The longest an emit can take: waiting for another process's delivery, draining a backlog
# within its budget, and the last batch's request. A dead server costs milliseconds.
MAX_EMIT_SECONDS = LOCK_WAIT_SECONDS + FLUSH_BUDGET_SECONDS + SEND_TIMEOUT_SECONDS
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
                      previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The event payload: the round's trigger, with an event id to make it idempotent (and
    the batch end sent before it, when there is one)."""
    clean = {str(k): float(v) for k, v in (metrics or {}).items() if finite(v)}
    if rollouts is not None and "://" not in str(rollouts):
        # The round runs in another folder (or process) than the trainer: send the path
        # absolute, as the trainer meant it.
        rollouts = os.path.abspath(rollouts)
    trigger = {"event_id": event_id or str(uuid.uuid4()), "step": int(step),
               "metrics": clean, "rollouts": rollouts}
    if previous is not None:
        trigger["previous"] = dict(previous)
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
                   rollouts: str | None = None, *, event_id: str | None = None,
                   api_url: str | None = None) -> str | None:
    """Emit `dyngen.batch.ended` for `dataset`; return the event id, or None if dropped.

    Never raises and never waits more than a few seconds. An event the server cannot take
    now waits in the local outbox (`dyngen.trainers.outbox`) and is delivered, in order, by the
    next emit that reaches the server or by `dyngen emit --flush`; its id is returned
    too. None means it was not kept: no server configured, or the outbox is full.
    """
    delivery = send_batch_end(dataset, step, metrics, rollouts, event_id=event_id,
                              api_url=api_url)
    return delivery.event_id if delivery.status != "dropped" else None


@dataclass(frozen=True)
class BatchEndDelivery:
    """An emitted event's id and what became of it (see `dyngen.trainers.outbox.Delivery`)."""

    event_id: str
    status: Status
    delivered: int = 0
    pending: int = 0
    reason: str = ""  # why it was not sent (empty when it was)


def send_batch_end(dataset: str, step: int, metrics: Mapping[str, float] | None = None,
                   rollouts: str | None = None, *, event_id: str | None = None,
                   api_url: str | None = None) -> BatchEndDelivery:
    """`emit_batch_end`, telling whether the event was sent, queued or dropped."""
    global _server_down
    event_id = event_id or str(uuid.uuid4())
    try:
        from prefect.settings import PREFECT_API_URL

        url = api_url or PREFECT_API_URL.value()
        if not url:
            _not_sent(dataset, step, "PREFECT_API_URL is not set", kept=False, fix=SET_API_URL)
            return BatchEndDelivery(event_id, "dropped")
        outbox = Outbox()
        with linked(outbox.folder(url), dataset, int(step)) as link:
            payload = batch_end_payload(step, metrics, rollouts, event_id, link.previous)
            result = outbox.deliver(url, batch_end_event(dataset, payload))
            if result.status != "dropped":  # sent, or on its way: the next one names it
                link.record(event_id, int(step))
    except Exception as exc:  # a trainer must never die because of bookkeeping
        _not_sent(dataset, step, f"{type(exc).__name__}: {exc}", kept=False)
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
              fix: str = START_SERVER) -> None:
    global _server_down
    if not _server_down:
        what = ("it waits in the outbox and is sent, in order, once the server takes it (the "
                "next emit, or `dyngen emit --flush`)" if kept
                else "no generation round runs for it")
        logger.warning("dyngen: batch-end event for dataset %r step %s was not sent: %s. "
                       "Training continues; %s. %s", dataset, step, why, what, fix)
        _server_down = True
    else:
        logger.debug("dyngen: batch-end event for %r step %s not sent: %s", dataset, step, why)
