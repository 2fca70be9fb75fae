"""One `dyngen serve` per dataset, end to end: real `dyngen serve` processes, a real
`prefect server start` (SQLite), a real store in tmp_path.

- a second serve of a served dataset (or of every dataset) exits at once with one line
  naming the live serve, which goes on serving;
- a serve killed with its round leaves a Running run and its lease: the next serve takes
  the lease over at once (its process is gone), ends the run Crashed, and its rounds run
  (the deployment's concurrency slot is free);
- the catch-up schedule covers a batch end written to the store with no event, and with
  nothing pending its rounds commit nothing;
- a serve whose lease another serve took over (it had stalled) stops, saying so;
- without PREFECT_API_URL serve starts a Prefect server of its own (its database in the
  user's cache, not ~/.prefect), says so, covers batch ends by catch-up, and stops it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dyngen.runtime.serve_lease import LEASE_DIR, Holder
from dyngen.server.local import LocalServer, spawn, stop, wait_for_automation
from dyngen.store import Store, verify
from dyngen.trainers.events import emit_batch_end, trigger_name
from tests.e2e.conftest import (
    DYNGEN,
    REPO,
    env_for,
    seeded,
    server,  # noqa: F401  (a real `prefect server start`)
)
from tests.e2e.test_triggered_rounds import wait_for_versions

USES_CONTEXT = ["data.datagen.path=pkg://tests.flows.gens", "data.datagen.name=UsesContext"]
HANGS_AT_1 = ["data.datagen.path=pkg://tests.reliability.gens",
              "data.datagen.name=DiesOrHangs", "+data.datagen.hang_at=[1]"]


def serve_args(store: Store, dataset: str | None, *extra: str) -> list[str]:
    named = ["--dataset", dataset] if dataset else []
    return [*DYNGEN, "--root", str(store.root), "serve", *named, "--poll-seconds", "0.1",
            *extra]


def start_serving(server: LocalServer, store: Store, dataset: str, log: Path,  # noqa: F811
                  *extra: str) -> subprocess.Popen[bytes]:
    """`dyngen serve --dataset` in its own process group, once it serves."""
    proc = spawn(serve_args(store, dataset, *extra), env_for(server), log, cwd=REPO)
    wait_for_automation(server.api_url, trigger_name(dataset), settle_seconds=0.5)
    wait_for(lambda: "serving deployment" in log.read_text(), log)
    return proc


def wait_for(done: Callable[[], Any], log: Path, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = done()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout:.0f} s; log:\n{log.read_text()[-3000:]}")


def runs_of(server: LocalServer, dataset: str) -> list[Any]:  # noqa: F811
    from prefect.client.orchestration import get_client

    with server.client_settings(), get_client(sync_client=True) as client:
        return [r for r in client.read_flow_runs(limit=200)
                if (r.parameters or {}).get("dataset") == dataset]


def refused(server: LocalServer, store: Store, dataset: str | None,  # noqa: F811
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(serve_args(store, dataset, *USES_CONTEXT), env=env_for(server),
                          cwd=REPO, capture_output=True, text=True, timeout=120)


def test_a_second_serve_of_a_served_dataset_is_refused_in_one_line(
        server: LocalServer, tmp_path: Path) -> None:  # noqa: F811
    store = seeded(tmp_path, "once")
    log = tmp_path / "serve.log"
    first = start_serving(server, store, "once", log, *USES_CONTEXT)
    try:
        started = time.monotonic()
        second = refused(server, store, "once")
        took = time.monotonic() - started
        every = refused(server, store, None)  # every dataset: the store's one included
        alive = first.poll() is None
        # The first serve still serves: a batch end written to the store and woken.
        emit_batch_end("once", 1, {"score": 0.5}, api_url=server.api_url, store=store.root,
                       run="r")
        wait_for_versions(store, "once", 1, log)
    finally:
        stop(first)

    assert second.returncode == 2, second.stderr
    (line,) = second.stderr.strip().splitlines()
    assert line.startswith("error: cannot serve dataset 'once' of store ")
    assert f"pid {first.pid} on host {socket.gethostname()}, serving since " in line
    assert f"stop that serve first (kill {first.pid} on " in line
    assert second.stdout == ""
    assert took < 60, f"the refusal took {took:.0f} s"
    assert every.returncode == 2
    (line,) = every.stderr.strip().splitlines()
    assert "cannot serve every dataset" in line and f"pid {first.pid}" in line
    assert alive, "the first serve died"
    assert store.covering_version("once", "r", 1) == 1


def test_a_killed_serves_lease_is_taken_over_at_once_and_its_running_run_ended(
        server: LocalServer, tmp_path: Path) -> None:  # noqa: F811
    store = seeded(tmp_path, "left")
    log = tmp_path / "serve.log"
    killed = start_serving(server, store, "left", log, "--catch-up-seconds", "0", *HANGS_AT_1)
    try:
        emit_batch_end("left", 1, {"score": 0.5}, api_url=server.api_url)
        (hung,) = wait_for(lambda: [r for r in runs_of(server, "left")
                                    if r.state is not None and r.state.is_running()], log)
    finally:
        os.killpg(killed.pid, signal.SIGKILL)  # serve, its fork server and its round
        killed.wait(30)
    lease_files = store.backend.list(f"{LEASE_DIR}/left")
    holder = Holder.from_bytes(store.backend.read_bytes(f"{LEASE_DIR}/left/{lease_files[0]}"))

    log2 = tmp_path / "serve-2.log"
    started = time.monotonic()
    second = start_serving(server, store, "left", log2, "--catch-up-seconds", "0",
                           *HANGS_AT_1)
    try:
        took = time.monotonic() - started
        ended = wait_for(lambda: next((r for r in runs_of(server, "left") if r.id == hung.id
                                       and r.state.is_final()), None), log2)
        # The deployment's concurrency slot is free: the next batch end's round runs.
        emit_batch_end("left", 2, {"score": 0.5}, api_url=server.api_url)
        history = wait_for_versions(store, "left", 1, log2)
    finally:
        stop(second)

    assert holder.pid == killed.pid and holder.released_at is None
    said = log2.read_text()
    assert f"took over the serve lease of dataset 'left' in store {store.root}: its " \
        f"process (pid {killed.pid} on {socket.gethostname()}) is gone" in said
    assert took < 60, f"the next serve started {took:.0f} s after (it waited for the lease?)"
    assert ended.state.is_crashed(), ended.state
    assert "killed" in ended.state.message and "next serve" in ended.state.message
    assert [r.lineage["trigger"]["step"] for r in history[1:]] == [2]
    # Stopped cleanly, the second serve released its lease.
    (last,) = store.backend.list(f"{LEASE_DIR}/left")
    assert Holder.from_bytes(store.backend.read_bytes(f"{LEASE_DIR}/left/{last}")).released_at
    assert verify(store, "left") == []


def test_the_catch_up_schedule_covers_a_batch_end_no_event_announced(
        server: LocalServer, tmp_path: Path) -> None:  # noqa: F811
    store = seeded(tmp_path, "quiet")
    log = tmp_path / "serve.log"
    serve = start_serving(server, store, "quiet", log, "--catch-up-seconds", "1",
                          *USES_CONTEXT)
    try:
        # A trainer whose events never reach the server: the batch end is in the store.
        store.write_batch_end("quiet", "r", 1, {"score": 0.25})
        history = wait_for_versions(store, "quiet", 1, log, timeout=120)

        def idle_catch_ups() -> list[Any]:
            return [r for r in runs_of(server, "quiet") if r.state is not None
                    and r.state.is_completed() and r.end_time is not None
                    and r.end_time > datetime.fromisoformat(history[1].created_at)]

        # Nothing pending now: later catch-up rounds end at once and commit nothing.
        wait_for(lambda: len(idle_catch_ups()) >= 2, log)
        head = store.head_version("quiet")
        alive = serve.poll() is None
        (committer,) = [r for r in runs_of(server, "quiet")
                        if str(r.id) == history[1].lineage["flow_run_id"]]
    finally:
        stop(serve)
    stopped = datetime.now(timezone.utc)
    # Stopped, it turned its catch-up schedule off: no runs pile up while nothing serves.
    from prefect.client.orchestration import get_client

    with server.client_settings(), get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("generation-round/on-batch-end-quiet")
        schedules = client.read_deployment_schedules(deployment.id)
    later = [r for r in runs_of(server, "quiet") if r.state is not None
             and r.state.is_scheduled() and r.expected_start_time > stopped]

    assert alive
    assert [s.active for s in schedules if s.parameters.get("dataset") == "quiet"] == [False]
    assert later == [], "catch-up runs are still set for a serve that stopped"
    assert store.covering_version("quiet", "r", 1) == 1
    assert committer.parameters["trigger"] == {"catch_up": True}
    assert head == 1, "a catch-up round with nothing pending committed a version"
    assert store.pending("quiet") == []


def test_serve_without_a_prefect_server_starts_its_own_says_so_and_stops_it(
        tmp_path: Path) -> None:
    store = seeded(tmp_path, "alone")
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PYTHONPATH=str(REPO), PREFECT_HOME=str(tmp_path / "prefect-home"),
               XDG_CACHE_HOME=str(cache))
    log = tmp_path / "serve.log"
    serve = spawn(serve_args(store, "alone", "--catch-up-seconds", "1", *USES_CONTEXT), env,
                  log, cwd=REPO)
    try:
        said = wait_for(lambda: "serving on http" in log.read_text() and log.read_text(), log,
                        timeout=240)
        # A trainer that only records its batch end in the store: no event, no server.
        store.write_batch_end("alone", "r", 1, {"score": 0.5})
        wait_for(lambda: store.covering_version("alone", "r", 1), log)
    finally:
        stop(serve)
    assert "PREFECT_API_URL is not set: starting a Prefect server of this serve's own" in said
    assert str(cache / "dyngen" / "serve") in said  # its own database, not ~/.prefect's
    assert not (tmp_path / "prefect-home" / "prefect.db").exists()
    url = said.split("serving on ", 1)[1].split()[0]
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with socket.socket() as sock:  # stopped with the serve
        assert sock.connect_ex(("127.0.0.1", port)) != 0, f"{url} still answers"
    assert store.pending("alone") == [] and verify(store, "alone") == []


def test_a_serve_whose_lease_another_took_over_stops_saying_so(
        server: LocalServer, tmp_path: Path) -> None:  # noqa: F811
    store = seeded(tmp_path, "stalled")
    log = tmp_path / "serve.log"
    serve = start_serving(server, store, "stalled", log, "--catch-up-seconds", "0",
                          *USES_CONTEXT)
    try:
        # A serve on another machine took the lease over (this one had stalled past 30 s).
        (mine,) = store.backend.list(f"{LEASE_DIR}/stalled")
        now = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
        taker = Holder("another-boot:pid:[1]/777/1", "gpu-9", 777, "stalled", now, now)
        store.backend.write_new(f"{LEASE_DIR}/stalled/{int(mine[:-5]) + 1:020d}.json",
                                taker.to_bytes())
        code = serve.wait(timeout=60)  # it notices at its next renewal (every 10 s)
    finally:
        stop(serve)
    said = log.read_text()
    assert code == 2, said[-3000:]
    assert "took this serve's lease over; stopping" in said
    assert f"error: the serve lease of dataset 'stalled' in store {store.root} was taken " \
        "over by a `dyngen serve` of dataset 'stalled' (pid 777 on host gpu-9" in said
    # The taker's lease is left as it was.
    newest = sorted(store.backend.list(f"{LEASE_DIR}/stalled"))[-1]
    assert Holder.from_bytes(store.backend.read_bytes(f"{LEASE_DIR}/stalled/{newest}")) == taker
