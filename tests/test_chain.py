"""Each batch end names the one sent before it for the same dataset and server
(`trigger.previous`), across processes, so a round can wait for that one's run
(tests/flows/test_step_order.py shows the round's side).

The servers here are ports where nothing listens: every event waits in the outbox, where
its payload is read back exactly as the server would get it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dyngen.trainers.events as events
from dyngen.round import Trigger
from dyngen.server.local import free_port
from dyngen.trainers.chain import CHAIN_DIR
from dyngen.trainers.outbox import MAX_EVENTS_ENV, OUTBOX_ENV, Outbox

SERVERS = [f"http://127.0.0.1:{free_port()}/api" for _ in range(2)]


def queued(root: Path, api_url: str) -> dict[str, dict[str, Any]]:
    """The outbox's events for a server: event id -> the trigger the round would get."""
    out = {}
    for path in Outbox(root).pending(api_url):
        trigger = json.loads(path.read_text())["payload"]["trigger"]
        Trigger.parse(trigger)  # what the round accepts
        out[trigger["event_id"]] = trigger
    return out


emits = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 6),
                           st.sampled_from([0, 1]), st.booleans()), min_size=1, max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(emits)
def test_each_event_names_the_last_one_kept_for_its_dataset_and_server_if_its_step_was_lower(
        tmp_path_factory: pytest.TempPathFactory, plan: list[tuple[str, int, int, bool]]
        ) -> None:
    """A model: the last event kept (queued or sent) per (server, dataset); a dropped one
    (the outbox full) is never named."""
    root = tmp_path_factory.mktemp("outbox")
    last: dict[tuple[int, str], tuple[str, int]] = {}
    expected: dict[str, dict[str, Any] | None] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(OUTBOX_ENV, str(root))
        mp.setattr(events, "_server_down", True)  # one warning per outage: said already
        for dataset, step, server, full in plan:
            mp.setenv(MAX_EVENTS_ENV, "1" if full else "1000")
            kept_before = len(Outbox(root).pending(SERVERS[server]))
            sent = events.send_batch_end(dataset, step, api_url=SERVERS[server])
            if full and kept_before >= 1:
                assert sent.status == "dropped"
                continue
            assert sent.status == "queued"
            before = last.get((server, dataset))
            expected[sent.event_id] = None if before is None or before[1] >= step else \
                {"event_id": before[0], "step": before[1]}
            last[(server, dataset)] = (sent.event_id, step)
    found = {**queued(root, SERVERS[0]), **queued(root, SERVERS[1])}
    assert set(found) == set(expected)
    for event_id, trigger in found.items():
        previous = trigger.get("previous")
        if expected[event_id] is None:
            assert previous is None
        else:
            assert previous is not None
            assert {k: previous[k] for k in ("event_id", "step")} == expected[event_id]
            assert 0 <= previous["seconds_before"] < 60


def emit(env: dict[str, str], *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "dyngen.cli", "emit", *args], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr  # queued is not a failure


def test_dyngen_emit_run_once_per_batch_links_its_events_and_a_broken_chain_file_is_skipped(
        tmp_path: Path) -> None:
    root = tmp_path / "outbox"
    env = {**os.environ, OUTBOX_ENV: str(root), "PREFECT_API_URL": SERVERS[0]}
    emit(env, "ds", "--step", "3", "--event-id", "third")
    emit(env, "ds", "--step", "4", "--event-id", "fourth")
    triggers = queued(root, SERVERS[0])
    assert "previous" not in triggers["third"]
    assert triggers["fourth"]["previous"]["event_id"] == "third"
    assert triggers["fourth"]["previous"]["step"] == 3

    for path in (root / Outbox(root).folder(SERVERS[0]).name / CHAIN_DIR).glob("*.json"):
        path.write_text('{"event_id": "x", "step": "not a step"}')
    emit(env, "ds", "--step", "5", "--event-id", "fifth")
    emit(env, "ds", "--step", "6", "--event-id", "sixth")
    triggers = queued(root, SERVERS[0])
    assert "previous" not in triggers["fifth"]  # sent all the same, unlinked
    assert triggers["sixth"]["previous"]["event_id"] == "fifth"
