"""The trainer hook never stops training: an unreachable server costs seconds and one warning."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

import dyngen.trainers.events as events
from dyngen.server.local import free_port


@pytest.fixture(autouse=True)
def fresh_outage_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(events, "_server_down", False)
    monkeypatch.setenv("DYNGEN_OUTBOX", str(tmp_path / "outbox"))


def test_server_down_returns_quickly_queues_with_one_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    dead = f"http://127.0.0.1:{free_port()}/api"  # nothing listens there
    caplog.set_level(logging.WARNING, logger="dyngen.trainers.events")
    import prefect.events  # noqa: F401 - a process's first emit pays this import once
    start = time.monotonic()
    results = [events.send_batch_end("ds", step, {"score": 0.5}, api_url=dead)
               for step in range(5)]
    elapsed = time.monotonic() - start
    assert [r.status for r in results] == ["queued"] * 5
    assert [r.pending for r in results] == [1, 2, 3, 4, 5]
    assert elapsed < 2.5  # a refused connection costs milliseconds, not the timeouts
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    message = warnings[0].getMessage()
    assert "'ds' step 0 was not sent" in message and "unreachable" in message
    assert "Training continues" in message and "waits in the outbox" in message


def test_no_server_configured_is_a_warning_not_an_error(caplog: pytest.LogCaptureFixture) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    caplog.set_level(logging.WARNING, logger="dyngen.trainers.events")
    with temporary_settings(updates={PREFECT_API_URL: None}):
        assert events.emit_batch_end("ds", 1) is None
    assert "PREFECT_API_URL is not set" in caplog.text
    # The line to type, not only the name of the variable.
    assert "export PREFECT_API_URL=http://127.0.0.1:4200/api" in caplog.text


def test_payload_carries_a_trigger_the_flow_accepts() -> None:
    from dyngen.round import Trigger

    payload = events.batch_end_payload(3, {"score": 0.5, "bad": float("nan"), "flag": True},
                                       rollouts="/data/r.jsonl", event_id="e-1")
    trigger = Trigger.parse(payload["trigger"])
    assert trigger == Trigger(event_id="e-1", step=3, metrics={"score": 0.5},
                              rollouts="/data/r.jsonl")
    # The round runs in another folder: a path relative to the trainer is sent absolute.
    relative = events.batch_end_payload(4, rollouts="batch-4.jsonl")["trigger"]["rollouts"]
    assert relative == str(Path.cwd() / "batch-4.jsonl")
    assert Trigger.parse({"step": 4, "rollouts": relative}).rollouts == relative
