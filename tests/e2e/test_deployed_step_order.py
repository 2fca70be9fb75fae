"""The `prefect.yaml` path as the docs give it: a real server, a process work pool, `prefect
deploy --all` with an unchanged copy of the file, and a worker started in a user's project
folder (its own `flows.py` and `tasks.py`). Batch ends commit with the generator prefect.yaml
names, in step order, bursts sent back to back too, and a batch end whose run the server
makes before the earlier one's."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from dyngen.round.step_order import GAVE_WAY_LABEL
from dyngen.server.local import LocalServer, spawn, stop, wait_for_automation
from dyngen.store import Store, VersionRecord, verify
from dyngen.trainers.events import batch_end_event, batch_end_payload, emit_batch_end, trigger_name
from dyngen.trainers.outbox import send_events
from tests.e2e.conftest import DYNGEN, PREFECT, REPO, env_for, seeded
from tests.e2e.test_triggered_rounds import finished_runs, wait_for_versions

DATASET = "in-step-order"
BURSTS = [(2, 3, 4), (5, 6, 7)]
LATE = 8  # then 9, whose batch end the server gets first
# Imported by mistake, these fail the round that imported them.
USER_MODULE = "raise ImportError('dyngen imported the user\\'s own {name}')\n"


def user_folder(tmp_path: Path) -> Path:
    """A user's project folder: its own flows.py and tasks.py, and a copy of prefect.yaml."""
    folder = tmp_path / "my-project"
    folder.mkdir()
    for name in ("flows.py", "tasks.py"):
        (folder / name).write_text(USER_MODULE.format(name=name))
    shutil.copy(REPO / "prefect.yaml", folder / "prefect.yaml")
    return folder


def prefect(env: dict[str, str], cwd: Path, *args: str) -> str:
    out = subprocess.run([PREFECT, *args], env=env, cwd=cwd, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def delete_deployments(env: dict[str, str], cwd: Path) -> None:
    """The session's server outlives this test: its trigger would start later tests' runs."""
    for name in ("generation-round/on-batch-end", "store-maintenance/store-maintenance"):
        subprocess.run([PREFECT, "deployment", "delete", name], env=env, cwd=cwd,
                       capture_output=True, timeout=120)


def committed_steps(store: Store, name: str, count: int, log: Path) -> list[VersionRecord]:
    history = wait_for_versions(store, name, count, log)
    return history[1:]


def send(server: LocalServer, step: int, event_id: str,
         previous: dict[str, Any] | None = None) -> None:
    payload = batch_end_payload(step, {"score": 0.9}, event_id=event_id, previous=previous)
    send_events(server.api_url, [batch_end_event(DATASET, payload)])


def gave_way(server: LocalServer, event_id: str, timeout: float = 180.0) -> None:
    """Wait until the run of `event_id` has given its place back at least once."""
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout
    with server.client_settings(), get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            for run in client.read_flow_runs():
                if (run.parameters.get("trigger") or {}).get("event_id") == event_id \
                        and GAVE_WAY_LABEL in run.labels:
                    return
            time.sleep(0.5)
    raise AssertionError(f"the run of {event_id} did not give its place back in {timeout} s")


def test_prefect_yaml_with_a_worker_in_a_user_folder_commits_bursts_in_step_order(
        server: LocalServer, tmp_path: Path) -> None:
    store = seeded(tmp_path, DATASET)
    project = user_folder(tmp_path)
    env = env_for(server, DYNGEN_STORE_ROOT=str(store.root), PREFECT_WORKER_QUERY_SECONDS="1")
    # As deployments.md gives it, from the user's folder.
    prefect(env, project, "work-pool", "create", "dyngen", "--type", "process", "--overwrite")
    deployed = prefect(env, project, "--no-prompt", "deploy", "--all")
    assert "generation-round/on-batch-end" in deployed
    log = tmp_path / "worker.log"
    worker = spawn([PREFECT, "worker", "start", "--pool", "dyngen"], env, log, cwd=project)
    try:
        wait_for_automation(server.api_url, trigger_name(None))
        emitted = subprocess.run([*DYNGEN, "emit", DATASET, "--step", "1", "--metric",
                                  "score=0.9"], env=env, cwd=project, capture_output=True,
                                 text=True, timeout=120)
        assert emitted.returncode == 0, emitted.stdout + emitted.stderr
        committed_steps(store, DATASET, 1, log)
        for burst in BURSTS:
            done = store.head_version(DATASET) or 0
            for step in burst:  # back to back, from the trainer's process
                assert emit_batch_end(DATASET, step, {"score": 0.9},
                                      api_url=server.api_url) is not None
            committed_steps(store, DATASET, done + len(burst), log)
        # The race a loaded machine once lost: the later batch end's run exists (and a
        # worker starts it) before the earlier one's. It names the earlier batch end
        # (trigger.previous, as a trainer sends it) and waits for its run to exist.
        done = store.head_version(DATASET) or 0
        send(server, LATE + 1, "late-second", previous={
            "event_id": "late-first", "step": LATE, "seconds_before": 0.5})
        gave_way(server, "late-second")
        send(server, LATE, "late-first")
        committed_steps(store, DATASET, done + 2, log)
        finished_runs(server, DATASET, 1 + sum(map(len, BURSTS)) + 2)
    finally:
        stop(worker)
        delete_deployments(env, project)

    history = store.history(DATASET)[1:]
    steps = [r.lineage["trigger"]["step"] for r in history]
    assert steps == list(range(1, LATE + 2)), f"committed out of step order: {steps}"
    assert history[-1].lineage["step_order"]["gave_way"] >= 1
    for record in history:
        assert record.lineage["generator"]["name"] == "ArithmeticCurriculum"
        assert record.lineage["counts"]["kept"] > 0  # new rows, not the mock's duplicate
        assert not (record.lineage.get("step_order") or {}).get("went_ahead_of")
    # The curriculum read each batch's score in turn: one level up per round.
    levels = [r.lineage["generator"]["state"]["level"] for r in history]
    assert levels == sorted(levels) and levels[-1] > levels[0], levels
    assert verify(store, DATASET) == []
    worker_log = log.read_text()
    assert "ImportError" not in worker_log and "set_working_directory" not in worker_log
