"""Flows whose recorded parameters hold no storage credential (dyngen.config.secrets).

Prefect stores a flow run's parameters as the caller gave them. A flow made with
`redacting_flow` has Prefect record its `config` and `overrides` with each credential in
their option sections (store.storage_options, the mirror's) replaced by `<redacted>`; the
flow itself gets them as given. A run of a deployment got its parameters from Prefect's
records: `deployment_run` tells the flow so, and the flow refuses credentials there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect import Flow
from prefect.context import FlowRunContext

from dyngen.config.secrets import redact_config, redact_overrides


class RedactingFlow(Flow):
    """A Flow whose parameters Prefect records without storage credentials."""

    def serialize_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        """Prefect's serialization of the parameters, with storage credentials redacted."""
        shown = dict(parameters)
        if "config" in shown:
            shown["config"] = redact_config(shown["config"])
        if "overrides" in shown:
            shown["overrides"] = redact_overrides(shown["overrides"])
        return super().serialize_parameters(shown)

    def with_options(self, **options: Any) -> RedactingFlow:
        """Prefect's copy with other options, still redacting (Prefect's makes a Flow)."""
        copy = super().with_options(**options)
        copy.__class__ = RedactingFlow
        return copy


def redacting_flow(**options: Any) -> Callable[[Callable[..., Any]], RedactingFlow]:
    """`@flow(**options)`, making a RedactingFlow."""
    return lambda fn: RedactingFlow(fn, **options)


def deployment_run() -> bool:
    """Whether the running flow run belongs to a deployment (from its context: no API call)."""
    context = FlowRunContext.get()
    run = context.flow_run if context is not None else None
    return run is not None and run.deployment_id is not None
