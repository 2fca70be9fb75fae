"""The Prefect server goes down while a model trains: training goes on, and rounds resume
once the server is back.

Our own `prefect server start` (this test stops it; SQLite under a folder of ours), the
round served by `dyngen serve`, and a simulated training loop calling `emit_batch_end`
after every batch. What is lost is stated by the assertions: batch ends emitted while the
server was down are not sent (the call returns None) and no round ever runs for them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import dyngen.events as events
from dyngen.local_server import LocalServer
from dyngen.store import Store, verify
from tests.e2e.test_triggered_rounds import finished_runs, serving, wait_for_versions
from tests.rows import verl_rows

DATASET = "outage"
BEFORE, DURING, AFTER = [1, 2], [3, 4, 5, 6, 7], [8, 9]
CALL_SECONDS = events.HEALTH_TIMEOUT_SECONDS + events.DRAIN_TIMEOUT_SECONDS
OUTAGE_SECONDS = 6.0


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[LocalServer]:
    srv = LocalServer(tmp_path / "prefect").start()
    yield srv
    srv.stop()


def train(server: LocalServer, steps: list[int],
          batch_seconds: float = 0.05) -> list[tuple[str | None, float]]:
    """A training loop: a batch of 'work', then a batch-end event; (event id, seconds) each."""
    out = []
    for step in steps:
        time.sleep(batch_seconds)  # the batch
        start = time.monotonic()
        sent = events.emit_batch_end(DATASET, step, {"score": step / 10},
                                     api_url=server.api_url)
        out.append((sent, time.monotonic() - start))
    return out


def test_training_survives_a_server_outage_and_rounds_resume_after_it(
    own_server: LocalServer, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from prefect.events.worker import EventsWorker

    monkeypatch.setattr(events, "_server_down", False)
    # Prefect keeps one events worker per process whatever the API URL, and
    # emit_batch_end(api_url=...) uses it: one left running by this session's flow runs
    # would send the first batch end to the session's server instead of ours.
    EventsWorker.drain_all(timeout=30)
    caplog.set_level(logging.WARNING, logger="dyngen.events")
    store = Store(tmp_path / "store")
    store.create(DATASET, verl_rows(4))
    log = tmp_path / "serve.log"

    with serving(own_server, store, DATASET, log) as serve:
        before = train(own_server, BEFORE)
        assert all(sent for sent, _ in before)
        wait_for_versions(store, DATASET, len(BEFORE), log)
        finished_runs(own_server, DATASET, len(BEFORE))

        own_server.stop()  # the outage
        started = time.monotonic()
        # Long enough for the serve process to fail several polls of the server.
        during = train(own_server, DURING, batch_seconds=OUTAGE_SECONDS / len(DURING))
        outage_seconds = time.monotonic() - started
        serve_survived_outage = serve.poll() is None

        own_server.start()  # same home (SQLite) and port: the deployment and trigger persist
        after = train(own_server, AFTER)
        serve_survived_restart = serve.poll() is None
        history = wait_for_versions(store, DATASET, len(BEFORE) + len(AFTER), log)
        finished_runs(own_server, DATASET, len(BEFORE) + len(AFTER))

    # Training went on: every call returned, quickly, and the outage's events were not sent.
    assert [sent for sent, _ in during] == [None] * len(DURING)
    slowest = max(seconds for _, seconds in during)
    assert slowest < CALL_SECONDS, f"an emit during the outage took {slowest:.1f} s"
    assert all(sent for sent, _ in after), "events were not sent after the server came back"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len([w for w in warnings if "was not sent" in w]) == 1, warnings
    assert any("reachable again" in w for w in warnings), warnings

    # Rounds resumed; the outage's batch ends never got a round (that is what is lost).
    steps = [rec.lineage["trigger"]["step"] for rec in history[1:]]
    assert sorted(steps) == BEFORE + AFTER
    assert not set(steps) & set(DURING)
    assert verify(store, DATASET) == []
    print(f"\noutage: {len(DURING)} batch ends in {outage_seconds:.1f} s while the server "
          f"was down (slowest emit {slowest:.2f} s), all None; serve survived the outage: "
          f"{serve_survived_outage}, the restart: {serve_survived_restart}; rounds for steps "
          f"{sorted(steps)}, none for {DURING}")


def test_a_round_slot_held_across_a_server_restart_is_released_after_it(
        own_server: LocalServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows import round_guard

    # Without leases on disk the restarted server has forgotten the lease: the release
    # below fails and the next round of the dataset waits until this limit.
    monkeypatch.setattr(round_guard, "GUARD_TIMEOUT_SECONDS", 20.0)
    with temporary_settings({PREFECT_API_URL: own_server.api_url}):
        lease = round_guard._acquire_slot("restarted")
        own_server.stop()
        own_server.start()
        with get_client(sync_client=True) as client:
            client.release_concurrency_slots_with_lease(lease)
        started = time.monotonic()
        round_guard._acquire_slot("restarted")
    assert time.monotonic() - started < 10
