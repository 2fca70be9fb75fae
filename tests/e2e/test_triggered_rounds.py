"""End to end: a real `prefect server start` with basic auth on, the round served or deployed
with its event trigger, batch-end events from other processes, committed versions with their
lineage; an emit without the credentials is refused and training goes on."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from subprocess import Popen

import pytest

import dyngen.trainers.events as events
from dyngen.server.local import LocalServer, spawn, stop, wait_for_automation
from dyngen.store import Store, VersionRecord, verify
from dyngen.trainers.events import trigger_name
from tests.e2e.conftest import DYNGEN, PREFECT, REPO, env_for, prefect_cli, seeded
from tests.support import server_steps

ROUND_CONFIG = ["data.datagen.path=pkg://tests.flows.gens", "data.datagen.name=UsesContext"]

_EMITTER = """
import json, sys
from dyngen.trainers.events import emit_batch_end
dataset, steps = sys.argv[1], [int(s) for s in sys.argv[2:]]
print(json.dumps([emit_batch_end(dataset, s, {"score": s / 10}) for s in steps]))
"""


def wait_for_versions(store: Store, name: str, count: int, log: Path,
                      timeout: float = 240.0) -> list[VersionRecord]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (store.head_version(name) or 0) >= count:
            return store.history(name)
        time.sleep(0.5)
    raise AssertionError(f"only {store.head_version(name)} of {count} rounds committed; "
                         f"log:\n{log.read_text()[-4000:]}")


def finished_runs(server: LocalServer, dataset: str, count: int,
                  timeout: float = 120.0) -> list:
    """The dataset's flow runs once `count` of them are in a final state.

    Stopping a runner while a run is still publishing would leave the deployment's
    concurrency slot taken until its lease expires, delaying the next test's rounds.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    deadline = time.monotonic() + timeout
    with server.client_settings(), get_client(sync_client=True) as client:
        while True:
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=[f"dataset:{dataset}"])))
            done = [r for r in runs if r.state is not None and r.state.is_final()]
            if len(done) >= count or time.monotonic() > deadline:
                return done
            time.sleep(0.5)


def emit_from_another_process(server: LocalServer, name: str, steps: list[int]) -> list[str]:
    out = subprocess.run([sys.executable, "-c", _EMITTER, name, *map(str, steps)],
                         env=env_for(server), cwd=REPO, capture_output=True, text=True,
                         timeout=120, check=True)
    ids = json.loads(out.stdout.strip().splitlines()[-1])
    assert all(ids), f"an event was not sent: {out.stderr}"
    return ids


@contextmanager
def serving(server: LocalServer, store: Store, name: str, log: Path,
            config: Sequence[str] = ROUND_CONFIG, isolation: str = "fork",
            catch_up_seconds: float = 0, **env: str) -> Iterator[Popen]:
    """`dyngen serve --dataset name` in its own process, its trigger registered; without
    the catch-up schedule unless asked (its runs would add to the runs a test counts)."""
    serve = spawn([*DYNGEN, "--root", str(store.root), "serve", "--dataset", name,
                   "--isolation", isolation, "--catch-up-seconds", str(catch_up_seconds),
                   *config], env_for(server, **env), log, cwd=REPO)
    try:
        wait_for_automation(server.api_url, trigger_name(name), auth_string=server.auth_string)
        yield serve
    finally:
        stop(serve)
    assert serve.poll() is not None


def test_served_round_commits_one_version_per_batch_event(auth_server: LocalServer,
                                                          tmp_path: Path) -> None:
    store = seeded(tmp_path, "served")
    log = tmp_path / "serve.log"
    with serving(auth_server, store, "served", log):
        event_ids = emit_from_another_process(auth_server, "served", [1, 2, 3])
        history = wait_for_versions(store, "served", 3, log)
        assert len(finished_runs(auth_server, "served", 3)) == 3
    by_step = {r.lineage["trigger"]["step"]: r for r in history[1:]}
    assert sorted(by_step) == [1, 2, 3]
    for step, event_id in zip((1, 2, 3), event_ids, strict=True):
        rec = by_step[step]
        assert rec.lineage["trigger"]["event_id"] == event_id
        assert rec.lineage["trigger"]["metrics"] == {"score": step / 10}
        assert rec.idempotency_key == f"event:{event_id}"
    assert verify(store, "served") == []


