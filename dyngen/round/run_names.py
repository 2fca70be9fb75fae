"""A round's flow run names and tags: `<dataset>-step-<N>` while it waits for its
dataset's slot, `<dataset>-v<version>` once it knows the version it makes, and the tags
`dyngen`, `dataset:<name>` by which the UI, the slot and the step order find it."""

from __future__ import annotations

from collections.abc import Mapping

from prefect.client.orchestration import get_client
from prefect.runtime import flow_run

from dyngen.errors import DatasetNameError
from dyngen.store.names import validate_name


def waiting_run_name() -> str:
    """A round's run name until it knows its version: `<dataset>-step-<N>` (or `-round`)."""
    params = flow_run.parameters
    trigger = params.get("trigger")
    step = trigger.get("step") if isinstance(trigger, Mapping) else None
    suffix = f"step-{step}" if isinstance(step, int) else "round"
    return f"{params.get('dataset', 'dataset')}-{suffix}"


def name_run(dataset: str, round_no: int) -> None:
    """Name the flow run `<dataset>-v<round>` (one write; the run's tags are already set)."""
    if flow_run.id is None:
        return
    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, name=f"{dataset}-v{round_no}")


def round_tags(dataset: str) -> list[str]:
    """The tags of a round's flow run (none for a name that is not a dataset's)."""
    try:
        return ["dyngen", f"dataset:{validate_name(dataset)}"]
    except DatasetNameError:
        return []


def missing_tags(dataset: str) -> list[str] | None:
    """The run's tags plus the round's, or None when it has them all already."""
    current = set(flow_run.tags)
    wanted = current | set(round_tags(dataset))
    return None if wanted == current else sorted(wanted)
