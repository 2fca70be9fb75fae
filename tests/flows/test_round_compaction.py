"""A round compacts after it commits; the maintenance flow compacts and vacuums on demand."""

from __future__ import annotations

from pathlib import Path

import pytest

from dyngen.flows.generation_round import generation_round
from dyngen.flows.maintenance import maintain_store
from dyngen.store import Store, verify
from tests.reliability.helpers import round_config
from tests.rows import verl_rows

pytestmark = pytest.mark.usefixtures("prefect_server")
SMALL = {"max_small_shards": 3, "fan_in": 4}


def small_shards(tmp_path: Path, name: str = "ds", rounds: int = 5) -> Store:
    store = Store(tmp_path / "store")
    store.create(name, verl_rows(4))
    for r in range(rounds):
        store.append(name, verl_rows(1, start=10 + r))
    return store


def config(store: Store, **compaction: object) -> dict:
    cfg = round_config(store, start=100, n=2)
    cfg["round"]["compaction"] = compaction
    return cfg


def indices(store: Store, name: str = "ds") -> list[int]:
    return [e["index"] for e in Store(store.root).load(name)["extra_info"]]


def test_a_round_compacts_the_head_after_committing(tmp_path: Path) -> None:
    store = small_shards(tmp_path)
    result = generation_round("ds", config(store, **SMALL), {"event_id": "c-1"})
    assert (result["version"], result["created"], result["compacted"]) == (6, True, [7])
    head = Store(store.root).head("ds")
    assert (head.operation, len(head.shards)) == ("compact", 4)  # 7 shards: 4 merged into 1
    assert indices(store) == [0, 1, 2, 3, 10, 11, 12, 13, 14, 100, 101]
    assert Store(store.root).record("ds", 6).lineage["round"] == 6  # the round's own version
    again = generation_round("ds", config(store, **SMALL), {"event_id": "c-1"})
    assert (again["version"], again["created"]) == (6, False)  # found by its key, not redone
    assert verify(store, "ds") == []


def test_compaction_is_off_when_disabled_and_waits_for_enough_shards(tmp_path: Path) -> None:
    store = small_shards(tmp_path)
    off = generation_round("ds", config(store, enabled=False, **SMALL), {"event_id": "c-2"})
    assert off["compacted"] == []
    default = generation_round("ds", config(store), {"event_id": "c-3"})
    assert default["compacted"] == []  # 8 shards: far below the default 50
    assert Store(store.root).head_version("ds") == 7


def test_a_failing_compaction_never_fails_a_committed_round(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = small_shards(tmp_path)

    def broken(*args: object, **kwargs: object) -> list:
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(Store, "compact", broken)
    result = generation_round("ds", config(store, **SMALL), {"event_id": "c-4"})
    assert (result["version"], result["created"], result["compacted"]) == (6, True, [])
    assert indices(store)[-2:] == [100, 101]


def test_the_maintenance_flow_compacts_every_dataset_and_vacuums_if_asked(
        tmp_path: Path) -> None:
    store = small_shards(tmp_path, "a")
    small_shards(tmp_path, "b", rounds=8)
    cfg = {"store": {"root": str(store.root)}, "round": {"compaction": SMALL}}
    done = maintain_store(config=cfg)
    assert set(done) == {"a", "b"} and all(d["compacted"] for d in done.values())
    assert "vacuum" not in done["a"]
    kept = indices(store, "b")
    done = maintain_store(dataset="b", config=cfg, keep_versions=1, grace_seconds=0)
    assert done["b"]["vacuum"]["removed"] > 0
    assert indices(store, "b") == kept
    assert verify(store, "a") == [] and verify(store, "b") == []