def test_rounds_served_by_prefects_runner_a_fresh_process_each_commit_too(
        auth_server: LocalServer, tmp_path: Path) -> None:
    store = seeded(tmp_path, "isolated")
    log = tmp_path / "serve.log"
    with serving(auth_server, store, "isolated", log, isolation="process"):
        (event_id,) = emit_from_another_process(auth_server, "isolated", [4])
        (_, rec) = wait_for_versions(store, "isolated", 1, log)
        (run,) = finished_runs(auth_server, "isolated", 1)
    assert rec.lineage["trigger"]["event_id"] == event_id
    assert run.state.is_completed() and run.deployment_id is not None
    assert "runs forked from a warm process" not in log.read_text()


def test_five_events_at_once_run_five_rounds_one_after_another(auth_server: LocalServer,
                                                               tmp_path: Path) -> None:
    store = seeded(tmp_path, "burst")
    log = tmp_path / "serve.log"
    with serving(auth_server, store, "burst", log):
        emitters = [subprocess.Popen([*DYNGEN, "emit", "burst", "--step", str(step)],
                                     env=env_for(auth_server), cwd=REPO, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True) for step in range(1, 6)]
        for proc in emitters:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
        history = wait_for_versions(store, "burst", 5, log)
        runs = finished_runs(auth_server, "burst", 5)
    assert [r.version for r in history] == [0, 1, 2, 3, 4, 5]
    assert [r.parent for r in history[1:]] == [0, 1, 2, 3, 4]
    assert sorted(r.lineage["trigger"]["step"] for r in history[1:]) == [1, 2, 3, 4, 5]
    assert store.load("burst").num_rows == 4 + 5  # one new row per round, none lost
    spans = sorted((r.start_time, r.end_time) for r in runs if r.state.is_completed())
    assert len(spans) == 5
    assert all(prev[1] <= nxt[0] for prev, nxt in zip(spans, spans[1:], strict=False)), \
        "two rounds of one dataset ran at the same time"


def test_prefect_deploy_all_with_a_process_worker_runs_an_event_triggered_round(
    auth_server: LocalServer, tmp_path: Path,
) -> None:
    store = seeded(tmp_path, "deployed")
    env = env_for(auth_server, DYNGEN_STORE_ROOT=str(store.root),
                  PREFECT_WORKER_QUERY_SECONDS="1")
    # A user's folder: an unchanged copy of prefect.yaml, and modules of their own named as
    # dyngen's (the deployment names the round by module, so these are never imported).
    project = tmp_path / "project"
    project.mkdir()
    (project / "prefect.yaml").write_text((REPO / "prefect.yaml").read_text())
    for own in ("flows.py", "tasks.py"):
        (project / own).write_text(f"raise ImportError('dyngen imported the user\\'s {own}')\n")
    prefect_cli(env, "work-pool", "create", "dyngen", "--type", "process", "--overwrite")
    deployed = subprocess.run([PREFECT, "--no-prompt", "deploy", "--all"], env=env,
                              cwd=project, capture_output=True, text=True, timeout=300)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    assert "generation-round/on-batch-end" in deployed.stdout
    log = tmp_path / "worker.log"
    worker = spawn([PREFECT, "worker", "start", "--pool", "dyngen"], env, log, cwd=project)
    try:
        wait_for_automation(auth_server.api_url, trigger_name(None),
                            auth_string=auth_server.auth_string)
        (event_id,) = emit_from_another_process(auth_server, "deployed", [7])
        (_, rec) = wait_for_versions(store, "deployed", 1, log)
        finished_runs(auth_server, "deployed", 1)
    finally:
        stop(worker)
        # The session's server outlives this test: `dyngen serve` in a later one would
        # rightly refuse to replace a deployment of the work pool.
        for name in ("generation-round/on-batch-end", "store-maintenance/store-maintenance"):
            subprocess.run([PREFECT, "deployment", "delete", name], env=env, cwd=REPO,
                           capture_output=True, timeout=120)
    assert rec.lineage["trigger"]["event_id"] == event_id
    assert rec.lineage["trigger"]["step"] == 7
    # The generator prefect.yaml names, making new rows (not the mock's duplicate of row 0).
    assert rec.lineage["generator"]["name"] == "ArithmeticCurriculum"
    assert rec.lineage["counts"] == {"generated": 8, "kept": 8, "rejected": {}}


