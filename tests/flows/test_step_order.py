"""A round keeps its dataset's step order through the Prefect server: it gives its place back
to an earlier step that has not started (or whose run the server has not made yet), goes on
after `round.order_wait_seconds`, and a deployment's round names its generator."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterDeploymentId
from prefect.exceptions import Abort
from prefect.flow_engine import run_flow
from prefect.settings import PREFECT_API_URL
from typer.testing import CliRunner

from dyngen.cli import app
from dyngen.config import round_params
from dyngen.errors import ConfigError
from dyngen.flows.generation_round import generation_round
from dyngen.round.step_order import GAVE_WAY_LABEL, GIVEN_WAY_STATE
from dyngen.runtime.in_process import run_round
from dyngen.runtime.serve import batch_end_trigger, serve_rounds
from dyngen.server.local import wait_for_automation
from dyngen.store import Store
from dyngen.trainers.events import batch_end_event, batch_end_payload, trigger_name
from dyngen.trainers.outbox import send_events
from tests.rows import verl_rows

pytestmark = pytest.mark.usefixtures("prefect_server")

MOCK = {"path": "pkg://dyngen.generators.base", "name": "MockDataGenerator"}
NEW_ROW = {"path": "pkg://tests.flows.gens", "name": "UsesContext"}


@pytest.fixture
def deployment() -> Iterator[UUID]:
    """A deployment of the round (its runs are run here with Prefect's engine)."""
    deployment_id = generation_round.to_deployment(name="step-order-test").apply()
    yield deployment_id
    with get_client(sync_client=True) as client:
        client.delete_deployment(deployment_id)  # and its runs that never ran


def params(tmp_path: Path, dataset: str, step: int, datagen: dict[str, Any] | None = None,
           **round_keys: Any) -> dict[str, Any]:
    config = round_params({"data": {"datagen": datagen or NEW_ROW}, "round": round_keys},
                          root=tmp_path / "store")
    return {"dataset": dataset, "config": config, "trigger": {"step": step}}


def create_run(deployment_id: UUID, parameters: dict[str, Any]) -> Any:
    with get_client(sync_client=True) as client:
        return client.create_flow_run_from_deployment(deployment_id, parameters=parameters)


def run_it(run_id: UUID, parameters: dict[str, Any]) -> Any:
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
    return run_flow(generation_round, flow_run=run, parameters=parameters, return_type="state")


def test_a_round_gives_its_place_back_to_an_earlier_step_not_started_and_commits_after_it(
        tmp_path: Path, deployment: UUID) -> None:
    store = Store(tmp_path / "store")
    store.create("gives-way", verl_rows(4))
    first, second = (params(tmp_path, "gives-way", step) for step in (1, 2))
    earlier, later = create_run(deployment, first), create_run(deployment, second)

    with pytest.raises(Abort):  # its process ends; a worker runs it again later
        run_it(later.id, second)
    with get_client(sync_client=True) as client:
        put_back = client.read_flow_run(later.id)
    assert put_back.state.is_scheduled() and put_back.state.name == GIVEN_WAY_STATE
    assert put_back.next_scheduled_start_time > earlier.expected_start_time
    assert put_back.labels[GAVE_WAY_LABEL] == "1"
    assert store.head_version("gives-way") == 0  # nothing done before giving way

    assert run_it(earlier.id, first).is_completed()
    assert run_it(later.id, second).is_completed()
    history = store.history("gives-way")[1:]
    assert [r.lineage["trigger"]["step"] for r in history] == [1, 2]
    assert history[1].lineage["step_order"]["gave_way"] == 1
    assert "step_order" not in history[0].lineage  # it had nothing to wait for


def test_a_round_goes_on_after_the_bound_and_says_so_in_its_log_and_lineage(
        tmp_path: Path, deployment: UUID, caplog: pytest.LogCaptureFixture) -> None:
    store = Store(tmp_path / "store")
    store.create("bounded", verl_rows(4))
    create_run(deployment, params(tmp_path, "bounded", 3))  # never runs
    caplog.set_level(logging.INFO)
    # Run in this process (not a deployment's run): it waits in place, then goes on.
    later = params(tmp_path, "bounded", 4, order_wait_seconds=1.5)
    result = run_round("bounded", config=later["config"], trigger=later["trigger"])
    assert result["created"]
    order = store.history("bounded")[-1].lineage["step_order"]
    assert order["went_ahead_of"] == [3] and order["waited_seconds"] >= 1.5
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("going on before its earlier step(s) [3]" in line
               and "round.order_wait_seconds=1.5" in line for line in said), said


def test_an_unended_round_of_a_same_named_dataset_in_another_store_is_not_waited_for(
        tmp_path: Path, deployment: UUID) -> None:
    """Two stores on one server may hold datasets of one name (a staging store beside the
    production one, or a test beside another): their steps are not one sequence."""
    store = Store(tmp_path / "store")
    store.create("twin", verl_rows(4))
    create_run(deployment, params(tmp_path / "elsewhere", "twin", 1))  # never runs
    later = params(tmp_path, "twin", 2, order_wait_seconds=60)
    started = time.monotonic()
    assert run_round("twin", config=later["config"], trigger=later["trigger"])["created"]
    assert "step_order" not in store.history("twin")[-1].lineage
    assert time.monotonic() - started < 30
    # The same store's unended round of an earlier step is waited for, to the bound.
    create_run(deployment, params(tmp_path, "twin", 3))  # never runs
    bounded = params(tmp_path, "twin", 4, order_wait_seconds=1.5)
    run_round("twin", config=bounded["config"], trigger=bounded["trigger"])
    assert store.history("twin")[-1].lineage["step_order"]["went_ahead_of"] == [3]


def test_a_later_step_does_not_wait_when_order_wait_seconds_is_zero(
        tmp_path: Path, deployment: UUID) -> None:
    store = Store(tmp_path / "store")
    store.create("unordered", verl_rows(4))
    create_run(deployment, params(tmp_path, "unordered", 1))
    later = params(tmp_path, "unordered", 2, order_wait_seconds=0)
    run_round("unordered", config=later["config"], trigger=later["trigger"])
    assert "step_order" not in store.history("unordered")[-1].lineage


def test_a_deployments_round_naming_no_generator_fails_at_once_saying_where_to_set_it(
        tmp_path: Path, deployment: UUID) -> None:
    store = Store(tmp_path / "store")
    store.create("unnamed", verl_rows(4))
    given = {"dataset": "unnamed", "config": {"store": {"root": str(store.root)}},
             "trigger": {"step": 1}}  # prefect.yaml's old `config: {}`, plus the store
    state = run_it(create_run(deployment, given).id, given)
    assert state.is_failed()
    assert "expected data.datagen.path naming the generator" in state.message
    assert "parameters.config.data.datagen" in state.message
    assert store.head_version("unnamed") == 0
    # The mock, named, still runs.
    mock = params(tmp_path, "unnamed", 2, datagen=MOCK)
    assert run_it(create_run(deployment, mock).id, mock).is_completed()
    assert store.history("unnamed")[-1].lineage["generator"]["name"] == "MockDataGenerator"


def test_serve_refuses_a_config_naming_no_generator(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected data.datagen.path"):
        serve_rounds("ds", {"store": {"root": str(tmp_path)}})
    result = CliRunner().invoke(app, ["--root", str(tmp_path), "serve", "--dataset", "ds",
                                      "data.max_prompt_length=256"])
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "dyngen serve's config: expected data.datagen.path" in said
    assert "data.datagen.path=... data.datagen.name=..." in said


@contextmanager
def triggered_deployment(dataset: str, tmp_path: Path, threshold: int) -> Iterator[UUID]:
    """A deployment whose trigger (dyngen serve's) makes its runs from real batch ends;
    deleted afterwards with its runs."""
    config = params(tmp_path, dataset, 0)["config"]
    deployment_id = generation_round.to_deployment(
        name=f"triggered-{dataset}",
        triggers=[batch_end_trigger(dataset, config, threshold)]).apply()
    try:
        wait_for_automation(PREFECT_API_URL.value(), trigger_name(dataset))
        yield deployment_id
    finally:
        with get_client(sync_client=True) as client:
            client.delete_deployment(deployment_id)


def send(dataset: str, step: int, event_id: str,
         previous: dict[str, Any] | None = None) -> None:
    """A batch end as a trainer sends it, naming the one before it (or not)."""
    payload = batch_end_payload(step, {"score": 0.5}, event_id=event_id, previous=previous)
    send_events(PREFECT_API_URL.value(), [batch_end_event(dataset, payload)])


def run_made_for(deployment_id: UUID, event_id: str, timeout: float = 60.0) -> Any:
    """The run the server's trigger made of a batch end, once it exists."""
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            for run in client.read_flow_runs(flow_run_filter=FlowRunFilter(
                    deployment_id=FlowRunFilterDeploymentId(any_=[deployment_id]))):
                if (run.parameters.get("trigger") or {}).get("event_id") == event_id:
                    return run
            time.sleep(0.3)
    raise AssertionError(f"no run was made of event {event_id} in {timeout} s")


def run_made(run: Any) -> Any:
    return run_flow(generation_round, flow_run=run, parameters=run.parameters,
                    return_type="state")


def test_a_round_whose_previous_batch_ends_run_is_not_created_yet_waits_for_it(
        tmp_path: Path) -> None:
    """The race CI met: Prefect made (and a worker started) step 2's run before step 1's."""
    store = Store(tmp_path / "store")
    store.create("created-late", verl_rows(4))
    with triggered_deployment("created-late", tmp_path, threshold=1) as deployment_id:
        send("created-late", 2, "second", previous={"event_id": "first", "step": 1,
                                                    "seconds_before": 0.01})
        later = run_made_for(deployment_id, "second")
        # No earlier run exists, yet it does not go ahead: step 1's batch end was sent.
        with pytest.raises(Abort):
            run_made(later)
        with get_client(sync_client=True) as client:
            assert client.read_flow_run(later.id).state.name == GIVEN_WAY_STATE
        assert store.head_version("created-late") == 0

        send("created-late", 1, "first")
        assert run_made(run_made_for(deployment_id, "first")).is_completed()
        with get_client(sync_client=True) as client:
            assert run_made(client.read_flow_run(later.id)).is_completed()
    history = store.history("created-late")[1:]
    assert [r.lineage["trigger"]["step"] for r in history] == [1, 2]
    assert history[1].lineage["step_order"]["gave_way"] == 1
    assert not history[1].lineage["step_order"]["went_ahead_of"]


def test_a_throttled_triggers_round_does_not_wait_for_batch_ends_that_make_no_run(
        tmp_path: Path) -> None:
    """Every 2 batch ends make one run: the previous batch end's run never comes."""
    store = Store(tmp_path / "store")
    store.create("throttled", verl_rows(4))
    with triggered_deployment("throttled", tmp_path, threshold=2) as deployment_id:
        send("throttled", 1, "one")
        send("throttled", 2, "two", previous={"event_id": "one", "step": 1,
                                              "seconds_before": 0.01})
        run = run_made_for(deployment_id, "two")
        started = time.monotonic()
        assert run_made(run).is_completed()
        assert time.monotonic() - started < 60  # not the 900 s bound
    record = store.history("throttled")[-1]
    assert record.lineage["trigger"]["step"] == 2 and "step_order" not in record.lineage


def test_a_batch_end_sent_before_the_deployment_was_applied_is_not_waited_for(
        tmp_path: Path) -> None:
    """A trainer's batch end that met no trigger (`dyngen serve` not started yet) makes no
    run: the next one, which names it, does not wait for it."""
    store = Store(tmp_path / "store")
    store.create("before-deploy", verl_rows(4))
    send("before-deploy", 1, "unmatched")
    sent = time.time()
    time.sleep(1.0)  # the deployment is applied after it, on the server's clock too
    with triggered_deployment("before-deploy", tmp_path, threshold=1) as deployment_id:
        send("before-deploy", 2, "matched", previous={
            "event_id": "unmatched", "step": 1, "seconds_before": time.time() - sent})
        assert run_made(run_made_for(deployment_id, "matched")).is_completed()
    record = store.history("before-deploy")[-1]
    assert record.lineage["trigger"]["step"] == 2 and "step_order" not in record.lineage
