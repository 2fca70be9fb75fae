"""The Prefect server goes down while a model trains: training goes on, and no batch end
is lost.

Our own `prefect server start` (this test stops it; SQLite under a folder of ours), the
round served by `dyngen serve`, and a simulated training loop calling `emit_batch_end`
after every batch. Batch ends emitted while the server is down wait in the outbox; the
first emit after it is back delivers them, in order, and every one of them gets its round.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import dyngen.trainers.events as events
from dyngen.server.local import LocalServer
from dyngen.store import Store, verify
from dyngen.trainers.outbox import Outbox
from tests.e2e.test_triggered_rounds import finished_runs, serving, wait_for_versions
from tests.rows import verl_rows

DATASET = "outage"
BEFORE, DURING, AFTER = [1, 2], [3, 4, 5, 6, 7], [8, 9]
CALL_SECONDS = 3.0  # the most a training step may wait for an emit
OUTAGE_SECONDS = 6.0


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    """A server of this module's own, which its tests stop and start (each leaves it up)."""
    srv = LocalServer(tmp_path_factory.mktemp("prefect")).start()
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


def test_no_batch_end_is_lost_in_a_server_outage(
    own_server: LocalServer, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(events, "_server_down", False)
    monkeypatch.setenv("DYNGEN_OUTBOX", str(tmp_path / "outbox"))
    caplog.set_level(logging.WARNING, logger="dyngen.trainers.events")
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
        queued = len(Outbox().pending(own_server.api_url))
        after = train(own_server, AFTER)
        serve_survived_restart = serve.poll() is None
        total = len(BEFORE) + len(DURING) + len(AFTER)
        history = wait_for_versions(store, DATASET, total, log)
        finished_runs(own_server, DATASET, total)

    # Training went on: every call returned within CALL_SECONDS, the outage's events queued.
    assert all(sent for sent, _ in during), "an event of the outage was dropped"
    assert queued == len(DURING)
    slowest = max(seconds for _, seconds in during + after)
    assert slowest <= CALL_SECONDS, f"an emit took {slowest:.1f} s"
    assert all(sent for sent, _ in after), "events were not sent after the server came back"
    assert Outbox().pending(own_server.api_url) == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len([w for w in warnings if "was not sent" in w]) == 1, warnings
    assert any("reachable again" in w and f"{len(DURING)} sent from the outbox" in w
               for w in warnings), warnings

    # Nothing lost: every batch end, the outage's included, got exactly one round.
    steps = [rec.lineage["trigger"]["step"] for rec in history[1:]]
    assert sorted(steps) == BEFORE + DURING + AFTER
    ids = [rec.lineage["trigger"]["event_id"] for rec in history[1:]]
    assert sorted(ids) == sorted(sent for sent, _ in before + during + after)
    assert verify(store, DATASET) == []
    print(f"\noutage: {len(DURING)} batch ends in {outage_seconds:.1f} s while the server "
          f"was down, all queued; slowest emit {slowest:.2f} s; serve survived the outage: "
          f"{serve_survived_outage}, the restart: {serve_survived_restart}; rounds for steps "
          f"{sorted(steps)}")


def test_a_round_slot_held_across_a_server_restart_is_released_after_it(
        own_server: LocalServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from dyngen.round import slot

    # Without leases on disk the restarted server has forgotten the lease: the release
    # below fails and the next round of the dataset waits until this limit.
    monkeypatch.setattr(slot, "GUARD_TIMEOUT_SECONDS", 20.0)
    with temporary_settings({PREFECT_API_URL: own_server.api_url}):
        lease = slot._acquire_slot("restarted")
        own_server.stop()
        own_server.start()
        with get_client(sync_client=True) as client:
            client.release_concurrency_slots_with_lease(lease)
        started = time.monotonic()
        slot._acquire_slot("restarted")
    assert time.monotonic() - started < 10


def test_serve_started_while_the_server_is_down_waits_for_it(
        own_server: LocalServer, tmp_path: Path) -> None:
    """A `dyngen serve` (re)started during an outage waits and then serves (it used to exit
    with a ConnectError: found by the chaos test)."""
    from dyngen.server.local import spawn, stop, wait_for_automation
    from dyngen.trainers.events import trigger_name
    from tests.e2e.conftest import DYNGEN, REPO, env_for
    from tests.e2e.test_triggered_rounds import ROUND_CONFIG

    store = Store(tmp_path / "store")
    store.create(DATASET, verl_rows(4))
    log = tmp_path / "serve.log"
    own_server.stop()
    serve = spawn([*DYNGEN, "--root", str(store.root), "serve", "--dataset", DATASET,
                   *ROUND_CONFIG], env_for(own_server), log, cwd=REPO)
    try:
        time.sleep(8)
        assert serve.poll() is None, log.read_text()
        own_server.start()
        wait_for_automation(own_server.api_url, trigger_name(DATASET))
        assert events.emit_batch_end(DATASET, 1, api_url=own_server.api_url)
        wait_for_versions(store, DATASET, 1, log)
        finished_runs(own_server, DATASET, 1)
    finally:
        stop(serve)
    assert "unreachable" in log.read_text()
