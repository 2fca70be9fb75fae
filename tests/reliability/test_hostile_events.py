"""Hostile batch-end events against the real served deployment: each run fails clearly and
once, nothing outside the store root (nor in it) is touched, and nothing a named file holds
is echoed.

A real `prefect server start` (basic auth on), `dyngen serve --dataset victim`, and raw
events emitted with `prefect.events.emit_event`, as anyone who can post events could send
them. The deployment's trigger matches the resource id `dyngen.dataset.victim`; the run's
dataset comes from the `dyngen.dataset` label and its trigger from the payload, so those
are where a hostile event lies: a path as the dataset name, wrong types, a payload of a
megabyte, unknown fields, no trigger at all, and a rollouts path at a file the worker can
read but must not: outside the allowed folder, a secret, a link to it, /dev/zero, a FIFO,
a file over the bound, a secret placed inside the folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dyngen.server.local import LocalServer
from dyngen.store import Store, verify
from dyngen.trainers.events import EVENT_NAME, emit_batch_end, resource_id
from dyngen.trainers.rollouts import rollouts_dir
from tests.e2e.conftest import auth_server  # noqa: F401  (a real server, basic auth on)
from tests.e2e.test_triggered_rounds import ROUND_CONFIG, serving, wait_for_versions
from tests.rows import verl_rows

DATASET = "victim"
MAX_BYTES = 4096
# The generator reads the trigger's rollouts (through the round context, as generators should).
SERVE_CONFIG = [*ROUND_CONFIG[:1], "data.datagen.name=ReadsRollouts",
                f"round.max_rollouts_bytes={MAX_BYTES}"]
SECRET = f"SECRET_TOKEN=sk-live-{secrets.token_hex(16)}"


@dataclass(frozen=True)
class Hostile:
    """An event's dyngen.dataset label (None: no label) and payload, and what it gets."""

    label: str | None
    payload: dict[str, Any]
    run_fails_with: str | None = None  # in the failed run's state message
    refused_with: str | None = None  # Prefect creates no run; its server log says why
    generator_runs: int = 0  # times the generator ran (and read the file) before failing


