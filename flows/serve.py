"""Serve the generation round with its event trigger from one process (`dyngen serve`).

The same deployment as in prefect.yaml, for users without a work pool: a batch-end
event for a dataset becomes a run of `generation_round` with the event's trigger; one
round runs at a time and later ones wait their turn (ENQUEUE).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from prefect import serve
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.deployments.runner import RunnerDeployment
from prefect.events import DeploymentEventTrigger

from dyngen.events import DATASET_LABEL, EVENT_NAME, RESOURCE_PREFIX, resource_id, trigger_name
from dyngen.store.names import validate_name
from flows.generation_round import generation_round

DEPLOYMENT_NAME = "on-batch-end"

# Templates render missing fields as empty values rather than dropping the run: the flow
# then fails with a message saying what was missing, which an operator can see.
TRIGGER_PARAMETERS: dict[str, Any] = {
    "dataset": f"{{{{ event.resource.get('{DATASET_LABEL}', '') }}}}",
    # Rendered to JSON text at run time, then parsed: the flow gets the payload's mapping.
    "trigger": {"__prefect_kind": "json", "value": {
        "__prefect_kind": "jinja", "template": "{{ event.payload.get('trigger', {}) | tojson }}"}},
}


def batch_end_trigger(dataset: str | None = None, config: dict[str, Any] | None = None,
                      threshold: int = 1) -> DeploymentEventTrigger:
    """Fire on `dyngen.batch.ended` for one dataset (or all), every `threshold` events."""
    match = {"prefect.resource.id": resource_id(validate_name(dataset)) if dataset
             else f"{RESOURCE_PREFIX}*"}
    return DeploymentEventTrigger(
        name=trigger_name(dataset),
        expect={EVENT_NAME}, match=match, threshold=threshold,
        # Counting N batch ends needs a window; a day covers any sane batch interval.
        within=timedelta(days=1) if threshold > 1 else timedelta(0),
        parameters={**TRIGGER_PARAMETERS, "config": config or {}},
    )


def round_deployment(dataset: str | None = None, config: dict[str, Any] | None = None,
                     every_n_batches: int = 1) -> RunnerDeployment:
    """The event-triggered deployment of generation_round, one run at a time."""
    return generation_round.to_deployment(
        name=DEPLOYMENT_NAME,
        triggers=[batch_end_trigger(dataset, config, every_n_batches)],
        concurrency_limit=ConcurrencyLimitConfig(
            limit=1, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE),
        parameters={"config": config or {}},
        tags=["dyngen"] + ([f"dataset:{dataset}"] if dataset else []),
        description="A dyngen generation round, triggered by training batch-end events.",
    )


def serve_rounds(dataset: str | None = None, config: dict[str, Any] | None = None,
                 every_n_batches: int = 1) -> None:
    """Serve the deployment until interrupted (Ctrl-C / SIGTERM)."""
    # Not paused on shutdown: events that arrive while nothing serves become scheduled runs
    # that wait for the next `dyngen serve`, instead of being refused by a paused deployment.
    serve(round_deployment(dataset, config, every_n_batches), print_starting_message=True,
          pause_on_shutdown=False)
