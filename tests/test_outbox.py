"""The outbox keeps the events the server could not take (batch ends without a store), and
delivers them in order, once: an event the server answered 2xx for is gone from it."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

import dyngen.trainers.events as events
from dyngen.trainers.outbox import Outbox
from tests.support import UNUSED_API, server_steps

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def outbox_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setattr(events, "_server_down", False)
    monkeypatch.setenv("DYNGEN_OUTBOX", str(tmp_path / "outbox"))
    return tmp_path / "outbox"


def queued_steps(api_url: str) -> list[int]:
    """The steps of the events waiting for `api_url`, in the order they will be sent."""
    return [json.loads(p.read_text())["payload"]["trigger"]["step"]
            for p in Outbox().pending(api_url)]


def test_events_wait_in_order_and_a_full_outbox_drops_with_a_warning(
        outbox_dir: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("DYNGEN_OUTBOX_MAX_EVENTS", "3")
    caplog.set_level(logging.WARNING)
    results = [events.send_batch_end("ds", step, api_url=UNUSED_API) for step in range(1, 6)]
    assert [r.status for r in results] == ["queued"] * 3 + ["dropped"] * 2
    assert events.emit_batch_end("ds", 6, api_url=UNUSED_API) is None  # still full
    assert queued_steps(UNUSED_API) == [1, 2, 3]
    assert all(p.is_relative_to(outbox_dir) for p in Outbox().pending(UNUSED_API))
    full = [r.getMessage() for r in caplog.records if "limit" in r.getMessage()]
    assert len(full) == 1, full  # once, not once per dropped event
    assert "step 4" in full[0] and "dyngen emit --flush" in full[0]
    assert "DYNGEN_OUTBOX_MAX_EVENTS" in full[0]


def test_queued_events_go_first_in_order_once_when_the_server_takes_them(
        outbox_dir: Path, prefect_server: None) -> None:
    from prefect.settings import PREFECT_API_URL

    live = str(PREFECT_API_URL.value())
    # Queued while this server was away (events are kept per server address).
    box = Outbox()
    for step in (1, 2, 3):
        payload = events.batch_end_payload(step, {"score": step / 10})
        box._write(live, events.batch_end_event("outbox-order", payload))
    first = events.send_batch_end("outbox-order", 4, api_url=live)
    assert (first.status, first.delivered, first.pending) == ("sent", 4, 0), first.reason
    # Taken is gone: nothing of the events is kept once the server answered 2xx.
    assert sorted(p.name for p in box.folder(live).iterdir()) == [".lock", "server.txt"]
    assert events.flush_outbox(live).delivered == 0  # nothing is sent twice
    assert server_steps(live, "outbox-order", 4) == [1, 2, 3, 4]


def test_an_unreadable_or_refused_event_does_not_hold_back_the_rest(
        outbox_dir: Path, prefect_server: None, caplog: pytest.LogCaptureFixture) -> None:
    from prefect.settings import PREFECT_API_URL

    live = str(PREFECT_API_URL.value())
    box = Outbox()
    box._write(live, events.batch_end_event("outbox-bad", events.batch_end_payload(1)))
    bad = box._write(live, {"x": 1})
    bad.write_text("{not json")
    refused = box._write(live, {"event": "no resource", "payload": {"trigger": {"step": 2}}})
    box._write(live, events.batch_end_event("outbox-bad", events.batch_end_payload(3)))
    caplog.set_level(logging.WARNING, logger="dyngen.trainers.outbox")
    result = events.flush_outbox(live)
    assert (result.status, result.delivered, result.pending) == ("sent", 2, 0)  # taken only
    assert str(bad) in caplog.text and "not an event" in caplog.text and not bad.exists()
    assert "refused batch-end event" in caplog.text and "step 2" in caplog.text
    kept = list((refused.parent / "refused").glob("*.json"))  # kept for a human, not resent
    assert [json.loads(k.read_text())["event"] for k in kept] == ["no resource"]
    assert server_steps(live, "outbox-bad", 2) == [1, 3]


def test_emit_flush_from_the_command_line(outbox_dir: Path, prefect_server: None) -> None:
    from prefect.settings import PREFECT_API_URL

    live = str(PREFECT_API_URL.value())
    for step in (1, 2):
        Outbox()._write(live, events.batch_end_event("outbox-cli",
                                                     events.batch_end_payload(step)))
    env = {"PATH": "/usr/bin:/bin", "PREFECT_API_URL": live, "DYNGEN_OUTBOX": str(outbox_dir),
           "PREFECT_HOME": str(outbox_dir.parent / "home")}
    run = subprocess.run([sys.executable, "-m", "dyngen.cli", "emit", "--flush"], env=env,
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "delivered 2 queued event(s); 0 still in the outbox" in run.stdout
    assert server_steps(live, "outbox-cli", 2) == [1, 2]

    down = subprocess.run([sys.executable, "-m", "dyngen.cli", "emit", "outbox-cli", "--step",
                           "3"], env={**env, "PREFECT_API_URL": UNUSED_API}, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr  # a training script under `set -e` goes on
    assert "queued dyngen.batch.ended for 'outbox-cli' step 3" in down.stdout
    still = subprocess.run([sys.executable, "-m", "dyngen.cli", "emit", "--flush"],
                           env={**env, "PREFECT_API_URL": UNUSED_API}, cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert still.returncode == 1 and "1 still in the outbox" in still.stdout
    assert "unreachable" in still.stdout
