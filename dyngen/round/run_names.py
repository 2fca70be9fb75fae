"""A round's flow run names and tags: `<dataset>-step-<N>` (`-catch-up`, `-round`) until it
knows the version it makes, `<dataset>-v<version>` then, and the tags `dyngen`,
`dataset:<name>` by which the UI finds it."""

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
    catch_up = isinstance(trigger, Mapping) and trigger.get("catch_up") is True
    suffix = f"step-{step}" if isinstance(step, int) else "catch-up" if catch_up else "round"
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


def tag_run(dataset: str) -> None:
    """Give the flow run the round's tags it lacks (a run of `dyngen round` has them from
    its start; a deployment's or a direct call's may not): one write, or none."""
    current = set(flow_run.tags)
    wanted = current | set(round_tags(dataset))
    if flow_run.id is None or wanted == current:
        return
    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, tags=sorted(wanted))