def _metrics(kilobytes: int) -> dict[str, float]:
    return {f"metric_{i:06d}": 0.5 for i in range(kilobytes * 1000 // 20)}


HOSTILE: dict[str, Hostile] = {
    "path traversal name": Hostile("../../etc", {"trigger": {"step": 1}},
                                   "invalid dataset name '../../etc'"),
    "no dataset label": Hostile(None, {"trigger": {"step": 2}}, "invalid dataset name ''"),
    "step is text": Hostile(DATASET, {"trigger": {"step": "abc"}},
                            "trigger.step must be a non-negative integer, found 'abc'"),
    "metrics is a list": Hostile(DATASET, {"trigger": {"step": 4, "metrics": [0.1, 0.2]}},
                                 "trigger.metrics must be a mapping"),
    "100 KB of metrics": Hostile(DATASET, {"trigger": {"step": 5, "metrics": _metrics(100)}},
                                 "larger than 65536 bytes"),
    "unknown fields": Hostile(DATASET, {"trigger": {"step": 6, "shell": "rm -rf /"}},
                              "unknown fields ['shell']"),
    "no trigger": Hostile(DATASET, {"note": "no trigger here"}, "trigger is empty"),
    # Prefect itself refuses these before any run exists (its limits, its parameter schema).
    "1 MB of metrics": Hostile(DATASET, {"trigger": {"step": 8, "metrics": _metrics(1000)}},
                               refused_with="Flow run parameters must be less than"),
    "trigger is text": Hostile(DATASET, {"trigger": "step=9"},
                               refused_with="'step=9' is not valid under any of the given"),
}


def rollouts_events(tmp: Path, allowed: Path) -> dict[str, Hostile]:
    """Events naming files the worker can read but must not; each file made here."""
    secret = tmp / "secret.env"
    secret.write_text(SECRET + "\n")
    (allowed / "notes.jsonl").symlink_to(secret)
    os.mkfifo(allowed / "pipe.jsonl")
    (allowed / "big.jsonl").write_text((SECRET + "\n") * 200)
    (allowed / "leaked.env").write_text(SECRET + "\n")
    outside = "is outside the allowed directories"
    cases = {"rollouts outside the folder": (secret, outside),
             "rollouts at a link out": (allowed / "notes.jsonl", outside),
             "rollouts at /dev/zero": ("/dev/zero", outside),
             "rollouts at a FIFO": (allowed / "pipe.jsonl", "is a FIFO (named pipe)"),
             "rollouts over the bound": (allowed / "big.jsonl",
                                         f"over the bound round.max_rollouts_bytes={MAX_BYTES}")}
    out = {case: Hostile(DATASET, {"trigger": {"step": 20 + i, "rollouts": str(path)}}, why)
           for i, (case, (path, why)) in enumerate(cases.items())}
    # A secret the folder should not hold: confinement lets it through, the generator reads
    # it, its first line is not rollouts; the error says so once and quotes nothing.
    out["rollouts at a secret inside"] = Hostile(
        DATASET, {"trigger": {"step": 30, "rollouts": str(allowed / "leaked.env")}},
        "line 1: expected a JSON object", generator_runs=1)
    return out


def leaked(text: str) -> list[str]:
    """The 8-byte pieces of the secret that occur in `text`."""
    return [SECRET[i:i + 8] for i in range(len(SECRET) - 7) if SECRET[i:i + 8] in text]


def snapshot(folder: Path, skip: Path) -> dict[str, str]:
    """Every file and folder under `folder` (but `skip`), with a digest of each file."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path == skip or skip in path.parents or "_serve" in path.parts:
            continue  # the logs; the serve's lease, which it renews
        rel = str(path.relative_to(folder))
        out[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
    return out


def emit_raw(srv: LocalServer, label: str | None, payload: dict[str, Any]) -> None:
    """One raw `dyngen.batch.ended` event for the served dataset's resource id, delivered."""
    from prefect.events import emit_event
    from prefect.events.worker import EventsWorker

    resource = {"prefect.resource.id": resource_id(DATASET)}
    if label is not None:
        resource["dyngen.dataset"] = label
    # Prefect keeps one events worker per process whatever the API URL: one started
    # earlier (by this session's flow runs) would send this event to its own server.
    # Each drain announces itself with a warning, which is noise here.
    worker_log = logging.getLogger("EventsWorker")
    level = worker_log.level
    worker_log.setLevel(logging.ERROR)
    try:
        EventsWorker.drain_all(timeout=30)
        with srv.client_settings():
            assert emit_event(EVENT_NAME, resource=resource, payload=payload,
                              id=uuid.uuid4()) is not None
            EventsWorker.drain_all(timeout=30)
    finally:
        worker_log.setLevel(level)


def final_runs(srv: LocalServer, count: int, timeout: float = 120.0) -> list[Any]:
    """The server's flow runs, once `count` of them are in a final state."""
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout
    with srv.client_settings(), get_client(sync_client=True) as client:
        while True:
            runs = [r for r in client.read_flow_runs(limit=200)
                    if r.state is not None and r.state.is_final()]
            if len(runs) >= count or time.monotonic() > deadline:
                return runs
            time.sleep(0.5)


def every_run(srv: LocalServer) -> list[tuple[str, str, str]]:
    """Name, state and parameters of each flow run on the server, final or not."""
    from prefect.client.orchestration import get_client

    with srv.client_settings(), get_client(sync_client=True) as client:
        return [(r.name, r.state.name if r.state else "-", json.dumps(r.parameters)[:120])
                for r in client.read_flow_runs(limit=200)]


def generate_run_counts(srv: LocalServer, run_ids: list[Any]) -> dict[str, list[int]]:
    """Per flow run: how many times each of its generate task runs ran."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with srv.client_settings(), get_client(sync_client=True) as client:
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(
            id=FlowRunFilterId(any_=run_ids)), limit=200)
    out: dict[str, list[int]] = {str(i): [] for i in run_ids}
    for t in tasks:
        if t.name.startswith("generate"):
            out[str(t.flow_run_id)].append(t.run_count)
    return out


def run_logs(srv: LocalServer, runs: list[Any], timeout: float = 60.0) -> str:
    """Every log line the runs sent to the API, once each run's exception is in (an ERROR
    with its traceback: what the issue found the secret in)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    deadline = time.monotonic() + timeout
    with srv.client_settings(), get_client(sync_client=True) as client:
        while True:
            logs, offset = [], 0
            while batch := client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(
                    any_=[r.id for r in runs])), limit=200, offset=offset):
                logs += batch
                offset += len(batch)
            failed = {log.flow_run_id for log in logs if "Encountered exception" in log.message}
            if failed >= {r.id for r in runs} or time.monotonic() > deadline:
                return "\n".join(log.message for log in logs)
            time.sleep(1)


