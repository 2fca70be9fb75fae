"""Hostile batch-end events against the real served deployment: each run fails clearly, and
nothing outside the store root (nor in it) is touched.

A real `prefect server start`, `dyngen serve --dataset victim`, and raw events emitted with
`prefect.events.emit_event`, as anyone who can reach the server could send them. The
deployment's trigger matches the resource id `dyngen.dataset.victim`; the run's dataset
comes from the `dyngen.dataset` label and its trigger from the payload, so those are where
a hostile event lies: a path as the dataset name, wrong types, a payload of a megabyte,
unknown fields, no trigger at all.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dyngen.events import EVENT_NAME, emit_batch_end, resource_id
from dyngen.local_server import LocalServer
from dyngen.store import Store, verify
from tests.e2e.conftest import server  # noqa: F401  (a real `prefect server start`)
from tests.e2e.test_triggered_rounds import serving, wait_for_versions
from tests.rows import verl_rows

DATASET = "victim"


@dataclass(frozen=True)
class Hostile:
    """An event's dyngen.dataset label (None: no label) and payload, and what it gets."""

    label: str | None
    payload: dict[str, Any]
    run_fails_with: str | None = None  # in the failed run's state message
    refused_with: str | None = None  # Prefect creates no run; its server log says why


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


def snapshot(folder: Path, skip: Path) -> dict[str, str]:
    """Every file and folder under `folder` (but `skip`), with a digest of each file."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path == skip or skip in path.parents:
            continue
        rel = str(path.relative_to(folder))
        out[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
    return out


def emit_raw(srv: LocalServer, label: str | None, payload: dict[str, Any]) -> None:
    """One raw `dyngen.batch.ended` event for the served dataset's resource id, delivered."""
    from prefect.events import emit_event
    from prefect.events.worker import EventsWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

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
        with temporary_settings(updates={PREFECT_API_URL: srv.api_url}):
            assert emit_event(EVENT_NAME, resource=resource, payload=payload,
                              id=uuid.uuid4()) is not None
            EventsWorker.drain_all(timeout=30)
    finally:
        worker_log.setLevel(level)


def final_runs(srv: LocalServer, count: int, timeout: float = 120.0) -> list[Any]:
    """The server's flow runs, once `count` of them are in a final state."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    deadline = time.monotonic() + timeout
    with temporary_settings(updates={PREFECT_API_URL: srv.api_url}), \
            get_client(sync_client=True) as client:
        while True:
            runs = [r for r in client.read_flow_runs(limit=200)
                    if r.state is not None and r.state.is_final()]
            if len(runs) >= count or time.monotonic() > deadline:
                return runs
            time.sleep(0.5)


def wait_for_log(log: Path, text: str, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return True
        time.sleep(0.5)
    return False


def test_hostile_events_fail_their_runs_clearly_and_touch_nothing(
    server: LocalServer, tmp_path: Path,  # noqa: F811
) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    # The store sits two levels down, so "../../etc" from it names a real folder.
    sentinel = tmp_path / "outside" / "etc"
    sentinel.mkdir(parents=True)
    (sentinel / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    store = Store(tmp_path / "outside" / "srv" / "store")
    store.create(DATASET, verl_rows(4))
    logs = tmp_path / "logs"
    before = snapshot(tmp_path, skip=logs)
    done_before = len(final_runs(server, 0))
    expect_runs = [case for case, h in HOSTILE.items() if h.run_fails_with]

    with serving(server, store, DATASET, logs / "serve.log") as serve:
        for hostile in HOSTILE.values():
            emit_raw(server, hostile.label, hostile.payload)
        runs = final_runs(server, done_before + len(expect_runs))
        refused = {case: wait_for_log(server.log, h.refused_with)
                   for case, h in HOSTILE.items() if h.refused_with}
        assert snapshot(tmp_path, skip=logs) == before, "a hostile event changed files"
        assert store.head_version(DATASET) == 0

        # The served deployment is unharmed: a well-formed event still commits a round.
        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
            assert emit_batch_end(DATASET, 10, {"score": 0.5}) is not None
        assert wait_for_versions(store, DATASET, 1, logs / "serve.log")[1].lineage[
            "trigger"]["step"] == 10
        final_runs(server, done_before + len(expect_runs) + 1)
        assert serve.poll() is None, "the serve process died"

    by_params = {_key(r.parameters.get("dataset"), r.parameters.get("trigger")): r
                 for r in runs}
    report = []
    for case, hostile in HOSTILE.items():
        run = by_params.get(_key(hostile.label or "", hostile.payload.get("trigger", {})))
        if hostile.refused_with:
            assert run is None, f"{case}: a run was created: {run.state}"
            assert refused[case], f"{case}: the server log does not say why it refused"
            report.append(f"  {case:<20} no run: Prefect refused it ({hostile.refused_with}…)")
            continue
        assert run is not None, f"{case}: no run; runs: {[r.name for r in runs]}"
        assert run.state.is_failed(), f"{case}: {run.state.type} {run.state.message}"
        assert hostile.run_fails_with in (run.state.message or ""), run.state.message
        report.append(f"  {case:<20} {run.state.name}: {run.state.message[:110]}")
    print("\nhostile events:\n" + "\n".join(report))
    assert verify(store, DATASET) == []


def _key(dataset: Any, trigger: Any) -> str:
    """Runs' parameters come back as the trigger template rendered them (keys sorted)."""
    return json.dumps([dataset, trigger], sort_keys=True)
