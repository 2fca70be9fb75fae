"""A batch end the Prefect server stored and made no run of is given its run by serve.

The server stores an event, then its trigger service (in memory) makes the run: a server
killed in between keeps the event and loses the run, and the dataset's later steps wait
for that step's round until their bound (what the chaos benchmark found: steps 70 and
83-100 of seed 7 never ran). Here the trigger is paused while batch ends arrive, which
leaves the server in that same state, and `dyngen serve`'s look (LostRuns) must make the
runs still due, and only those, once each.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dyngen.runtime import lost_runs
from dyngen.runtime.lost_runs import RECOVERED_LABEL, LostRuns
from dyngen.runtime.serve import round_deployment
from dyngen.store import Store
from dyngen.trainers.events import send_batch_end, trigger_name

pytestmark = pytest.mark.usefixtures("prefect_server")
DATASET = "lost"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Any, dict[str, Any]]]:
    """The round's deployment for DATASET, its trigger paused; its runs deleted after."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    config = {"store": {"root": str(tmp_path / "store")}}
    deployment_id = round_deployment(DATASET, config).apply()
    with get_client(sync_client=True) as client:
        (automation,) = client.read_automations_by_name(trigger_name(DATASET))
        client.pause_automation(automation.id)
    try:
        yield deployment_id, config
    finally:
        with get_client(sync_client=True) as client:
            client.resume_automation(automation.id)
            for run in client.read_flow_runs(deployment_filter=DeploymentFilter(
                    id=DeploymentFilterId(any_=[deployment_id]))):
                client.delete_flow_run(run.id)


def _stored(client: Any, event_ids: set[str], timeout: float = 30.0) -> None:
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    from dyngen.trainers.events import EVENT_NAME, resource_id

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        page = client.read_events(EventFilter(
            event=EventNameFilter(name=[EVENT_NAME]),
            resource=EventResourceFilter(id=[resource_id(DATASET)])), limit=50)
        seen = {((e.payload or {}).get("trigger") or {}).get("event_id") for e in page.events}
        if event_ids <= seen:
            return
        time.sleep(0.2)
    raise AssertionError(f"the server did not store the events {event_ids - seen}")


def test_serve_makes_the_runs_of_stored_batch_ends_that_have_none_once_each(
        served: tuple[Any, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    from dyngen.store.location import store_settings

    deployment_id, config = served
    monkeypatch.setattr(lost_runs, "GRACE_SECONDS", 0.0)
    # A batch end of an earlier dataset of that name (before the store's dataset existed).
    earlier = send_batch_end(DATASET, 7).event_id
    time.sleep(0.05)
    store = Store(config["store"]["root"])
    store.create(DATASET, [{"prompt": "seed", "answer": "1"}])
    store.append(DATASET, [{"prompt": "round of step 2", "answer": "2"}],
                 lineage={"trigger": {"event_id": "committed", "step": 2}})
    sent = {step: send_batch_end(DATASET, step, {"score": 0.5}).event_id
            for step in (1, 2, 3, 4)}
    # One whose run the server refuses, as it refused the trigger's (parameters over 512 KB).
    huge = send_batch_end(DATASET, 5, {f"m{i:06d}": 0.5 for i in range(50_000)}).event_id
    assert all(s for s in sent.values())
    with get_client(sync_client=True) as client:
        _stored(client, {earlier, huge, *sent.values()})
        look = LostRuns(deployment_id, DATASET, config, store_settings(config["store"]))
        # Steps 3 and 4: 1 is behind step 2, 2 is committed, 5's run is refused.
        assert look.recover(client) == 2
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(
            id=DeploymentFilterId(any_=[deployment_id])))
        by_step = {run.parameters["trigger"]["step"]: run for run in runs}
        assert sorted(by_step) == [3, 4]
        for step, run in by_step.items():
            assert run.parameters["dataset"] == DATASET
            assert run.parameters["config"] == config
            assert run.parameters["trigger"]["event_id"] == sent[step]
            assert run.parameters["trigger"]["metrics"] == {"score": 0.5}
            assert run.labels[RECOVERED_LABEL] == sent[step]
            assert run.state.is_scheduled()
        # Looked at again (by this process, or a `dyngen serve` started after it): none twice.
        assert look.recover(client) == 0
        again = LostRuns(deployment_id, DATASET, config, store_settings(config["store"]))
        assert again.recover(client) == 0
        assert len(client.read_flow_runs(deployment_filter=DeploymentFilter(
            id=DeploymentFilterId(any_=[deployment_id])))) == 2


def test_a_throttled_trigger_makes_no_run_of_each_batch_end(
        served: tuple[Any, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """`--every-n-batches 3` runs a round for every third batch end, not for each."""
    from prefect.client.orchestration import get_client

    from dyngen.store.location import store_settings

    deployment_id, config = served
    monkeypatch.setattr(lost_runs, "GRACE_SECONDS", 0.0)
    Store(config["store"]["root"]).create(DATASET, [{"prompt": "seed", "answer": "1"}])
    sent = send_batch_end(DATASET, 1).event_id
    with get_client(sync_client=True) as client:
        _stored(client, {sent})
        look = LostRuns(deployment_id, DATASET, config, store_settings(config["store"]),
                        threshold=3)
        assert look.check_now(client) == 0
        assert LostRuns(deployment_id, DATASET, config,
                        store_settings(config["store"])).recover(client) == 1
