"""A served round whose process was killed with its `dyngen serve` is ended and run again.

Prefect does not retry a crashed run, and nothing else ends a run whose process is gone:
left Running, it would hold the deployment's concurrency slot (one round at a time) for
ever and every later batch end would wait behind it (what the chaos test found). A later
`dyngen serve` ends such runs (Crashed, its round slot freed) and puts each back to
Scheduled, a few times at most, so its batch end's step is still committed.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from dyngen.round import holders
from dyngen.round.slot import DEAD_RERUNS, RERUNS_LABEL
from dyngen.runtime.serve import round_deployment
from dyngen.runtime.warm_runner import WarmRunner

pytestmark = pytest.mark.usefixtures("prefect_server")


@pytest.fixture
def deployment_id() -> Iterator[Any]:
    """The round's deployment for dataset "dead"; its runs deleted after the test (left
    Scheduled on this worker's server, they would be the next served round's work). Only
    its own: another module's run of that deployment may hold its dataset's round slot."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    deployment_id = round_deployment("dead", {"store": {"root": "unused"}}).apply()
    yield deployment_id
    with get_client(sync_client=True) as client:
        for run in client.read_flow_runs(deployment_filter=DeploymentFilter(
                id=DeploymentFilterId(any_=[deployment_id]))):
            if run.parameters.get("dataset") == "dead":
                client.delete_flow_run(run.id)


def _dead_identity() -> str:
    child = subprocess.Popen(["sleep", "30"])
    identity = holders.process_identity(child.pid)
    child.kill()
    child.wait()
    assert identity is not None and holders.process_is_gone(identity)
    return identity


def _running_run_of_a_dead_process(client: Any, deployment_id: Any, step: int,
                                   reruns: int = 0) -> Any:
    from prefect.states import Running

    run = client.create_flow_run_from_deployment(
        deployment_id, parameters={"dataset": "dead", "trigger": {"step": step}})
    client.set_flow_run_state(run.id, Running(), force=True)
    labels = {holders.PROCESS_LABEL: _dead_identity()}
    if reruns:
        labels[RERUNS_LABEL] = str(reruns)
    client.update_flow_run_labels(run.id, labels)
    return run


def test_a_later_serve_ends_and_reruns_the_runs_of_a_killed_one(deployment_id: Any) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled, Running

    from dyngen.flows.generation_round import generation_round

    runner = WarmRunner(generation_round, round_deployment("dead", {"store": {"root": "unused"}}))
    with get_client(sync_client=True) as client:
        orphan = _running_run_of_a_dead_process(client, deployment_id, 1)
        spent = _running_run_of_a_dead_process(client, deployment_id, 2, reruns=DEAD_RERUNS)
        runner._end_orphans(client, deployment_id)
        again = client.read_flow_run(orphan.id)
        assert again.state.is_scheduled() and again.state.name == "AwaitingRetry"
        assert again.labels[RERUNS_LABEL] == "1" and not again.labels[holders.PROCESS_LABEL]
        states = [s.type.value for s in client.read_flow_run_states(orphan.id)]
        assert states[-2:] == ["CRASHED", "SCHEDULED"]
        # One that has been run again DEAD_RERUNS times already stays Crashed.
        assert client.read_flow_run(spent.id).state.is_crashed()
        # A live process's run is never touched.
        live = client.create_flow_run_from_deployment(deployment_id, parameters={
            "dataset": "dead", "trigger": {"step": 3}})
        client.set_flow_run_state(live.id, Running(), force=True)
        client.update_flow_run_labels(live.id, {holders.PROCESS_LABEL: holders.this_process()})
        runner._end_orphans(client, deployment_id)
        assert client.read_flow_run(live.id).state.is_running()
        client.set_flow_run_state(live.id, Cancelled(), force=True)


def test_a_round_lost_while_giving_its_place_back_is_still_told_dead(deployment_id: Any) -> None:
    """A round that gives its place back to an earlier step labels its run, then puts it
    back to Scheduled; a server lost in between leaves it Running. Its label must still
    name its (gone) process, and go stale once the run runs again in a new process."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    from dyngen.flows.generation_round import generation_round

    runner = WarmRunner(generation_round, round_deployment("dead", {"store": {"root": "unused"}}))
    with get_client(sync_client=True) as client:
        stuck = _running_run_of_a_dead_process(client, deployment_id, 4)
        client.update_flow_run_labels(stuck.id, {
            holders.LEFT_LABEL: str(client.read_flow_run(stuck.id).state_id)})
        moved_on = _running_run_of_a_dead_process(client, deployment_id, 5)
        client.update_flow_run_labels(moved_on.id, {holders.LEFT_LABEL: str(uuid.uuid4())})
        runner._end_orphans(client, deployment_id)
        assert client.read_flow_run(stuck.id).state.name == "AwaitingRetry"
        # Running again in a state it did not leave: its new process answers, not the old.
        assert client.read_flow_run(moved_on.id).state.is_running()
        assert holders.holder_of(client.read_flow_run(moved_on.id)) == ""
        client.set_flow_run_state(moved_on.id, Cancelled(), force=True)
