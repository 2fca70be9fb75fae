"""A batch end the Prefect server stored and made no run of is given its run by serve.

The server stores an event, then its trigger service (in memory) makes the run: a server
killed in between keeps the event and loses the run, and the dataset's later steps wait
for that step's round until their bound (what the chaos benchmark found: steps 70 and
83-100 of seed 7 never ran). Here the trigger is disabled while batch ends arrive, which
leaves the server in that same state, and `dyngen serve`'s look (LostRuns) must make the
runs still due, and only those, once each.

The deployment (`generation-round/on-batch-end`) is every `dyngen serve`'s, on a test
server shared by the session: other modules leave runs of their datasets in it (a round
stopped by Ctrl-C in tests/test_cli_signals.py: dataset "ds", step 1, Crashed), so each
test here starts with such a run and counts only the runs of its own dataset.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
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
# The trigger of the run the fixture plants as another module's leftover (dataset "ds").
LEFT_EVENT = str(uuid.uuid4())


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Any, dict[str, Any]]]:
    """The round's deployment for DATASET, its trigger disabled, holding a run another
    module left (another dataset's step 1); its runs deleted after."""
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    config = {"store": {"root": str(tmp_path / "store")}}
    deployment = round_deployment(DATASET, config)
    # Created disabled, never loaded by the trigger service. (Paused once created, as an
    # operator would, it stops making runs only once the server has reloaded it: on SQLite
    # that is a task of its own, after the pause has been answered.)
    for trigger in deployment.triggers:
        trigger.enabled = False
    deployment_id = deployment.apply()
    with get_client(sync_client=True) as client:
        (automation,) = client.read_automations_by_name(trigger_name(DATASET))
        assert not automation.enabled
        left = client.create_flow_run_from_deployment(deployment_id, parameters={
            "dataset": "ds", "trigger": {"event_id": LEFT_EVENT, "step": 1}, "config": {}})
        client.set_flow_run_state(left.id, Crashed(), force=True)
    try:
        yield deployment_id, config
    finally:
        # Only this module's runs: a run another module left may hold its dataset's round
        # slot, and deleting it would hide the slot's holder.
        with get_client(sync_client=True) as client:
            for run in [*_runs_of(client, deployment_id), _left_run(client, deployment_id)]:
                client.delete_flow_run(run.id)


def _left_run(client: Any, deployment_id: Any) -> Any:
    """The run the fixture planted as another module's leftover."""
    (run,) = [r for r in _runs_of(client, deployment_id, dataset="ds")
              if (r.parameters.get("trigger") or {}).get("event_id") == LEFT_EVENT]
    return run


def _runs_of(client: Any, deployment_id: Any, dataset: str | None = DATASET) -> list[Any]:
    """The deployment's runs of `dataset`'s batch ends (None: of every dataset)."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    runs = client.read_flow_runs(deployment_filter=DeploymentFilter(
        id=DeploymentFilterId(any_=[deployment_id])))
    return [r for r in runs if dataset is None or r.parameters.get("dataset") == dataset]


def _stored(client: Any, event_ids: set[str], timeout: float = 30.0) -> dict[str, Any]:
    """The events of these ids, once the server has stored them all (one the server was too
    busy to take in time, a 700 KB one before it, waits in the outbox: it is sent again)."""
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    from dyngen.trainers.events import EVENT_NAME, flush_outbox, resource_id

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        page = client.read_events(EventFilter(
            event=EventNameFilter(name=[EVENT_NAME]),
            resource=EventResourceFilter(id=[resource_id(DATASET)])), limit=50)
        seen = {((e.payload or {}).get("trigger") or {}).get("event_id"): e
                for e in page.events}
        if event_ids <= set(seen):
            return {i: seen[i] for i in event_ids}
        time.sleep(0.2)
        flush_outbox()
    raise AssertionError(f"the server did not store the events {event_ids - set(seen)}")


def _lost_runs(deployment_id: Any, config: dict[str, Any], threshold: int = 1,
               round_config: dict[str, Any] | None = None) -> LostRuns:
    """`dyngen serve --dataset DATASET`'s look (its round's config: `config`, unless told)."""
    from dyngen.store.location import store_settings

    return LostRuns(deployment_id, DATASET, round_config or config,
                    store_settings(config["store"]), threshold)


def test_serve_makes_the_runs_of_stored_batch_ends_that_have_none_once_each(
        served: tuple[Any, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.client.orchestration import get_client

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
    # One no round can take (parameters over Prefect's 512 KB: the trigger's run was refused).
    huge = send_batch_end(DATASET, 5, {f"m{i:06d}": 0.5 for i in range(50_000)}).event_id
    assert all(s for s in sent.values())
    with get_client(sync_client=True) as client:
        _stored(client, {earlier, huge, *sent.values()})
        look = _lost_runs(deployment_id, config)
        # Steps 3 and 4: 1 is behind step 2, 2 is committed, 5 is too large for a round.
        assert look.recover(client) == 2
        by_step = {run.parameters["trigger"]["step"]: run
                   for run in _runs_of(client, deployment_id)}
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
        assert _lost_runs(deployment_id, config).recover(client) == 0
        assert len(_runs_of(client, deployment_id)) == 2
        # The run another module left is neither counted nor touched.
        assert _left_run(client, deployment_id).state.is_crashed()


def test_a_batch_end_received_late_has_its_grace_from_when_the_server_received_it(
        served: tuple[Any, dict[str, Any]]) -> None:
    """A batch end the trainer's outbox delivers late (or stamped by a clock behind the
    server's) is old by its `occurred`, and new to the trigger service, which is making its
    run: the look waits GRACE_SECONDS from its receipt, or the batch end has two runs."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    from dyngen.trainers.events import batch_end_event, batch_end_payload
    from dyngen.trainers.outbox import send_events

    deployment_id, config = served
    Store(config["store"]["root"]).create(DATASET, [{"prompt": "seed", "answer": "1"}])
    sent_at = datetime.now(timezone.utc)  # when the trainer queued it
    event = batch_end_event(DATASET, batch_end_payload(1, {"score": 0.5}))
    event["occurred"] = sent_at.isoformat()
    send_events(str(PREFECT_API_URL.value()), [event])
    event_id = event["payload"]["trigger"]["event_id"]
    grace = timedelta(seconds=lost_runs.GRACE_SECONDS)
    with get_client(sync_client=True) as client:
        received = _stored(client, {event_id})[event_id].received
        assert received > sent_at
        look = _lost_runs(deployment_id, config)
        # GRACE_SECONDS after the trainer sent it, not yet after the server received it.
        assert look.recover(client, now=sent_at + (received - sent_at) / 2 + grace) == 0
        assert _runs_of(client, deployment_id) == []
        # GRACE_SECONDS after the server received it, its trigger has had its time.
        assert look.recover(client, now=received + grace) == 1
        (run,) = _runs_of(client, deployment_id)
        assert run.labels[RECOVERED_LABEL] == event_id


