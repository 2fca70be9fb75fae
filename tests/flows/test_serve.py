"""The deployment `dyngen serve` applies: named by module, its catch-up schedule, and
refused next to a deployment made by `prefect deploy` (prefect.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.flows import load_flow_from_entrypoint
from prefect.types.entrypoint import EntrypointType

from dyngen.errors import ConfigError
from dyngen.flows.generation_round import generation_round
from dyngen.runtime.serve import (
    CATCH_UP_SLUG,
    DEPLOYMENT_NAME,
    round_deployment,
    serve_rounds,
)

MOCK = {"data": {"datagen": {"path": "pkg://dyngen.generators.base",
                             "name": "MockDataGenerator"}}}

pytestmark = pytest.mark.usefixtures("prefect_server")

MODULE_ENTRYPOINT = "dyngen.flows.generation_round.generation_round"


def test_served_deployment_names_the_round_by_module_so_any_folder_can_run_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a folder that holds no dyngen file
    (tmp_path / "flows.py").write_text("raise ImportError('the user flows.py was imported')\n")
    deployment = round_deployment("ds", MOCK)
    assert deployment.entrypoint == MODULE_ENTRYPOINT
    assert deployment.entrypoint_type == EntrypointType.MODULE_PATH
    assert load_flow_from_entrypoint(deployment.entrypoint) is generation_round


def test_serving_one_dataset_schedules_catch_up_rounds_of_it_beside_its_trigger() -> None:
    from datetime import timedelta

    from prefect.client.schemas.objects import ConcurrencyLimitStrategy

    deployment_id = round_deployment("catch", MOCK, catch_up_seconds=45).apply()
    try:
        with get_client(sync_client=True) as client:
            deployment = client.read_deployment(deployment_id)
            (schedule,) = client.read_deployment_schedules(deployment_id)
        assert schedule.active and schedule.slug == CATCH_UP_SLUG
        assert schedule.schedule.interval == timedelta(seconds=45)
        # Its runs: the dataset named, the catch-up trigger, the deployment's config.
        assert schedule.parameters == {"dataset": "catch", "trigger": {"catch_up": True}}
        assert deployment.parameters == {"config": MOCK}
        assert deployment.global_concurrency_limit.limit == 1
        assert deployment.concurrency_options.collision_strategy == \
            ConcurrencyLimitStrategy.ENQUEUE
    finally:
        with get_client(sync_client=True) as client:
            client.delete_deployment(deployment_id)
    # Off with 0; and serving every dataset there is none (a catch-up names its dataset).
    assert round_deployment("catch", MOCK, catch_up_seconds=0).schedules == []
    assert round_deployment(None, MOCK).schedules == []


def test_serve_refuses_to_replace_the_work_pool_deployment_and_leaves_it_as_it_was(
        tmp_path: Path) -> None:
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name="dyngen-pool", type="process"),
                                overwrite=True)
        flow_id = client.create_flow_from_name(generation_round.name)
        deployment_id = client.create_deployment(
            flow_id, DEPLOYMENT_NAME, work_pool_name="dyngen-pool",
            entrypoint=MODULE_ENTRYPOINT)
    try:
        with pytest.raises(ConfigError) as err:
            serve_rounds("ds", {**MOCK, "store": {"root": str(tmp_path / "store")}})
        message = str(err.value)
        assert f"generation-round/{DEPLOYMENT_NAME}" in message and "dyngen-pool" in message
        assert "prefect worker start --pool dyngen-pool" in message
        with get_client(sync_client=True) as client:
            kept = client.read_deployment(deployment_id)
        assert kept.work_pool_name == "dyngen-pool"
        assert kept.entrypoint == MODULE_ENTRYPOINT
    finally:
        with get_client(sync_client=True) as client:
            client.delete_deployment(deployment_id)


def test_waiting_runs_behind_a_later_one_of_their_dataset_are_superseded() -> None:
    from uuid import uuid4

    from prefect.client.schemas.objects import FlowRun

    from dyngen.runtime.served_runs import superseded

    def run(dataset: str, trigger: dict | None) -> FlowRun:
        return FlowRun(flow_id=uuid4(), parameters={"dataset": dataset, "trigger": trigger})

    wake = [run("a", {"event_id": f"e{s}", "run": "r", "step": s}) for s in (1, 2, 3)]
    catch_up, other = run("a", {"catch_up": True}), run("b", {"run": "r", "step": 1})
    legacy = run("a", {"event_id": "x", "step": 9})  # no store: its run is its only record
    due = [wake[0], catch_up, other, legacy, wake[1], wake[2]]
    # The last due run of each dataset stays; of the rest, what a later round covers goes.
    assert superseded(due) == [wake[0], catch_up, wake[1]]
    assert superseded([wake[2], legacy]) == [wake[2]]
    assert superseded([legacy, run("a", None)]) == []
