"""The store-maintenance flow keeps each dataset's Delta mirror at the head (`mirror:`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from dyngen.errors import ConfigError
from dyngen.flows.maintenance import maintain_store
from dyngen.store import Store
from tests.mirror.test_delta import as_multiset, delta_rows
from tests.rows import verl_rows

pytestmark = pytest.mark.usefixtures("prefect_server")


def test_the_flow_mirrors_every_dataset_after_compacting_and_vacuuming(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    for name in ("a", "b"):
        store.create(name, verl_rows(2))
        store.append(name, verl_rows(1, start=2))
    mirrors = tmp_path / "mirrors"
    cfg = {"store": {"root": str(store.root)},
           "mirror": {"format": "delta", "dest": str(mirrors)}}
    done = maintain_store(config=cfg)
    assert done["a"]["mirror"] == {"dest": str(mirrors / "a"), "version": 1, "committed": 2,
                                   "deleted_files": 0}
    assert delta_rows(mirrors / "b", 1) == as_multiset(store.load("b").to_list())

    store.append("b", verl_rows(1, start=3))
    done = maintain_store(dataset="b", config={**cfg, "round": {"compaction": {
        "max_small_shards": 0}}}, keep_versions=1, grace_seconds=0)
    head = store.head("b")
    assert head.operation == "vacuum" and done["b"]["mirror"]["version"] == head.version
    assert DeltaTable(str(mirrors / "b")).version() == head.version
    assert delta_rows(mirrors / "b", head.version) == as_multiset(store.load("b").to_list())


def test_a_dest_with_a_dataset_placeholder_names_each_table(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.create("a", verl_rows(2))
    dest = tmp_path / "lake" / "{dataset}" / "delta"
    done = maintain_store(config={"store": {"root": str(store.root)},
                                  "mirror": {"dest": str(dest)}})
    table = tmp_path / "lake" / "a" / "delta"
    assert done["a"]["mirror"]["dest"] == str(table)
    assert delta_rows(table, 0) == as_multiset(store.load("a").to_list())


def test_without_a_dest_there_is_no_mirror_and_a_bad_format_is_refused(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.create("a", verl_rows(2))
    done = maintain_store(config={"store": {"root": str(store.root)}})
    assert "mirror" not in done["a"]
    with pytest.raises(ConfigError, match="mirror.format: expected one of delta, found 'orc'"):
        maintain_store(config={"store": {"root": str(store.root)},
                               "mirror": {"format": "orc", "dest": str(tmp_path / "m")}})
