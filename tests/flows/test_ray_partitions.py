"""A round fanned out over partitions on a real local Ray (2 CPUs) through prefect-ray.

Ray starts once for the module: a RayTaskRunner entered here starts it, and each round's
runner finds it running and uses it (as a round does on a cluster it joins by address).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterFlowRunId

from dyngen.errors import ConfigError
from dyngen.flows.generation_round import generation_round
from dyngen.server.local import LocalServer
from dyngen.store import Store, verify
from tests.flows.test_partitions import calls_of, partitioned_config, seeded_store

pytestmark = pytest.mark.usefixtures("prefect_server", "local_ray")

REPO = Path(__file__).resolve().parents[2]
RAY = {"kind": "ray", "init_kwargs": {"num_cpus": 2, "include_dashboard": False}}


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """One local Ray of 2 CPUs for the module, on loopback only, shut down at the end."""
    from prefect_ray import RayTaskRunner

    with pytest.MonkeyPatch.context() as env:
        # A single-machine Ray otherwise binds to the host's network address.
        env.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        with RayTaskRunner(init_kwargs=RAY["init_kwargs"]):
            yield


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return seeded_store(tmp_path)


def ray_config(store: Store, tmp_path: Path, partitions: int = 4, **datagen: Any) -> dict:
    cfg = partitioned_config(store, tmp_path, partitions, **datagen)
    cfg["round"]["task_runner"] = dict(RAY)
    return cfg


def task_runs_of(flow_run_id: str, partitions: int = 4, timeout: float = 60.0) -> list:
    """The round's task runs, once its `partitions` generate runs carry their final names.

    Task runs reach the server as events, recorded a moment later under load: a run's first
    event may carry its default name (generate-9e4), a later one the name it runs under."""
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(task_run_filter=TaskRunFilter(
                flow_run_id=TaskRunFilterFlowRunId(any_=[flow_run_id])))
            final = {r.name for r in runs
                     if re.fullmatch(rf"generate-[0-9]+-of-{partitions}", r.name)}
            if len(final) >= partitions or time.monotonic() > deadline:
                return runs
            time.sleep(0.5)


def test_four_partitions_on_ray_commit_one_version_with_every_partitions_rows_once(
        store: Store, tmp_path: Path) -> None:
    state = generation_round("ds", ray_config(store, tmp_path, n=3), {"step": 1},
                             return_state=True)
    assert state.is_completed(), state.message
    assert [r.version for r in store.history("ds")] == [0, 1]
    new = store.load("ds").select(range(4, 16))
    indices = [e["index"] for e in new["extra_info"]]
    assert sorted(indices) == [1000 + 100 * p + i for p in range(4) for i in range(3)]
    assert sorted(new["data_source"]) == sorted(f"part-{p}-of-4" for p in range(4)
                                                for _ in range(3))
    assert set(new["_dyngen_version"]) == {1}
    calls = calls_of(tmp_path)
    assert sorted(calls) == [(p, 0) for p in range(4)]  # each partition ran once
    assert os.getpid() not in {pid for pid, _, _ in calls.values()}  # in Ray's workers
    lineage = store.head("ds").lineage
    assert lineage["partitions"] == {"count": 4, "task_runner": "ray", "rows": [3, 3, 3, 3]}
    assert lineage["counts"]["generated"] == 12
    runs = task_runs_of(lineage["flow_run_id"])
    assert sorted(r.name for r in runs if r.name.startswith("generate")) == [
        f"generate-{p}-of-4" for p in range(4)]
    assert verify(store, "ds") == []


def test_a_partition_failing_once_is_retried_alone_and_the_round_commits_once(
        store: Store, tmp_path: Path) -> None:
    cfg = ray_config(store, tmp_path, fail=2)
    cfg["round"]["retries"] = 1
    state = generation_round("ds", cfg, {"step": 1}, return_state=True)
    assert state.is_completed(), state.message
    assert sorted(calls_of(tmp_path)) == [(0, 0), (1, 0), (2, 0), (2, 1), (3, 0)]
    assert [r.version for r in store.history("ds")] == [0, 1]
    indices = [e["index"] for e in store.load("ds")["extra_info"]][4:]
    assert sorted(indices) == [1000 + 100 * p + i for p in range(4) for i in range(2)]
    retried = [r for r in task_runs_of(store.head("ds").lineage["flow_run_id"])
               if r.name == "generate-2-of-4"]
    assert [r.run_count for r in retried] == [2]


def test_per_partition_resources_reach_ray(store: Store, tmp_path: Path) -> None:
    # Two CPUs per partition on a 2-CPU Ray: the partitions cannot run side by side.
    cfg = ray_config(store, tmp_path, partitions=2, sleep=0.5)
    cfg["round"]["task_runner"]["remote_options"] = {"num_cpus": 2}
    state = generation_round("ds", cfg, {"step": 1}, return_state=True)
    assert state.is_completed(), state.message
    spans = sorted((start, end) for _, start, end in calls_of(tmp_path).values())
    assert len(spans) == 2 and spans[0][1] <= spans[1][0], f"partitions overlapped: {spans}"


def test_resources_no_node_has_fail_the_round_naming_them(store: Store, tmp_path: Path) -> None:
    cfg = ray_config(store, tmp_path)
    cfg["round"]["task_runner"]["remote_options"] = {"num_gpus": 1}
    state = generation_round("ds", cfg, {"step": 1}, return_state=True)
    assert state.is_failed()
    with pytest.raises(ConfigError, match=r"'GPU': 1\.0.*no live node"):
        state.result()
    assert calls_of(tmp_path) == {} and store.head_version("ds") == 0


def test_a_round_in_another_process_joins_the_running_ray_by_address(
        store: Store, tmp_path: Path) -> None:
    import ray
    from prefect.settings import PREFECT_API_URL

    address = ray.get_runtime_context().gcs_address  # what `ray start --head` prints
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dyngen.cli", "--root", str(store.root), "round", "ds",
         "data.datagen.path=pkg://tests.flows.gens", "data.datagen.name=Partitioned",
         f"+data.datagen.calls={tmp_path / 'calls'}", "round.partitions=2",
         "round.task_runner.kind=ray", f"round.task_runner.address={address}", "--step", "1"],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err
    calls = calls_of(tmp_path)
    assert sorted(calls) == [(0, 0), (1, 0)]
    assert proc.pid not in {pid for pid, _, _ in calls.values()}  # on the cluster's workers
    assert store.head("ds").lineage["partitions"]["task_runner"] == "ray"
    # The round left the cluster it joined running: this driver still uses it.
    assert ray.is_initialized() and ray.get(ray.put(7)) == 7


_ROUND_IN_A_SUBPROCESS = r"""
import json, re, sys, time
from pathlib import Path
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from dyngen.store import Store
from dyngen.runtime.in_process import run_round
from tests.flows.test_partitions import partitioned_config
root, folder, address = sys.argv[1:]
cfg = partitioned_config(Store(root), Path(folder), 2)
cfg["round"]["task_runner"] = {"kind": "ray", "address": address}
summary = run_round("ds", cfg, {"step": 1})
lineage = Store(root).head("ds").lineage
with get_client(sync_client=True) as client:  # the round's own server
    # Task runs reach the server as events, recorded a moment later under load: a run's
    # first event may carry its default name (generate-9e4), a later one the name it runs
    # under (the server keeps the newest).
    deadline = time.monotonic() + 60
    while True:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(
            id=FlowRunFilterId(any_=[lineage["flow_run_id"]])))
        names = sorted(r.name for r in runs if r.name.startswith("generate"))
        final = [n for n in names if re.fullmatch(r"generate-[0-9]+-of-[0-9]+", n)]
        if len(final) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    url = client.api_url
