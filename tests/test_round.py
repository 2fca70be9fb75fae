"""The round's Prefect-free core: triggers, generator output, context, cleanup on failure."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import datasets
import pandas as pd
import pyarrow as pa
import pytest

from dyngen.errors import GeneratorOutputError, TriggerError
from dyngen.filters import run_filters
from dyngen.generators.base import AbstractDataGenerator, MockDataGenerator
from dyngen.round import RoundContext, Trigger, call_generator, commit_round, rows_from_output
from dyngen.round.context import PreviousEvent
from dyngen.store import Store, gc
from tests.rows import verl_rows

ROWS = verl_rows(2)


@pytest.mark.parametrize("output", [
    datasets.Dataset.from_list(ROWS), pa.Table.from_pylist(ROWS), ROWS, tuple(ROWS),
    pd.DataFrame(ROWS), {k: [r[k] for r in ROWS] for k in ROWS[0]},
], ids=["Dataset", "Table", "list", "tuple", "DataFrame", "dict-of-lists"])
def test_unambiguous_outputs_become_rows(output: Any) -> None:
    assert rows_from_output(output, "Gen") == ROWS


@pytest.mark.parametrize("output,wording", [
    (None, "returned None"), (42, "returned a int"), ("text", "returned a str"),
    ({"a": 1}, "returned a dict"), ({"a": [1], "b": [1, 2]}, "returned a dict"),
])
def test_other_outputs_fail_naming_the_generator(output: Any, wording: str) -> None:
    with pytest.raises(GeneratorOutputError, match=f"generator Gen {wording}"):
        rows_from_output(output, "Gen")


def test_trigger_keys_and_validation() -> None:
    assert Trigger.parse(None).idempotency_key("ds") is None
    assert Trigger.parse({"step": 3}).idempotency_key("ds") == "ds:step:3"
    assert Trigger.parse({"event_id": "e", "step": 3}).idempotency_key("ds") == "event:e"
    assert Trigger.parse({"metrics": {"acc": 1}}).metrics == {"acc": 1.0}
    for bad in ([1], {"step": True}, {"step": -1}, {"metrics": {"a": float("nan")}},
                {"rollouts": 3}, {"metrics": {"k": 1} | {f"m{i}": 0 for i in range(300)}},
                {"event_id": "e" * 70_000}):
        with pytest.raises(TriggerError):
            Trigger.parse(bad)


def test_trigger_previous_names_the_batch_end_before_it_or_is_refused_saying_why() -> None:
    previous = {"event_id": "e-4", "step": 4, "seconds_before": 0.25}
    parsed = Trigger.parse({"step": 5, "previous": previous}).previous
    assert parsed == PreviousEvent("e-4", 4, 0.25)
    assert Trigger.parse({"step": 5}).previous is None
    hostile = {
        "a list": ([1], "must be a mapping of event_id, step and seconds_before, found list"),
        "a missing key": ({"event_id": "e", "step": 4}, "found ['event_id', 'step']"),
        "an extra key": (previous | {"cmd": "x"}, "found ['cmd', 'event_id'"),
        "no step": (previous | {"step": None}, "must be set, found 'e-4' and None"),
        "a text step": (previous | {"step": "4"}, "previous.step must be a non-negative"),
        "a long id": (previous | {"event_id": "e" * 201}, "previous.event_id must be a str"),
        "a negative gap": (previous | {"seconds_before": -1}, "seconds_before must be a non"),
        "an infinite gap": (previous | {"seconds_before": float("inf")}, "found inf"),
        "a bool gap": (previous | {"seconds_before": True}, "found True"),
    }
    for bad, message in hostile.values():
        with pytest.raises(TriggerError, match=re.escape(message)):
            Trigger.parse({"step": 5, "previous": bad})


def test_verl_generators_and_context_aware_generators_both_work() -> None:
    ds = datasets.Dataset.from_list(ROWS)
    ctx = RoundContext("ds", 3, 2, Trigger(step=9))

    class VerlStyle(AbstractDataGenerator):
        def generate(self, dataset):  # written for verl: reads rows via .dataframe
            return dataset.dataframe.select([1])

    class WantsContext(AbstractDataGenerator):
        def generate(self, dataset, context=None):
            return [{**dataset[0], "data_source": f"step{context.trigger.step}"}]

    assert call_generator(VerlStyle(None), ds, ctx) == [ROWS[1]]
    assert call_generator(WantsContext(None), ds, ctx)[0]["data_source"] == "step9"
    mock = MockDataGenerator()
    assert call_generator(mock, ds, ctx) == [ROWS[0]]
    assert mock.round_context is ctx


class DiskFullStore(Store):
    def commit(self, pending):  # fault injection: the disk fills up at the commit
        raise OSError(28, "No space left on device")


def test_a_failed_commit_removes_the_rounds_shards(tmp_path: Path) -> None:
    Store(tmp_path).create("ds", verl_rows(2))
    store = DiskFullStore(tmp_path)
    outcome = run_filters(verl_rows(2, start=5), [])
    outcome.rejected = [{"reason": "schema", "detail": "x", "row": "{}"}]
    pending = store.prepare_append("ds", outcome.kept, rejected=outcome.rejected)
    files = [store.dataset_dir("ds") / f for s in pending.new_shards + pending.rejected
             for f in s.files]
    assert all(f.exists() for f in files)
    with pytest.raises(OSError, match="No space left"):
        commit_round(store, pending)
    assert not any(f.exists() for f in files)
    assert store.head("ds").version == 0
    assert gc(store, "ds", grace_seconds=0) == []


def test_a_generator_that_maps_the_dataset_writes_nothing_into_the_store(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", verl_rows(3))
    before = sorted(p.name for p in (store.dataset_dir("ds") / "data").iterdir())

    class Mapper(AbstractDataGenerator):
        def generate(self, dataset):
            shouted = dataset.map(lambda r: {"data_source": r["data_source"].upper()})
            return shouted.filter(lambda r: r["extra_info"]["index"] == 0)

    ds = store.load("ds")
    rows = call_generator(Mapper(None), ds, RoundContext("ds", 1, 0, Trigger()))
    assert rows[0]["data_source"] == "SEED"
    assert sorted(p.name for p in (store.dataset_dir("ds") / "data").iterdir()) == before
    assert datasets.is_caching_enabled()


def test_lineage_saves_the_generators_state_and_stats_as_json() -> None:
    """`state` and `stats` a generator sets are recorded (JSON-safe); other attributes not."""
    from omegaconf import OmegaConf

    from dyngen.round import generator_lineage

    gen = MockDataGenerator()
    gen.state = {"level": 3}
    gen.stats = {"methods": {"computed": {"proposed": 4, "kept": 1,
                                          "dropped": {"not_verified": 3}}}, "at": Path("/x")}
    datagen = OmegaConf.create({"path": "pkg://dyngen.generators.base",
                                "name": "MockDataGenerator"})
    lineage = generator_lineage(datagen, gen)
    assert lineage["state"] == {"level": 3}
    assert lineage["stats"] == {"methods": {"computed": {"proposed": 4, "kept": 1,
                                                         "dropped": {"not_verified": 3}}},
                                "at": "/x"}
    assert "stats" not in generator_lineage(datagen, MockDataGenerator())


def test_a_partitioned_rounds_lineage_keeps_every_partitions_stats() -> None:
    from dyngen.round.partitions import union_generator_lineage

    parts = [{"class": "G", "state": {"seen": i}, "stats": {"kept": i + 1}} for i in range(3)]
    merged = union_generator_lineage(parts)
    assert merged["stats"] == {"kept": 1}  # partition 0's, as an unpartitioned round's
    assert merged["partition_stats"] == [{"kept": 1}, {"kept": 2}, {"kept": 3}]
    assert merged["partition_states"] == [{"seen": 0}, {"seen": 1}, {"seen": 2}]
    assert "partition_stats" not in union_generator_lineage([{"class": "G"}] * 2)


def test_a_generator_loaded_from_a_file_is_shown_by_its_class_not_dyngens_module_name(
        tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from dyngen.generators.base import AbstractDataGenerator
    from dyngen.plugins import MODULE_PREFIX, load_class
    from dyngen.round import generator_lineage
    from dyngen.round.lineage import lineage_cells, shown_class

    source = tmp_path / "harder_sums.py"
    source.write_text("from dyngen.generators.base import AbstractDataGenerator\n\n"
                      "class HarderSums(AbstractDataGenerator):\n"
                      "    def generate(self, dataset):\n        return []\n")
    cls = load_class(str(source), "HarderSums", AbstractDataGenerator)
    lineage = generator_lineage(OmegaConf.create({"path": str(source), "name": "HarderSums"}),
                                cls({}))
    # The record keeps the full name (it finds the generator's state); people see the class.
    assert lineage["class"].startswith(MODULE_PREFIX) and lineage["path"] == str(source)
    assert shown_class(lineage) == "HarderSums"
    assert lineage_cells({"generator": lineage})[0] == "HarderSums"
    packaged = {"class": "dyngen.generators.base.MockDataGenerator", "name": "MockDataGenerator"}
    assert shown_class(packaged) == "dyngen.generators.base.MockDataGenerator"
