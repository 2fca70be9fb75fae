"""The trainer hook: tell Prefect that a training batch ended, never stopping training.

Event scheme (documented in the README; the deployment trigger matches on it):
  event     dyngen.batch.ended
  resource  prefect.resource.id = dyngen.dataset.<name>, dyngen.dataset = <name>
  payload   {"trigger": {"event_id", "step", "metrics", "rollouts"}}
The trigger mapping is passed unchanged to `generation_round(trigger=...)`, which
validates it; its event id becomes the round's idempotency key.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Mapping
from typing import Any

EVENT_NAME = "dyngen.batch.ended"
RESOURCE_PREFIX = "dyngen.dataset."
DATASET_LABEL = "dyngen.dataset"
HEALTH_TIMEOUT_SECONDS = 2.0
DRAIN_TIMEOUT_SECONDS = 5.0

logger = logging.getLogger(__name__)
_server_down = False  # warn once per outage, not once per batch


def trigger_name(dataset: str | None) -> str:
    """The name of the deployment trigger (automation) for a dataset, or for all."""
    return f"dyngen batch end ({dataset or 'any dataset'})"


def resource_id(dataset: str) -> str:
    """The Prefect resource id of a dataset."""
    return f"{RESOURCE_PREFIX}{dataset}"


def batch_end_payload(step: int, metrics: Mapping[str, float] | None = None,
                      rollouts: str | None = None, event_id: str | None = None) -> dict[str, Any]:
    """The event payload: the round's trigger, with an event id to make it idempotent."""
    clean = {str(k): float(v) for k, v in (metrics or {}).items()
             if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    return {"trigger": {"event_id": event_id or str(uuid.uuid4()), "step": int(step),
                        "metrics": clean, "rollouts": rollouts}}


def emit_batch_end(dataset: str, step: int, metrics: Mapping[str, float] | None = None,
                   rollouts: str | None = None, *, event_id: str | None = None,
                   api_url: str | None = None) -> str | None:
    """Emit `dyngen.batch.ended` for `dataset`; return the event id, or None if not sent.

    Never raises: with the Prefect server unreachable it logs one warning per outage and
    returns within a few seconds, so a training loop goes on.
    """
    global _server_down
    try:
        from prefect.events import emit_event
        from prefect.events.worker import EventsWorker
        from prefect.settings import PREFECT_API_URL, temporary_settings

        url = api_url or PREFECT_API_URL.value()
        if not url:
            return _not_sent(dataset, step, "PREFECT_API_URL is not set")
        reachable, why = _healthy(url)
        if not reachable:
            return _not_sent(dataset, step, f"the Prefect server at {url} is unreachable ({why})")
        payload = batch_end_payload(step, metrics, rollouts, event_id)
        # A worker already running in this process may be bound to another server: flush
        # and stop it, so the one started below sends to `url`.
        _drain_quietly(EventsWorker)
        with temporary_settings(updates={PREFECT_API_URL: url}):
            emit_event(
                event=EVENT_NAME,
                resource={"prefect.resource.id": resource_id(dataset),
                          "prefect.resource.name": dataset, DATASET_LABEL: dataset},
                payload=payload,
            )
            # Events are sent by a background worker; waiting for it here (milliseconds on
            # a reachable server) means "returned an id" also means "delivered".
            _drain_quietly(EventsWorker)
    except Exception as exc:  # a trainer must never die because of bookkeeping
        return _not_sent(dataset, step, f"{type(exc).__name__}: {exc}")
    if _server_down:
        logger.warning("dyngen: the Prefect server is reachable again; batch-end events resume")
        _server_down = False
    return str(payload["trigger"]["event_id"])


def _drain_quietly(worker: Any) -> None:
    """Flush and stop Prefect's event workers (which log every drain as a warning)."""
    worker_log = logging.getLogger("EventsWorker")
    level = worker_log.level
    worker_log.setLevel(logging.ERROR)
    try:
        worker.drain_all(timeout=DRAIN_TIMEOUT_SECONDS)
    finally:
        worker_log.setLevel(level)


def _healthy(url: str) -> tuple[bool, str]:
    import httpx

    try:
        response = httpx.get(f"{url.rstrip('/')}/health", timeout=HEALTH_TIMEOUT_SECONDS)
    except httpx.HTTPError as exc:
        return False, type(exc).__name__
    return response.status_code == 200, f"HTTP {response.status_code}"


def _not_sent(dataset: str, step: int, why: str) -> None:
    global _server_down
    if not _server_down:
        logger.warning("dyngen: batch-end event for dataset %r step %s was not sent: %s. "
                       "Training continues; no generation round runs for it. Start the server "
                       "(`prefect server start` or `dyngen demo --keep-server`) to resume.",
                       dataset, step, why)
        _server_down = True
    else:
        logger.debug("dyngen: batch-end event for %r step %s not sent: %s", dataset, step, why)
    return None