print(json.dumps([str(url), names, lineage["generator"]["partition_stats"]]))
"""


def test_a_round_without_prefect_api_url_has_its_ray_partitions_report_to_its_own_server(
        store: Store, tmp_path: Path) -> None:
    import ray

    # The round starts a temporary server; its partitions, on the module's Ray, must report
    # to it, not each start one of their own (a uvicorn child of the Ray worker).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API_")}
    env.update(PYTHONPATH=str(REPO), PREFECT_HOME=str(tmp_path / "prefect-home"))
    address = ray.get_runtime_context().gcs_address
    proc = subprocess.run([sys.executable, "-c", _ROUND_IN_A_SUBPROCESS, str(store.root),
                           str(tmp_path), address], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    url, names, stats = json.loads(proc.stdout.strip().splitlines()[-1])
    assert names == ["generate-0-of-2", "generate-1-of-2"]
    assert [s["servers"] for s in stats] == [[], []], "partitions started Prefect servers"
    assert [s["prefect_api_url"] for s in stats] == [url.rstrip("/")] * 2
    assert sorted(calls_of(tmp_path)) == [(0, 0), (1, 0)]


def test_ray_partitions_report_to_a_server_with_auth_without_the_credentials_in_ray(
        store: Store, tmp_path: Path) -> None:
    import ray

    # The worker's Prefect client needs the server's credentials; they travel in the task's
    # Prefect context, never in Ray's runtime environment (which its dashboard shows).
    server = LocalServer(tmp_path / "auth-server",
                         auth_string=f"dyngen:{secrets.token_hex(12)}").start()
    try:
        env = server.env(PYTHONPATH=str(REPO))
        address = ray.get_runtime_context().gcs_address
        proc = subprocess.run([sys.executable, "-c", _ROUND_IN_A_SUBPROCESS, str(store.root),
                               str(tmp_path), address], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=300)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    url, names, stats = json.loads(proc.stdout.strip().splitlines()[-1])
    assert url.rstrip("/") == server.api_url
    assert names == ["generate-0-of-2", "generate-1-of-2"]  # recorded on the auth server
    assert [s["prefect_api_url"] for s in stats] == [server.api_url] * 2
    assert [s["servers"] for s in stats] == [[], []]
    assert [s["auth_string_in_environ"] for s in stats] == [False, False]
