"""A round SIGKILLed at every stage boundary and inside the commit loses nothing.

Each kill point (dyngen.faults.CRASH_POINTS) gets its own store and dataset; a child
process runs the round with DYNGEN_CRASH_AT set and dies there. Then, in this process:
the store verifies, its head is the old version or the new one (nothing in between), the
same round (same trigger event id) rerun lands exactly one new version with the expected
rows once each (nothing of the dead round's is waited for), and `gc` removes exactly what
the crash left behind. pytest's terminal summary counts the kill
points tried and the failures.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterKey,
    FlowRunFilter,
    FlowRunFilterTags,
)

from dyngen.faults import CRASH_ENV, CRASH_POINTS
from dyngen.flows.generation_round import generation_round
from dyngen.store import Store, gc, verify
from dyngen.tasks.version import artifact_key
from tests.reliability.helpers import (
    Child,
    files_named_by_records,
    files_on_disk,
    indices,
    launch_rounds,
    round_config,
)
from tests.rows import verl_rows

pytestmark = pytest.mark.usefixtures("prefect_server")

OLD, NEW = 0, 1
EXPECTED_ROWS = [0, 1, 2, 3, 100, 101, 102]  # version 0's rows, then the round's three
# Where the head is after a kill: the link of the version record is the commit.
HEAD_AFTER = {p: NEW if p in {"store.after_link", "round.after_version",
                              "round.after_lineage"} else OLD for p in CRASH_POINTS}
# What each kill leaves behind for gc, by folder and suffix (the round's data shard and its
# prompt keys and near-duplicate sidecar, its quarantine shard, the temp version record).
_SHARDS = {"data/.arrow", "data/.keys", "data/.lsh", "rejected/.arrow"}
LEFTOVERS = {
    "store.after_shard_write": {"data/.arrow", "data/.keys", "data/.lsh"},
    "round.after_concat": _SHARDS,
    "store.after_temp_record": _SHARDS | {"_versions/.json"},
    "store.before_link": _SHARDS | {"_versions/.json"},
    "store.after_link": {"_versions/.json"},
}


def dataset_of(point: str) -> str:
    return f"crash-{point}"  # one dataset per point, so kills run at once


def trigger_of(point: str) -> dict:
    return {"event_id": f"crash-{point}", "step": 7}


@dataclass
class Crash:
    store: Store
    returncode: int
    stderr: str


@dataclass
class Report:
    """Kill points tried and failed, printed in pytest's terminal summary."""

    tried: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        failures = f": {', '.join(self.failed)}" if self.failed else ""
        terminalreporter.write_line(f"crash injection: {len(self.tried)} kill points tried, "
                                    f"{len(self.failed)} failures{failures}")


@pytest.fixture(scope="module")
def crashes(tmp_path_factory: pytest.TempPathFactory, prefect_server: None) -> dict[str, Crash]:
    """Every kill point's round, run and killed in child processes, a few at a time."""
    at_once = min(4, os.cpu_count() or 2)  # more only contend for the CPU and the server
    out: dict[str, Crash] = {}
    running: list[tuple[str, Store, Child]] = []

    def finish(point: str, store: Store, child: Child) -> None:
        returncode, _, err = child.finish(timeout=120)
        out[point] = Crash(store, returncode, err)

    try:
        for point in CRASH_POINTS:
            store = Store(tmp_path_factory.mktemp(point) / "store")
            store.create(dataset_of(point), verl_rows(4))
            if len(running) >= at_once:
                finish(*running.pop(0))
            running.append((point, store, launch_rounds(
                dataset_of(point),
                [{"config": round_config(store, start=100, n=3), "trigger": trigger_of(point)}],
                env={CRASH_ENV: point})))
    finally:
        for item in running:
            finish(*item)
    return out


@pytest.fixture(scope="module")
def report(request: pytest.FixtureRequest) -> Report:
    found = Report()
    request.config.pluginmanager.register(found, "dyngen-crash-report")
    return found


def test_every_crash_point_is_placed_in_the_code() -> None:
    repo = Path(__file__).resolve().parents[2]
    # Each point sits in the code it marks: the flow, its tasks, or the store.
    code = "".join(p.read_text() for folder in ("flows", "tasks", "dyngen")
                   for p in sorted((repo / folder).rglob("*.py")) if p.name != "faults.py")
    assert [p for p in CRASH_POINTS if f'crash_point("{p}")' not in code] == []


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_round_killed_at_a_point_recovers_to_exactly_one_new_version(
        point: str, crashes: dict[str, Crash], report: Report) -> None:
    report.tried.append(point)
    try:
        _check_crash_and_rerun(point, crashes[point])
    except BaseException:
        report.failed.append(point)
        raise


def _check_crash_and_rerun(point: str, crash: Crash) -> None:
    name, store = dataset_of(point), crash.store
    assert crash.returncode == -signal.SIGKILL, (
        f"the round did not die at {point} (exit {crash.returncode}): {crash.stderr[-3000:]}")

    # What a reader sees right after the crash: a whole version, old or new.
    assert verify(store, name) == []
    head = store.head_version(name)
    assert head in (OLD, NEW) and head == HEAD_AFTER[point]
    assert len(indices(store, name)) == (4 if head == OLD else 7)
    leftovers = files_on_disk(store, name) - files_named_by_records(store, name)
    assert {f"{Path(f).parent}/{Path(f).suffix}" for f in leftovers} == LEFTOVERS.get(point, set())

    # The same trigger again: exactly one new version.
    result = generation_round(name, round_config(store, start=100, n=3), trigger_of(point))
    assert (result["version"], result["created"]) == (NEW, head == OLD)
    assert store.versions(name) == [OLD, NEW]
    assert store.head(name).idempotency_key == f"event:{trigger_of(point)['event_id']}"
    assert indices(store, name) == EXPECTED_ROWS  # each row exactly once
    assert store.load_rejected(name)["reason"] == ["duplicate"]
    _assert_one_round_completed(name)
    # The new version's lineage is in Prefect once, whether the killed round got to
    # publish it (after_lineage), the rerun did (killed after the commit), or the rerun
    # made the version itself.
    assert _round_artifacts(name) == [f"{name}: v{OLD} → v{NEW}"]

    # gc removes exactly what the crash left; then only recorded files remain.
    assert sorted(gc(store, name, grace_seconds=0)) == sorted(leftovers)
    assert files_on_disk(store, name) == files_named_by_records(store, name)
    assert verify(store, name) == []


def _assert_one_round_completed(name: str) -> None:
    """The rerun's run Completed; the killed round's, run in a process of its own without
    heartbeats, is left as its process left it (nothing waits on it)."""
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            tags=FlowRunFilterTags(all_=[f"dataset:{name}"])))
    states = sorted(r.state.type.value for r in runs if r.state is not None)
    assert len(runs) == 2 and states.count("COMPLETED") == 1, states


def _round_artifacts(name: str) -> list[str]:
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[artifact_key(name, "round")])))
    return [a.description for a in found]