def test_an_emit_without_credentials_is_refused_with_one_warning_and_training_goes_on(
    auth_server: LocalServer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    from prefect.settings import PREFECT_API_AUTH_STRING, temporary_settings

    monkeypatch.setattr(events, "_server_down", False)
    monkeypatch.setenv("DYNGEN_OUTBOX", str(tmp_path / "outbox"))
    caplog.set_level(logging.WARNING, logger="dyngen.trainers.events")
    with temporary_settings(updates={PREFECT_API_AUTH_STRING: None}):
        sent = [events.send_batch_end("guarded", step, {"score": 0.5}, api_url=auth_server.api_url)
                for step in range(3)]  # a training loop: every step returns, none raises
    # Not taken, not lost: each waits in the outbox until the credentials are set.
    assert [(d.status, d.pending) for d in sent] == [("queued", 1), ("queued", 2), ("queued", 3)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "requires credentials (HTTP 401) and none are set" in warnings[0]
    assert "Training continues" in warnings[0]
    assert "set PREFECT_API_AUTH_STRING (user:password)" in warnings[0]
    assert "Start the server" not in warnings[0]  # the server is up; the setting is missing

    wrong = env_for(auth_server, PREFECT_API_AUTH_STRING="dyngen:wrong",
                    DYNGEN_OUTBOX=str(tmp_path / "outbox"))
    out = subprocess.run([*DYNGEN, "emit", "guarded", "--step", "4"], env=wrong, cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr  # a shell training loop goes on
    said = " ".join(out.stdout.split())  # rich wraps long lines
    assert "refused the credentials in PREFECT_API_AUTH_STRING (HTTP 401)" in said
    serve = subprocess.run([*DYNGEN, "--root", str(tmp_path / "store"), "serve", "--dataset",
                            "guarded", *ROUND_CONFIG], env=wrong, cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert serve.returncode == 2, serve.stderr
    assert "refused the request (HTTP 401)" in serve.stderr
    assert "set PREFECT_API_AUTH_STRING" in serve.stderr

    # With the credentials, the queued batch ends go out, in order, none lost.
    right = env_for(auth_server, DYNGEN_OUTBOX=str(tmp_path / "outbox"))
    flushed = subprocess.run([*DYNGEN, "emit", "--flush"], env=right, cwd=REPO,
                             capture_output=True, text=True, timeout=120)
    assert flushed.returncode == 0, flushed.stdout + flushed.stderr
    assert "delivered 4 queued event(s); 0 still in the outbox" in flushed.stdout
    assert sorted(server_steps(auth_server.api_url, "guarded", 4,
                               auth_server.auth_string)) == [0, 1, 2, 4]


_INBOX_EMITTER = """
import json, sys
from dyngen.trainers.events import emit_batch_end
root, dataset, steps = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3:]]
print(json.dumps([emit_batch_end(dataset, s, {"score": s / 10}, store=root, run="train-a")
                  for s in steps]))
"""


def test_batch_ends_written_while_a_round_runs_are_covered_by_the_next_round_at_once(
        auth_server: LocalServer, tmp_path: Path) -> None:
    # The trainer records each batch end in the store's inbox, then wakes a round. While
    # the round of step 1 runs, steps 2-6 arrive: the next round covers all five in one
    # version, and the rounds their events started find them covered and commit nothing.
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    store = seeded(tmp_path, "inboxed")
    log, started, release = tmp_path / "serve.log", tmp_path / "started", tmp_path / "release"
    config = ["data.datagen.path=pkg://tests.flows.gens", "data.datagen.name=HeldOpen",
              f"+data.datagen.started={started}", f"+data.datagen.release={release}"]

    def emit(steps: list[int]) -> None:
        out = subprocess.run([sys.executable, "-c", _INBOX_EMITTER, str(store.root), "inboxed",
                              *map(str, steps)], env=env_for(auth_server), cwd=REPO,
                             capture_output=True, text=True, timeout=120, check=True)
        assert all(json.loads(out.stdout.strip().splitlines()[-1])), out.stderr

    mine = FlowRunFilter(tags=FlowRunFilterTags(all_=["dataset:inboxed"]))
    with serving(auth_server, store, "inboxed", log, config=config):
        emit([1])
        deadline = time.monotonic() + 120
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert started.read_text() == "1", log.read_text()[-4000:]
        emit([2, 3, 4, 5, 6])
        # In the store before any round ran for them (step 1's round has not committed).
        assert [e.step for e in store.pending("inboxed")] == [1, 2, 3, 4, 5, 6]
        with auth_server.client_settings(), get_client(sync_client=True) as client:
            while len(client.read_flow_runs(flow_run_filter=mine)) < 6:
                assert time.monotonic() < deadline, "the batch ends' runs were not created"
                time.sleep(0.2)
        release.touch()
        history = wait_for_versions(store, "inboxed", 2, log)
        runs = finished_runs(auth_server, "inboxed", 6)
    assert [sorted(r.covers) for r in history[1:]] == [
        [("train-a", 1)], [("train-a", s) for s in range(2, 7)]]
    assert store.pending("inboxed") == [] and store.head_version("inboxed") == 2
    assert len(runs) == 6 and all(r.state.is_completed() for r in runs)
    assert verify(store, "inboxed") == []
