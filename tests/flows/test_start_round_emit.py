"""`generate_on_start` in emit mode: the event goes to a real Prefect server, and the dataset
waits (up to its timeout) for the version the event's round commits."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from dyngen.store import Store
from dyngen.trainers.dataset import DyngenDataset, start_event_id
from tests.rows import verl_rows

pytestmark = pytest.mark.usefixtures("prefect_server")


def test_emit_mode_waits_for_the_start_rounds_version(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", verl_rows(3))
    event_id = start_event_id("ds", store.head("ds"))

    def worker() -> None:  # what the served round does with the event: commit under its id
        time.sleep(1.0)
        Store(tmp_path).append("ds", verl_rows(2, start=10), idempotency_key=f"event:{event_id}",
                               lineage={"round": 1, "generator": {"class": "Gen"}})

    thread = threading.Thread(target=worker)
    thread.start()
    started = time.monotonic()
    data = DyngenDataset(tmp_path, "ds", generate_on_start=True, start_timeout=60)
    thread.join()
    assert data.start_round == event_id and time.monotonic() - started >= 1.0
    assert (data.version, len(data)) == (1, 5)


def test_emit_mode_gives_up_after_the_timeout_and_serves_the_head(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = Store(tmp_path)
    store.create("ds", verl_rows(3))
    caplog.set_level(logging.WARNING, logger="dyngen")
    started = time.monotonic()
    data = DyngenDataset(tmp_path, "ds", generate_on_start=True, start_timeout=1)
    assert 1 <= time.monotonic() - started < 10
    assert (data.version, len(data)) == (0, 3)
    assert "did not commit within 1 s; training starts on version 0" in caplog.text
