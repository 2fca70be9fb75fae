"""Partitioned generation on the default thread-pool runner, and the fan-out's core."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pytest

from dyngen.config import load_config
from dyngen.errors import ConfigError, MissingDependencyError
from dyngen.filters import RowBatch
from dyngen.flows.generation_round import generation_round
from dyngen.round.partitions import union_rows
from dyngen.round.task_runners import build_task_runner
from dyngen.store import Store, gc, verify
from tests.rows import verl_row, verl_rows


def seeded_store(tmp_path: Path) -> Store:
    """A store with dataset 'ds' at version 0 (4 rows)."""
    store = Store(tmp_path / "store")
    store.create("ds", verl_rows(4))
    return store


def partitioned_config(store: Store, tmp_path: Path, partitions: int,
                       **datagen: Any) -> dict[str, Any]:
    """A round of the Partitioned test generator over `partitions` partitions."""
    return {
        "store": {"root": str(store.root)},
        "data": {"datagen": {"path": "pkg://tests.flows.gens", "name": "Partitioned",
                             "calls": str(tmp_path / "calls"), **datagen}},
        "round": {"retries": 0, "retry_delay_seconds": 0, "partitions": partitions},
    }


def calls_of(tmp_path: Path) -> dict[tuple[int, int], tuple[int, float, float]]:
    """(partition, attempt) → (pid, start, end) of every generator call so far."""
    out = {}
    for path in (tmp_path / "calls").glob("p*-*"):
        part, attempt = path.name[1:].split("-")
        pid, start, end = path.read_text().split()
        out[int(part), int(attempt)] = (int(pid), float(start), float(end))
    return out


@pytest.mark.usefixtures("prefect_server")
def test_three_partitions_on_threads_commit_their_union_once(tmp_path: Path) -> None:
    store = seeded_store(tmp_path)
    state = generation_round("ds", partitioned_config(store, tmp_path, 3), {"step": 1},
                             return_state=True)
    assert state.is_completed(), state.message
    assert sorted(calls_of(tmp_path)) == [(0, 0), (1, 0), (2, 0)]
    indices = [e["index"] for e in store.load("ds")["extra_info"]]
    assert indices[:4] == [0, 1, 2, 3]
    assert sorted(indices[4:]) == [1000, 1001, 1100, 1101, 1200, 1201]
    lineage = store.head("ds").lineage
    assert lineage["partitions"] == {"count": 3, "task_runner": "threads", "rows": [2, 2, 2]}
    assert lineage["counts"] == {"generated": 6, "kept": 6, "rejected": {}}


@pytest.mark.usefixtures("prefect_server")
def test_each_partition_gets_its_own_state_back_next_round(tmp_path: Path) -> None:
    store = seeded_store(tmp_path)
    cfg = partitioned_config(store, tmp_path, 2)
    for step in (1, 2):
        generation_round("ds", cfg, {"step": step})
    generator = store.head("ds").lineage["generator"]
    assert generator["partition_states"] == [{"partition": 0, "seen": 2},
                                             {"partition": 1, "seen": 2}]
    assert generator["state"] == {"partition": 0, "seen": 2}


@pytest.mark.usefixtures("prefect_server")
def test_a_partition_that_keeps_failing_fails_the_round_and_commits_nothing(
        tmp_path: Path) -> None:
    store = seeded_store(tmp_path)
    cfg = partitioned_config(store, tmp_path, 3, fail=1, fail_always=True)
    cfg["round"]["retries"] = 1
    state = generation_round("ds", cfg, {"step": 1}, return_state=True)
    assert state.is_failed()
    with pytest.raises(ConnectionError, match="partition 1") as raised:
        state.result()
    assert "partition 1 of 3" in "\n".join(raised.value.__notes__)
    assert sorted(calls_of(tmp_path)) == [(0, 0), (1, 0), (1, 1), (2, 0)]
    assert store.head_version("ds") == 0
    assert verify(store, "ds") == [] and gc(store, "ds", grace_seconds=0) == []


@pytest.mark.usefixtures("prefect_server")
def test_overlapping_partitions_write_no_cache_files_into_the_store(tmp_path: Path) -> None:
    store = seeded_store(tmp_path)
    cfg = partitioned_config(store, tmp_path, 2)
    cfg["data"]["datagen"] = {"path": "pkg://tests.flows.gens", "name": "MapsLate", "delay": 1}
    state = generation_round("ds", cfg, {"step": 1}, return_state=True)
    assert state.is_completed(), state.message
    assert [p.name for p in (store.root / "ds").rglob("cache-*")] == []
    assert datasets.is_caching_enabled()  # restored once both partitions are done


def test_partitions_tables_unite_with_each_others_extra_info_fields() -> None:
    plain = verl_row(1)
    tagged = {**verl_row(2), "extra_info": {**verl_row(2)["extra_info"], "seed_index": 7}}
    united = union_rows([RowBatch(pa.Table.from_pylist([plain])),
                         RowBatch(pa.Table.from_pylist([tagged]))])
    assert united.table is not None
    assert [r["extra_info"].get("seed_index") for r in united] == [None, 7]


def test_partitions_with_different_columns_reach_the_filters_as_rows() -> None:
    missing = {k: v for k, v in verl_row(2).items() if k != "reward_model"}
    united = union_rows([RowBatch(pa.Table.from_pylist([verl_row(1)])),
                         RowBatch(pa.Table.from_pylist([missing])), RowBatch([verl_row(3)])])
    assert united.table is None
    assert ["reward_model" in r for r in united] == [True, False, True]


@pytest.mark.parametrize(("overrides", "message"), [
    (["round.partitions=0"], "round.partitions: expected an integer >= 1, found 0"),
    (["round.task_runner.kind=dask"], "round.task_runner.kind: expected one of threads, ray"),
    (["+round.task_runner.remote_options.num_gpus=1"],
     "round.task_runner.remote_options: applies only to round.task_runner.kind=ray"),
    (["round.task_runner.address=auto"], "Set round.task_runner.kind=ray, or remove"),
])
def test_partition_settings_that_cannot_work_are_refused_up_front(
        overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(overrides=overrides)


def test_ray_runner_without_the_extra_names_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what an environment without ray imports
    cfg = load_config(overrides=["round.task_runner.kind=ray"])
    with pytest.raises(MissingDependencyError, match=r"pip install 'dyngen\[ray\]'"):
        build_task_runner(cfg.round.task_runner, 2)
