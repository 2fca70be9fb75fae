"""The Prefect server goes down while a model trains: training goes on, and no batch end
is lost.

Our own `prefect server start` (this test stops it; SQLite under a folder of ours), the
round served by `dyngen serve`, and a simulated training loop calling `emit_batch_end`
after every batch. With the store, the batch ends emitted while the server is down are in
its inbox, their wake-ups are not kept, and the first round after it is back covers them.
Without a store, their events wait in the outbox; the first emit after it is back delivers
them, in order, and every one of them gets its round.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def train(server: LocalServer, steps: list[int], batch_seconds: float = 0.05,
          dataset: str = DATASET, **emit: Any) -> list[tuple[str | None, float]]:
    """A training loop: a batch of 'work', then a batch end; (event id, seconds) each."""
    out = []
    for step in steps:
        time.sleep(batch_seconds)  # the batch
        start = time.monotonic()
        sent = events.emit_batch_end(dataset, step, {"score": step / 10},
                                     api_url=server.api_url, **emit)
        out.append((sent, time.monotonic() - start))
    return out


def wait_until_covered(store: Store, name: str, count: int, log: Path,
                       timeout: float = 240.0) -> list:
    """The dataset's history once its inbox holds `count` batch ends and none is pending."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(store.batch_ends(name)) >= count and not store.pending(name):
            return store.history(name)
        time.sleep(0.5)
    raise AssertionError(f"{len(store.pending(name))} batch end(s) still pending; log:\n"
                         f"{log.read_text()[-4000:]}")


@pytest.fixture
def trainer(tmp_path: Path, caplog: pytest.LogCaptureFixture,
            monkeypatch: pytest.MonkeyPatch) -> None:
    """A trainer's process: its own outbox, no outage seen yet, its warnings captured."""
    monkeypatch.setattr(events, "_server_down", False)
    monkeypatch.setenv("DYNGEN_OUTBOX", str(tmp_path / "outbox"))
    caplog.set_level(logging.WARNING, logger="dyngen.trainers.events")


@pytest.mark.usefixtures("trainer")
def test_a_batch_end_recorded_in_the_store_during_an_outage_is_covered_after_it(
    own_server: LocalServer, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    name, run = "outage-stored", "job-1"
    store = Store(tmp_path / "store")
    store.create(name, verl_rows(4))
    log = tmp_path / "serve.log"

    with serving(own_server, store, name, log):
        before = train(own_server, BEFORE, dataset=name, store=store, run=run)
        wait_until_covered(store, name, len(BEFORE), log)
        finished_runs(own_server, name, len(BEFORE))

        own_server.stop()  # the outage
        during = train(own_server, DURING, batch_seconds=OUTAGE_SECONDS / len(DURING),
                       dataset=name, store=store, run=run)
        waiting = Outbox().pending(own_server.api_url)
        own_server.start()
        after = train(own_server, AFTER, dataset=name, store=store, run=run)
        total = len(BEFORE) + len(DURING) + len(AFTER)
        history = wait_until_covered(store, name, total, log)
        finished_runs(own_server, name, len(BEFORE) + len(AFTER))  # one per wake-up

    # Training went on, every batch end kept by the store, no wake-up kept for later.
    assert all(sent for sent, _ in before + during + after)
    assert waiting == [] and Outbox().pending(own_server.api_url) == []
    slowest = max(seconds for _, seconds in during + after)
    assert slowest <= CALL_SECONDS, f"an emit took {slowest:.1f} s"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    not_sent = [w for w in warnings if "was not sent" in w]
    assert len(not_sent) == 1 and "the batch end is in the store's inbox" in not_sent[0]
    assert any("reachable again" in w for w in warnings), warnings

    # Nothing lost: each batch end covered by exactly one version.
    covered = sorted(c for rec in history[1:] for c in rec.covers)
    assert covered == [(run, s) for s in BEFORE + DURING + AFTER]
    assert verify(store, name) == []
    print(f"\noutage with a store: {len(DURING)} batch ends recorded while the server was "
          f"down, none queued; slowest emit {slowest:.2f} s; versions cover "
          f"{[sorted(s for _, s in rec.covers) for rec in history[1:]]}")


@pytest.mark.usefixtures("trainer")
def test_no_batch_end_is_lost_in_a_server_outage(
    own_server: LocalServer, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
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
