"""The outbox keeps batch ends the server could not take, and delivers them in order, once."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
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
    assert Outbox().pending(live) == []
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
    assert (result.status, result.pending) == ("sent", 0)
    assert str(bad) in caplog.text and "not an event" in caplog.text
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


def test_an_event_the_server_took_and_lost_is_sent_again_and_one_it_stored_is_forgotten(
        outbox_dir: Path, prefect_server: None) -> None:
    from prefect.settings import PREFECT_API_URL

    from dyngen.trainers.outbox import CONFIRM_AFTER_SECONDS, SENT_DIR

    live = str(PREFECT_API_URL.value())
    box = Outbox()
    stored = events.send_batch_end("outbox-lost", 1, api_url=live)
    assert stored.status == "sent" and len(box.unconfirmed(live)) == 1
    # What a server killed right after answering leaves: an event it took and never
    # stored (here: one it never saw), in sent/ since before the confirmation delay.
    lost = box._write(live, events.batch_end_event("outbox-lost", events.batch_end_payload(2)),
                      sub=SENT_DIR)
    assert server_steps(live, "outbox-lost", 1) == [1]  # the server stored step 1 only
    old = time.time() - CONFIRM_AFTER_SECONDS - 1
    for path in box.unconfirmed(live):
        os.utime(path, (old, old))
    after = events.send_batch_end("outbox-lost", 3, api_url=live)
    assert (after.status, after.delivered) == ("sent", 2)  # step 2 again, then step 3
    assert not lost.exists()
    assert server_steps(live, "outbox-lost", 3) == [1, 2, 3]
    # Stored by now: each is forgotten once the delay has passed, none sent twice.
    for path in box.unconfirmed(live):
        os.utime(path, (old, old))
    assert events.flush_outbox(live).unconfirmed == 0
    assert box.unconfirmed(live) == [] and box.pending(live) == []
    assert server_steps(live, "outbox-lost", 3) == [1, 2, 3]
