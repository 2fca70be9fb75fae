"""The trainer-side dataset running rounds inline, as verl's synchronous mode did."""

from __future__ import annotations

from pathlib import Path

import pytest

from dyngen.store import Store
from dyngen.trainers.dataset import DyngenDataset
from tests.rows import verl_rows

pytestmark = pytest.mark.usefixtures("prefect_server")


def test_inline_rounds_grow_the_dataset_the_trainer_reads(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", verl_rows(4))
    config = {"data": {"datagen": {"path": "pkg://tests.flows.gens", "name": "UsesContext"}}}
    data = DyngenDataset(tmp_path, "ds", mode="inline", config=config, every_n_batches=2,
                         metrics_fn=lambda batch: {"score": sum(batch) / len(batch)})
    assert (len(data), data.version) == (4, 0)
    assert data.on_batch_end([0.2, 0.4]) is None  # batch 1 of 2: no round yet
    summary = data.on_batch_end([0.6, 0.8])
    assert summary["version"] == 1 and summary["created"]
    assert (len(data), data.version) == (5, 1)  # refreshed without a restart
    assert data[4]["data_source"] == "step-2" and data[4]["_dyngen_version"] == 1
    head = store.head("ds")
    assert head.lineage["trigger"]["metrics"] == {"score": pytest.approx(0.7)}
    again = DyngenDataset(tmp_path, "ds")  # a restarted trainer sees the generated row
    assert len(again) == 5


def test_generate_on_start_runs_one_round_before_the_first_batch_once_per_dataset(
        tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", verl_rows(4))
    config = {"data": {"datagen": {"path": "pkg://tests.flows.gens", "name": "UsesContext"}}}
    data = DyngenDataset(tmp_path, "ds", mode="inline", config=config, generate_on_start=True)
    assert (len(data), data.version) == (5, 1)  # the round's row is served from the start
    assert data.start_round is not None and data.start_round["version"] == 1
    head = store.head("ds")
    assert head.lineage["trigger"]["step"] == 0 and head.lineage["round"] == 1

    restarted = DyngenDataset(tmp_path, "ds", mode="inline", config=config,
                              generate_on_start=True)  # the head already has a round
    assert restarted.start_round is None and (restarted.version, len(restarted)) == (1, 5)
    assert store.head_version("ds") == 1