def test_a_look_that_reads_only_the_newest_runs_makes_no_second_run_of_older_batch_ends(
        served: tuple[Any, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """A look reads at most RUN_PAGES pages of runs: the newest, as it reads the newest batch
    ends, and it leaves alone those received before the oldest run it read."""
    from prefect.client.orchestration import get_client

    deployment_id, config = served
    monkeypatch.setattr(lost_runs, "GRACE_SECONDS", 0.0)
    Store(config["store"]["root"]).create(DATASET, [{"prompt": "seed", "answer": "1"}])
    sent = {send_batch_end(DATASET, step).event_id for step in (1, 2, 3)}
    with get_client(sync_client=True) as client:
        _stored(client, sent)
        assert _lost_runs(deployment_id, config).recover(client) == 3
        monkeypatch.setattr(lost_runs, "RUNS_PAGE", 1)
        monkeypatch.setattr(lost_runs, "RUN_PAGES", 1)
        assert _lost_runs(deployment_id, config).recover(client) == 0
        assert len(_runs_of(client, deployment_id)) == 3


def test_a_trigger_too_large_for_a_round_gets_no_run_and_a_message_saying_why(
        served: tuple[Any, dict[str, Any]], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Not sent to the server to be refused there (over its 512 KB), nor made a run that
    the round refuses at once (over 64 KB): the serve log says what was found and what to do."""
    from prefect.client.orchestration import get_client

    from dyngen.round.context import MAX_TRIGGER_BYTES

    deployment_id, config = served
    monkeypatch.setattr(lost_runs, "GRACE_SECONDS", 0.0)
    Store(config["store"]["root"]).create(DATASET, [{"prompt": "seed", "answer": "1"}])
    small = send_batch_end(DATASET, 3, {"score": 0.5}).event_id
    large = send_batch_end(DATASET, 1, {f"m{i:06d}": 0.5 for i in range(5_000)}).event_id
    huge = send_batch_end(DATASET, 2, {f"m{i:06d}": 0.5 for i in range(50_000)}).event_id
    with get_client(sync_client=True) as client:
        _stored(client, {large, huge, small})
        # The round's config too large for the server's parameters (a round that inlines
        # its rows), with the small trigger.
        inlined = {**config, "data": {"note": "x" * 600_000}}
        with caplog.at_level(logging.WARNING, logger="dyngen.serve"):
            assert _lost_runs(deployment_id, config, round_config=inlined).recover(client) == 0
        assert _runs_of(client, deployment_id) == []
        said = [" ".join(r.getMessage().split()) for r in caplog.records]
        assert "Flow run parameters must be less than" not in " ".join(said)
        for step, event_id, metrics in ((1, large, "5,000"), (2, huge, "50,000")):
            (line,) = [m for m in said if event_id in m]
            assert f"dataset 'lost' step {step} (event {event_id}) has no run, and none is " \
                   "made of it: its trigger is " in line
            assert f"({metrics} metrics), and a round takes a trigger of at most " \
                   f"{MAX_TRIGGER_BYTES:,} bytes (at most 256 metrics)" in line
            assert "Send at most a few numbers as a batch end's metrics" in line
        (line,) = [m for m in said if small in m]
        assert "the Prefect server takes at most 524,288" in line
        assert "PREFECT_SERVER_API_MAX_PARAMETER_SIZE" in line
        # With the config it serves, the small one is made its run; the others never.
        assert _lost_runs(deployment_id, config).recover(client) == 1
        (run,) = _runs_of(client, deployment_id)
        assert run.parameters["trigger"]["event_id"] == small


def test_a_throttled_trigger_makes_no_run_of_each_batch_end(
        served: tuple[Any, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """`--every-n-batches 3` runs a round for every third batch end, not for each."""
    from prefect.client.orchestration import get_client

    deployment_id, config = served
    monkeypatch.setattr(lost_runs, "GRACE_SECONDS", 0.0)
    Store(config["store"]["root"]).create(DATASET, [{"prompt": "seed", "answer": "1"}])
    sent = send_batch_end(DATASET, 1).event_id
    with get_client(sync_client=True) as client:
        _stored(client, {sent})
        look = _lost_runs(deployment_id, config, threshold=3)
        assert look.check_now(client) == 0
        assert _lost_runs(deployment_id, config).recover(client) == 1
