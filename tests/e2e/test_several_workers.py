"""Two process workers on one pool, deployed from prefect.yaml: rounds of two datasets run
side by side, and each batch end a trainer recorded in the store is covered exactly once,
whichever worker's round commits it (rounds of one dataset may overlap too: the store's
commit decides, not an order among them)."""

from __future__ import annotations

from pathlib import Path

import yaml

from dyngen.server.local import LocalServer, spawn, stop, wait_for_automation
from dyngen.store import Store, verify
from dyngen.trainers.events import emit_batch_end, trigger_name
from tests.e2e.conftest import PREFECT, REPO, env_for, prefect_cli, seeded
from tests.e2e.test_triggered_rounds import finished_runs

POOL = "dyngen-two-workers"
# Its own deployment name: `dyngen serve` in other tests applies "on-batch-end", and would
# otherwise update this prefect.yaml deployment instead of making its own.
DEPLOYMENT = "on-batch-end-two-workers"


def deployment_file(tmp_path: Path, log: Path) -> Path:
    """The repository's prefect.yaml, on this test's pool, with a slow logging generator."""
    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    # Only the round's deployment (prefect.yaml also holds the store-maintenance one).
    (deployment,) = [d for d in spec["deployments"] if d["name"] == "on-batch-end"]
    spec["deployments"] = [deployment]
    deployment["name"] = DEPLOYMENT
    deployment["work_pool"]["name"] = POOL
    deployment["parameters"]["config"] = {
        "data": {"datagen": {"path": "pkg://tests.flows.gens", "name": "LogsItsSpan",
                             "sleep": 6, "log": str(log)}}}
    path = tmp_path / "prefect.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def remove_deployment(server: LocalServer) -> None:
    """Delete the deployment and its trigger, which would turn later tests' events into
    runs that wait on this pool."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: server.api_url}), \
            get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(f"generation-round/{DEPLOYMENT}")
        client.delete_resource_owned_automations(f"prefect.deployment.{deployment.id}")
        client.delete_deployment(deployment.id)


def test_two_workers_overlap_rounds_and_cover_each_batch_end_once(
        server: LocalServer, tmp_path: Path) -> None:
    stores = {name: seeded(tmp_path, name) for name in ("pair-a", "pair-b")}
    store: Store = stores["pair-a"]  # both datasets live in one store
    spans_log = tmp_path / "spans.log"
    env = env_for(server, DYNGEN_STORE_ROOT=str(store.root), PREFECT_WORKER_QUERY_SECONDS="1")
    prefect_cli(env, "work-pool", "create", POOL, "--type", "process", "--overwrite")
    prefect_cli(env, "--no-prompt", "deploy", "--all", "--prefect-file",
                str(deployment_file(tmp_path, spans_log)))
    # Two places per worker: the four rounds below cannot all land on one.
    workers = [spawn([PREFECT, "worker", "start", "--pool", POOL, "--limit", "2"], env,
                     tmp_path / f"worker-{i}.log", cwd=REPO) for i in (1, 2)]
    try:
        wait_for_automation(server.api_url, trigger_name(None))
        # From this process, interleaved: the first round of each dataset is queued first,
        # all four within a second (a process per dataset would start seconds apart).
        for step in (1, 2):
            for name in stores:
                assert emit_batch_end(name, step, api_url=server.api_url, store=store.root,
                                      run="train") is not None
        for name in stores:
            finished_runs(server, name, 2)
    finally:
        for worker in workers:
            stop(worker)
        remove_deployment(server)
    spans: dict[str, list[tuple[float, float]]] = {name: [] for name in stores}
    launched_by = set()
    for line in spans_log.read_text().splitlines():
        name, _, start, end, ppid = line.split()
        spans[name].append((float(start), float(end)))
        launched_by.add(int(ppid))
    assert launched_by == {w.pid for w in workers}, "both workers should have run rounds"
    for name in stores:
        history = store.history(name)
        covered = [key for record in history for key in record.covers]
        assert sorted(covered) == [("train", 1), ("train", 2)], history  # each once
        assert [r.version for r in history] == list(range(len(history)))
        assert store.pending(name) == []
        assert verify(store, name) == []
    # Side by side on the two workers: some two rounds generated at the same time (of two
    # datasets, or of one: its rounds may overlap, and the store's commit decides).
    every = sorted(span for found in spans.values() for span in found)
    assert any(a[1] > b[0] for a, b in zip(every, every[1:], strict=False)), \
        f"no two rounds ever ran at the same time: {spans}"