def wait_for_log(log: Path, text: str, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return True
        time.sleep(0.5)
    return False


def test_hostile_events_fail_their_runs_clearly_and_touch_nothing(
    auth_server: LocalServer, tmp_path: Path,  # noqa: F811
) -> None:
    server = auth_server  # whoever posts these holds the credentials: auth is no defence here
    # The store sits two levels down, so "../../etc" from it names a real folder.
    sentinel = tmp_path / "outside" / "etc"
    sentinel.mkdir(parents=True)
    (sentinel / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    store = Store(tmp_path / "outside" / "srv" / "store")
    store.create(DATASET, verl_rows(4))
    allowed = rollouts_dir(store.root, DATASET, "run-1")  # where the trainer integrations write
    allowed.mkdir(parents=True)
    hostile = {**HOSTILE, **rollouts_events(tmp_path, allowed)}
    logs = tmp_path / "logs"
    before = snapshot(tmp_path, skip=logs)
    done_before = len(final_runs(server, 0))
    expect_runs = [case for case, h in hostile.items() if h.run_fails_with]
    good = allowed / "batch-10.jsonl"

    with serving(server, store, DATASET, logs / "serve.log", SERVE_CONFIG) as serve:
        for event in hostile.values():
            emit_raw(server, event.label, event.payload)
        # 13 runs, one at a time, each a new process: minutes on a loaded machine.
        runs = final_runs(server, done_before + len(expect_runs), timeout=900)
        refused = {case: wait_for_log(server.log, h.refused_with)
                   for case, h in hostile.items() if h.refused_with}
        assert snapshot(tmp_path, skip=logs) == before, "a hostile event changed files"
        assert store.head_version(DATASET) == 0

        # The served deployment is unharmed: a well-formed event still commits a round, and
        # a rollouts file in the allowed folder reaches the generator.
        good.write_text(json.dumps({"prompt": "What is 6 + 1?", "score": 0.2}) + "\n")
        with server.client_settings():
            assert emit_batch_end(DATASET, 10, {"score": 0.5}, str(good)) is not None
        (*_, committed) = wait_for_versions(store, DATASET, 1, logs / "serve.log")
        assert committed.lineage["trigger"]["rollouts"] == str(good)
        assert committed.lineage["counts"]["kept"] == 2  # the rollout's row and the step's
        final_runs(server, done_before + len(expect_runs) + 1)
        assert serve.poll() is None, "the serve process died"

    by_params = {_key(r.parameters.get("dataset"), r.parameters.get("trigger")): r
                 for r in runs}
    ours = [by_params.get(_key(h.label or "", h.payload.get("trigger", {})))
            for h in hostile.values() if h.run_fails_with]
    generated = generate_run_counts(server, [r.id for r in ours if r is not None])
    report = []
    for case, event in hostile.items():
        run = by_params.get(_key(event.label or "", event.payload.get("trigger", {})))
        if event.refused_with:
            assert run is None, f"{case}: a run was created: {run.state}"
            assert refused[case], f"{case}: the server log does not say why it refused"
            report.append(f"  {case:<28} no run: Prefect refused it ({event.refused_with}…)")
            continue
        assert run is not None, f"{case}: no final run; all runs: {every_run(server)}"
        assert run.state.is_failed(), f"{case}: {run.state.type} {run.state.message}"
        assert event.run_fails_with in (run.state.message or ""), run.state.message
        # Once: no flow retry, and an error that cannot pass is not retried either.
        assert run.run_count == 1, f"{case}: ran {run.run_count} times"
        assert generated[str(run.id)] == [1] * event.generator_runs, (case, generated)
        if "outside the allowed" in event.run_fails_with:
            assert str(store.root / "rollouts") in run.state.message  # where rollouts may be
        shown = run.state.message.replace(str(tmp_path), "<tmp>").split(": ", 1)[-1]
        report.append(f"  {case:<28} {run.state.name}: {shown[:120]}")
    print("\nhostile events:\n" + "\n".join(report))

    # Nothing any file held comes back: not in a state message, a log sent to the API (the
    # UI shows those), the serve process's output or the server's.
    sent = run_logs(server, [r for r in ours if r is not None])
    assert "Traceback" in sent and "is a FIFO" in sent  # the failures were logged, read here
    for where, text in {"state messages": "\n".join(r.state.message or "" for r in runs),
                        "run logs": sent, "serve log": (logs / "serve.log").read_text(),
                        "server log": server.log.read_text(errors="replace")}.items():
        assert leaked(text) == [], f"the secret is in the {where}"
    assert verify(store, DATASET) == []


def _key(dataset: Any, trigger: Any) -> str:
    """Runs' parameters come back as the trigger template rendered them (keys sorted)."""
    return json.dumps([dataset, trigger], sort_keys=True)
