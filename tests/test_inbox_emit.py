"""A trainer's batch end goes into the dataset's inbox in the store first, then its event,
which only wakes a round: sent once, never queued in the outbox.

Real stores (a folder, memory://, moto's S3), the real outbox and a real Prefect server
where an event is sent; a store that cannot be reached is a port where nothing listens,
one that accepts and never answers, or an inbox folder that cannot be created.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import dyngen.trainers.events as events
import dyngen.trainers.inbox_write as inbox_write
import dyngen.trainers.outbox as outbox
from dyngen.cli import app
from dyngen.server.processes import free_port
from dyngen.store import Store
from dyngen.trainers.dataset import DyngenDataset
from dyngen.trainers.inbox_queue import InboxQueue
from dyngen.trainers.outbox import Outbox
from dyngen.trainers.rollouts import write_rollouts
from tests.rows import verl_rows
from tests.support import UNUSED_API, queued_triggers, server_triggers

ROLLOUTS = [{"prompt": "What is 2 + 2?", "score": 1.0, "ground_truth": "4"},
            {"prompt": "What is 3 + 3?", "score": 0.0, "ground_truth": "6"}]


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no outage said and no store opened."""
    monkeypatch.setattr(inbox_write, "_store_down", set())
    monkeypatch.setattr(inbox_write, "_said", set())
    monkeypatch.setattr(inbox_write, "_stores", {})
    monkeypatch.delenv(inbox_write.RUN_ENV, raising=False)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "store")
    store.create("ds", verl_rows(2))
    return store


def test_the_batch_end_is_in_the_store_before_its_event_goes_out(
        store: Store, tmp_path: Path, no_server: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    rollouts = write_rollouts(tmp_path / "step-3.jsonl", ROLLOUTS)
    seen_at_sending: list[Any] = []
    send = outbox.send_events

    def watching(api_url: str, sent: list, timeout: float | None = None) -> None:
        seen_at_sending.append(Store(store.root).batch_end("ds", "run-a", 3))
        send(api_url, sent, timeout=timeout)

    monkeypatch.setattr(outbox, "send_events", watching)
    event_id = events.emit_batch_end("ds", 3, {"score": 0.5}, str(rollouts),
                                     store=str(store.root), run="run-a")
    assert seen_at_sending[0] is not None and seen_at_sending[0].event_id == event_id
    assert seen_at_sending[0].key == ("run-a", 3)
    rollouts.unlink()  # the trainer's file is gone: the store holds its own copy
    other = Store(store.root)  # e.g. the worker's, on another host
    entry = other.batch_end("ds", "run-a", 3)
    assert entry is not None and dict(entry.metrics) == {"score": 0.5}
    assert other.read_rollouts(entry) == ROLLOUTS
    assert [e.key for e in other.pending("ds")] == [("run-a", 3)]  # what wakes a round


def test_the_event_the_server_gets_names_the_run(store: Store, prefect_server: None) -> None:
    from prefect.settings import PREFECT_API_URL

    name = f"inbox-{uuid.uuid4().hex[:8]}"
    store.create(name, verl_rows(2))
    sent = events.send_batch_end(name, 1, {"score": 0.5}, ROLLOUTS, store=store, run="run-a")
    assert (sent.status, sent.inbox, sent.run) == ("sent", "written", "run-a")
    trigger = server_triggers(str(PREFECT_API_URL.value()), name, 1)[0]
    assert (trigger["run"], trigger["step"], trigger["rollouts"]) == ("run-a", 1, None)
    assert trigger["event_id"] == sent.event_id
    assert Store(store.root).read_rollouts(store.batch_end(name, "run-a", 1)) == ROLLOUTS


def test_a_resent_step_writes_nothing_and_its_event_keeps_the_first_id(
        store: Store, prefect_server: None, caplog: pytest.LogCaptureFixture) -> None:
    from prefect.settings import PREFECT_API_URL

    name = f"inbox-{uuid.uuid4().hex[:8]}"
    store.create(name, verl_rows(2))
    first = events.send_batch_end(name, 1, {"score": 0.5}, store=store, run="r")
    again = events.send_batch_end(name, 1, {"score": 0.9}, event_id="other", store=store,
                                  run="r")
    assert (first.inbox, again.inbox) == ("written", "kept")
    assert again.event_id == first.event_id  # the round it wakes is the first one's
    assert [(e.run, e.step, dict(e.metrics)) for e in Store(store.root).batch_ends(name)] == \
        [("r", 1, {"score": 0.5})]
    # Both events the server got are the first batch end's: its id and its metrics.
    assert [(t["event_id"], t["metrics"]) for t in
            server_triggers(str(PREFECT_API_URL.value()), name, 2)] == \
        [(first.event_id, {"score": 0.5})] * 2
    assert f"{name!r} run 'r' step 1 already has a batch end in the store, with other " \
        "metrics" in caplog.text


def test_two_runs_keep_their_steps_apart_and_a_resumed_run_lands_nothing_twice(
        store: Store, no_server: None) -> None:
    for run in ("first", "second"):
        for step in (1, 2, 3):
            events.emit_batch_end("ds", step, {"step": float(step)}, store=store, run=run)
    # "first" resumes from its step-1 checkpoint and sends steps 2 and 3 again, then 4.
    resumed = DyngenDataset(store.root, "ds", run="first")
    results = [events.send_batch_end("ds", s, {"step": s * 10.0}, store=resumed.store,
                                     run="first").inbox for s in (2, 3, 4)]
    assert results == ["kept", "kept", "written"]
    keys = [(e.run, e.step, e.metrics["step"]) for e in Store(store.root).batch_ends("ds")]
    assert keys == [("first", 1, 1.0), ("first", 2, 2.0), ("first", 3, 3.0),
                    ("first", 4, 40.0), ("second", 1, 1.0), ("second", 2, 2.0),
                    ("second", 3, 3.0)]


def test_the_run_defaults_to_dyngen_run_else_default_said_once(
        store: Store, no_server: None, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(inbox_write, "_unnamed_said", False)
    caplog.set_level(logging.INFO, logger="dyngen")
    assert events.send_batch_end("ds", 1, store=store).run == "default"
    assert events.send_batch_end("ds", 2, store=store).run == "default"
    said = [r for r in caplog.records if "can only be told apart by naming" in r.getMessage()]
    assert len(said) == 1 and "DYNGEN_RUN" in said[0].getMessage()
    monkeypatch.setenv("DYNGEN_RUN", "from-env")
    assert events.send_batch_end("ds", 1, store=store).run == "from-env"
    assert [(e.run, e.step) for e in store.batch_ends("ds")] == \
        [("default", 1), ("default", 2), ("from-env", 1)]


def test_what_the_trainer_got_wrong_is_logged_never_raised(
        store: Store, tmp_path: Path, no_server: None,
        caplog: pytest.LogCaptureFixture) -> None:
    nan = events.send_batch_end("ds", 1, {"score": 0.5, "loss": float("nan")}, store=store,
                                run="r")
    assert nan.inbox == "written" and dict(store.batch_end("ds", "r", 1).metrics) == \
        {"score": 0.5}
    assert "metric(s) loss=nan are not what the store takes" in caplog.text
    bad_run = events.send_batch_end("ds", 2, {"score": 0.5}, store=store, run="bad\nrun")
    assert (bad_run.inbox, bad_run.run, bad_run.status) == ("unrecorded", None, "queued")
    assert "training run id 'bad\\nrun': expected printable text" in caplog.text
    # The event, the batch end's only record, waits in the outbox: it still wakes a round.
    assert [(t["step"], "run" in t) for t in queued_triggers()] == [(2, False)]
    text = tmp_path / "not-jsonl.txt"
    text.write_text("not json\n")
    bad_rollouts = events.send_batch_end("ds", 3, None, str(text), store=store, run="r")
    assert bad_rollouts.inbox == "unrecorded" and store.batch_end("ds", "r", 3) is None
    assert "expected one JSON value per line" in caplog.text
    assert events.emit_batch_end("ds", 4, store={"root": 7}, run="r") is not None  # a bad store


def test_a_store_config_mapping_and_a_memory_root(s3_endpoint: str, no_server: None) -> None:
    from tests.store.conftest import new_bucket, s3_options

    section = {"root": f"s3://{new_bucket(s3_endpoint)}/stores/main",
               "storage_options": s3_options(s3_endpoint)}
    assert events.send_batch_end("ds", 1, {"a": 1.0}, ROLLOUTS, store=section,
                                 run="r").inbox == "written"
    other = Store.from_config(section)
    assert other.read_rollouts(other.batch_end("ds", "r", 1)) == ROLLOUTS
    memory = f"memory://{uuid.uuid4().hex[:8]}/store"
    assert events.send_batch_end("ds", 1, {"a": 1.0}, ROLLOUTS, store=memory,
                                 run="r").inbox == "written"
    assert Store(memory).read_rollouts(Store(memory).batch_end("ds", "r", 1)) == ROLLOUTS


def s3_down(port: int, **client: Any) -> dict[str, Any]:
    """A store section on S3 at a loopback port (no retries: a refusal is seen at once)."""
    return {"root": "s3://bucket/stores/main",
            "storage_options": {"endpoint_url": f"http://127.0.0.1:{port}", "key": "testing",
                                "secret": "testing", "client_kwargs": {"region_name":
                                                                       "us-east-1"},
                                "config_kwargs": {"retries": {"max_attempts": 1}, **client}}}


def test_an_unreachable_store_queues_locally_and_the_next_emit_writes_it_in_order(
        tmp_path: Path, no_server: None, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from moto.server import ThreadedMotoServer

    port = free_port()  # nothing listens there yet
    section = s3_down(port)
    started = time.monotonic()
    sent = [events.send_batch_end("ds", s, {"score": s / 10}, ROLLOUTS if s == 1 else None,
                                  store=section, run="r") for s in (1, 2)]
    assert time.monotonic() - started < 2 * events.MAX_EMIT_SECONDS
    assert [(s.inbox, s.status) for s in sent] == [("queued", "dropped")] * 2
    assert Outbox().pending(UNUSED_API) == []  # the wake-ups are not kept: the batch ends are
    queue = InboxQueue()
    queued = [json.loads(p.read_text()) for p in queue.pending("s3://bucket/stores/main")]
    assert [(q["run"], q["step"], q["event_id"]) for q in queued] == \
        [("r", 1, sent[0].event_id), ("r", 2, sent[1].event_id)]
    down = [r.getMessage() for r in caplog.records if "was not written to the store" in
            r.getMessage()]
    assert len(down) == 1 and "Training continues" in down[0]  # said once per outage

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        import boto3

        boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="testing",
                     aws_secret_access_key="testing", region_name="us-east-1"
                     ).create_bucket(Bucket="bucket")
        # The store is back: the next emit, once the last write against the dead port has
        # given up (the client's own retries), writes the queue and then its batch end. On
        # a loaded machine that can take over the 2 s a trainer waits; this test waits.
        for writer in list(inbox_write._writing.values()):
            writer.join(60)
        monkeypatch.setattr(inbox_write, "STORE_WAIT_SECONDS", 60.0)
        third = events.send_batch_end("ds", 3, {"score": 0.3}, store=section, run="r")
        assert third.inbox == "written"
        other = Store.from_config(section)
        entries = other.batch_ends("ds")
        assert [(e.step, e.event_id) for e in entries] == \
            [(1, sent[0].event_id), (2, sent[1].event_id), (3, third.event_id)]
        assert other.read_rollouts(entries[0]) == ROLLOUTS  # copied into the queue, then here
        assert queue.pending("s3://bucket/stores/main") == []
        assert "is reachable again" in caplog.text
    finally:
        server.stop()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers (a hung store)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield int(sock.getsockname()[1])


def test_a_store_that_never_answers_costs_the_trainer_the_store_wait_at_most(
        silent_port: int, no_server: None) -> None:
    section = s3_down(silent_port, read_timeout=30, connect_timeout=30)
    started = time.monotonic()
    first = events.send_batch_end("ds", 1, store=section, run="r")
    waited = time.monotonic() - started
    assert first.inbox == "queued"
    assert inbox_write.STORE_WAIT_SECONDS <= waited < inbox_write.STORE_WAIT_SECONDS + 2
    started = time.monotonic()  # the first write still hangs: no second waits behind it
    assert events.send_batch_end("ds", 2, store=section, run="r").inbox == "queued"
    assert time.monotonic() - started < 1.5
    assert [t.name for t in threading.enumerate()].count("dyngen-inbox-write") == 1


def test_dyngen_emit_flush_writes_what_an_unwritable_store_left_queued(
        store: Store, prefect_server: None) -> None:
    name = f"inbox-{uuid.uuid4().hex[:8]}"
    store.create(name, verl_rows(2))
    blocker = Path(store.root) / name / "_inbox"
    blocker.write_text("")  # the inbox's folder cannot be made: every write fails
    cli = CliRunner()
    emitted = cli.invoke(app, ["--root", str(store.root), "emit", name, "--step", "5",
                               "--run", "job-7", "--metric", "score=0.25"])
    assert emitted.exit_code == 0, emitted.output
    assert "waits in the local retry queue" in emitted.output
    assert store.batch_ends(name) == []
    blocker.unlink()
    flushed = cli.invoke(app, ["--root", str(store.root), "emit", "--flush"])
    assert flushed.exit_code == 0, flushed.output
    assert "wrote 1 queued batch end(s) into the store; 0 still in the retry queue" in \
        flushed.output
    assert "delivered 0 queued event(s); 0 still in the outbox" in flushed.output
    entry = Store(store.root).batch_end(name, "job-7", 5)
    assert entry is not None and dict(entry.metrics) == {"score": 0.25}
    again = cli.invoke(app, ["--root", str(store.root), "emit", name, "--step", "5",
                             "--run", "job-7"])
    assert "run 'job-7' has this step in the inbox" in again.output
    assert len(Store(store.root).batch_ends(name)) == 1


def test_dyngen_emit_for_a_dataset_not_in_the_store_sends_the_event_alone(
        tmp_path: Path, no_server: None) -> None:
    result = CliRunner().invoke(app, ["--root", str(tmp_path / "none"), "emit", "elsewhere",
                                      "--step", "1"])
    assert result.exit_code == 0, result.output
    assert "is not in the store" in result.output and "queued dyngen.batch.ended" in \
        result.output
    assert not (tmp_path / "none").exists()  # nothing was created for it
    assert "run" not in json.loads(Outbox().pending(UNUSED_API)[0].read_text())["payload"][
        "trigger"]


def test_a_wake_up_the_server_cannot_take_is_not_queued_and_said_once_per_outage(
        store: Store, prefect_server: None, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from prefect.settings import PREFECT_API_URL

    monkeypatch.setattr(events, "_server_down", False)
    caplog.set_level(logging.WARNING, logger="dyngen.trainers.events")
    started = time.monotonic()
    down = [events.send_batch_end("ds", s, {"score": 0.5}, store=store, run="r",
                                  api_url=UNUSED_API) for s in (1, 2, 3)]
    assert time.monotonic() - started < 3 * events.MAX_EMIT_SECONDS
    assert [(d.status, d.inbox, d.pending) for d in down] == [("dropped", "written", 0)] * 3
    assert Outbox().pending(UNUSED_API) == []  # nothing waits for the server
    # The batch end is what a round needs: the id is returned, as for a kept event.
    assert events.emit_batch_end("ds", 4, store=store, run="r", api_url=UNUSED_API) == \
        store.batch_end("ds", "r", 4).event_id
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "'ds' step 1 was not sent" in warnings[0] and "unreachable" in warnings[0]
    assert "the batch end is in the store's inbox, and the next round covers it (the " \
        "serve's catch-up schedule, or the next batch end's event)" in warnings[0]
    assert [e.step for e in store.pending("ds")] == [1, 2, 3, 4]

    live = str(PREFECT_API_URL.value())
    name = f"inbox-{uuid.uuid4().hex[:8]}"
    store.create(name, verl_rows(2))
    back = events.send_batch_end(name, 5, store=store, run="r", api_url=live)
    assert (back.status, back.delivered, back.inbox) == ("sent", 1, "written")
    assert "the Prefect server is reachable again" in caplog.text
    assert [t["step"] for t in server_triggers(live, name, 1)] == [5]  # sent once


def test_dyngen_emit_says_a_wake_up_was_not_sent_and_goes_on(
        store: Store, no_server: None) -> None:
    result = CliRunner().invoke(app, ["--root", str(store.root), "emit", "ds", "--step", "2",
                                      "--run", "job-1"])
    assert result.exit_code == 0, result.output  # a shell training loop goes on
    said = " ".join(result.output.split())
    assert "recorded in the inbox of" in said and "was not sent" in said
    assert "the batch end is in the store's inbox, and the next round covers it" in said
    assert Outbox().pending(UNUSED_API) == []
    assert store.batch_end("ds", "job-1", 2) is not None
