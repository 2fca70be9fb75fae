"""VerlDyngenDataset against real verl 0.9.1 (CPU): verl builds it, batches it and calls it.

Runs in .venv-verl (scripts/test-verl.sh); tests/conftest.py skips collecting this folder
where verl is not installed. Every verl entry point used is the one verl's trainer uses:
`create_rl_dataset` with `data.custom_cls`, `create_rl_sampler`, `collate_fn`,
`StatefulDataLoader`, `DataProto.from_single_dict` and `train_dataset.on_batch_end(batch=)`.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import verl
from omegaconf import DictConfig, OmegaConf
from torchdata.stateful_dataloader import StatefulDataLoader
from verl import DataProto
from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

import dyngen.trainers.events as events
from dyngen.errors import GeneratorClassNotFoundError, GeneratorNotFoundError
from dyngen.round.top_up import ROWS_WANTED
from dyngen.store import Store, gc
from dyngen.trainers.verl_dataset import VerlDyngenDataset
from tests.rows import verl_row, verl_rows
from tests.support import UNUSED_API

NAME = "gsm8k-dyn"
LONG = "word " * 400  # far over max_prompt_length in Qwen3 tokens


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def verl_config(tmp_path: Path, **dyngen: Any) -> DictConfig:
    """verl's own generated PPO config, with the overrides a user would pass on the CLI."""
    base = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml")
    rows = [*verl_rows(7), verl_row(7, content=LONG)]  # verl's filter drops the last one
    overrides = {"data": {
        "train_files": [write_parquet(tmp_path / "train.parquet", rows)],
        "val_files": [write_parquet(tmp_path / "test.parquet", verl_rows(3, start=50))],
        "max_prompt_length": 128, "filter_overlong_prompts": True, "train_batch_size": 2,
        "dataloader_num_workers": 0, "seed": 1, "cache_dir": str(tmp_path / "verl-cache"),
        "custom_cls": {"path": "pkg://dyngen.verl_dataset", "name": "VerlDyngenDataset"},
        "dyngen": {"dataset": NAME, "root": str(tmp_path / "store"), **dyngen},
    }}
    cfg = OmegaConf.merge(base, overrides)
    OmegaConf.set_struct(cfg, True)  # as Hydra hands it to the trainer
    return cfg


def train_set(cfg: DictConfig, tokenizer: Any) -> VerlDyngenDataset:
    """The training set exactly as verl's RayPPOTrainer._create_dataloader builds it."""
    ds = create_rl_dataset(cfg.data.train_files, cfg.data, tokenizer, None,
                           max_samples=cfg.data.get("train_max_samples", -1))
    assert isinstance(ds, VerlDyngenDataset)
    return ds


def dataloader(cfg: DictConfig, ds: Any) -> StatefulDataLoader:
    """verl's training dataloader (ray_trainer.py `_create_dataloader`)."""
    return StatefulDataLoader(dataset=ds, batch_size=cfg.data.train_batch_size,
                              num_workers=cfg.data.dataloader_num_workers, drop_last=True,
                              collate_fn=collate_fn, sampler=create_rl_sampler(cfg.data, ds))


def indices(ds: RLHFDataset) -> list[int]:
    return sorted(int(ds[i]["index"]) for i in range(len(ds)))


def scored(batch: DataProto, scores: list[float], step: int) -> DataProto:
    """The batch as it is when verl's fit loop calls on_batch_end: rewards in, step set."""
    width = 3
    reward = torch.zeros(len(batch), width)
    reward[:, -1] = torch.tensor(scores)  # verl puts a sequence's reward on its last token
    batch.batch["token_level_scores"] = reward
    batch.non_tensor_batch["acc"] = np.array([s > 0.5 for s in scores], dtype=object)
    batch.meta_info["global_steps"] = step
    return batch


def test_only_dyngen_verl_dataset_imports_verl() -> None:
    code = ("import sys, dyngen, dyngen.trainers.dataset; "
            "print(sorted(m for m in ('verl', 'torch', 'flows') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[2])
    assert out.stdout.strip() == "[]"


def test_first_run_seeds_the_store_and_later_runs_read_only_the_store(
        tmp_path: Path, qwen_tokenizer: Any) -> None:
    cfg = verl_config(tmp_path)
    first = train_set(cfg, qwen_tokenizer)
    store = Store(cfg.data.dyngen.root)
    assert store.head(NAME).rows == 8 and first.version == 0
    assert indices(first) == list(range(7))  # verl's over-long prompt filter still applies

    store.append(NAME, [verl_row(100, source="gen")], generator="gen", round_id="r1")
    os.remove(cfg.data.train_files[0])  # a resumed run must not need the original files
    resumed = train_set(cfg, qwen_tokenizer)
    assert resumed.version == 1
    assert indices(resumed) == [*range(7), 100]
    row = resumed[len(resumed) - 1]
    assert (row["data_source"], row["_dyngen_version"], row["_dyngen_generator"]) == \
        ("gen", 1, "gen")
    assert row["raw_prompt"][1]["content"] == "What is 100 + 100?"  # verl's __getitem__


def test_the_validation_set_is_verls_own_over_its_files(
        tmp_path: Path, qwen_tokenizer: Any) -> None:
    cfg = verl_config(tmp_path)
    val = create_rl_dataset(cfg.data.val_files, cfg.data, qwen_tokenizer, None, is_train=False)
    assert isinstance(val, VerlDyngenDataset) and val.version is None
    assert indices(val) == [50, 51, 52]
    assert val.on_batch_end(batch=None) is None
    assert not Path(cfg.data.dyngen.root).exists()  # the store is the training set's only


def test_batches_are_verls_and_carry_provenance(tmp_path: Path, qwen_tokenizer: Any) -> None:
    cfg = verl_config(tmp_path)
    ds = train_set(cfg, qwen_tokenizer)
    loader = dataloader(cfg, ds)
    assert len(loader) == 3  # 7 rows, batches of 2, drop_last
    batch = DataProto.from_single_dict(next(iter(loader)))
    assert len(batch) == 2 and batch.batch["dummy_tensor"].shape == (2, 1)
    extra = batch.non_tensor_batch
    assert {"raw_prompt", "index", "data_source", "reward_model", "_dyngen_version",
            "_dyngen_generator"} <= set(extra)
    assert list(extra["_dyngen_version"]) == [0, 0]


def test_on_batch_end_records_metrics_derived_from_the_batch(
        tmp_path: Path, qwen_tokenizer: Any, no_server: None) -> None:
    cfg = verl_config(tmp_path, every_n_batches=1)
    ds = train_set(cfg, qwen_tokenizer)
    batch = scored(DataProto.from_single_dict(next(iter(dataloader(cfg, ds)))), [1.0, 0.0], 7)
    expected = {"score/mean": 0.5, "score/max": 1.0, "score/min": 0.0, "acc/mean": 0.5}
    assert ds.metrics_from_batch(batch) == expected

    assert ds.on_batch_end(batch=batch) is not None  # ray_trainer.py: on_batch_end(batch=batch)
    # The batch end a round covers is the one in the store's inbox: step 7, its metrics,
    # and the prompts verl draws before the next round (its batch size, 2, every batch).
    (entry,) = Store(cfg.data.dyngen.root).batch_ends(NAME)
    assert entry.step == 7 and dict(entry.metrics) == {**expected, ROWS_WANTED: 2.0}


def test_metrics_fall_back_to_the_reward_functions_score(
        tmp_path: Path, qwen_tokenizer: Any) -> None:
    ds = train_set(verl_config(tmp_path), qwen_tokenizer)
    batch = DataProto.from_single_dict({
        "dummy_tensor": torch.zeros(4, 1, dtype=torch.uint8),
        "score": np.array([0.0, 1.0, 1.0, 1.0], dtype=object),
    })
    assert ds.metrics_from_batch(batch) == {"score/mean": 0.75, "score/max": 1.0,
                                            "score/min": 0.0}
    assert ds.metrics_from_batch(DataProto.from_single_dict(
        {"dummy_tensor": torch.zeros(2, 1)})) == {}


def test_with_no_server_on_batch_end_returns_quickly_and_warns(
        tmp_path: Path, qwen_tokenizer: Any, no_server: None,
        caplog: pytest.LogCaptureFixture) -> None:
    cfg = verl_config(tmp_path)
    ds = train_set(cfg, qwen_tokenizer)
    batch = scored(DataProto.from_single_dict(next(iter(dataloader(cfg, ds)))), [1.0, 1.0], 3)
    caplog.set_level(logging.WARNING, logger="dyngen")
    start = time.monotonic()
    assert ds.on_batch_end(batch=batch) is not None  # the event waits in the outbox
    assert time.monotonic() - start < events.MAX_EMIT_SECONDS
    assert f"'{NAME}' step 3 was not sent" in caplog.text and UNUSED_API in caplog.text


def test_rows_of_a_round_join_the_next_epoch_and_survive_a_restart(
        tmp_path: Path, qwen_tokenizer: Any, no_server: None) -> None:
    cfg = verl_config(tmp_path)
    ds = train_set(cfg, qwen_tokenizer)
    loader = dataloader(cfg, ds)
    epoch = iter(loader)
    first = DataProto.from_single_dict(next(epoch))

    # Meanwhile the server's round commits rows (one too long for the trainer's limit).
    worker = Store(cfg.data.dyngen.root)
    new = [verl_row(100, "gen"), verl_row(101, "gen"), verl_row(102, "gen", content=LONG)]
    worker.append(NAME, new, generator="gen", round_id="r1")
    ds.on_batch_end(batch=scored(first, [0.0, 1.0], 1))
    assert ds.version == 1 and len(ds) == 9  # verl's filter dropped row 102
    shards = [Path(f["filename"]) for f in ds.dataframe.cache_files]  # mapped, not copied
    data_dir = Path(cfg.data.dyngen.root) / NAME / "data"
    assert len(shards) == 2 and {p.parent for p in shards} == {data_dir}

    # The running epoch keeps its 7-row order; every index it draws is still a seed row.
    rest = [int(i) for b in epoch for i in b["index"]]
    assert len(rest) == 4 and set(rest) <= set(range(7))
    # The next epoch samples the grown dataset.
    assert len(loader) == 4
    drawn = [int(i) for b in loader for i in b["index"]]
    assert len(drawn) == 8 and set(drawn) <= {*range(7), 100, 101}

    restarted = train_set(cfg, qwen_tokenizer)
    assert restarted.version == 1 and indices(restarted) == indices(ds)
    # verl's filter wrote no index files beside the shards: nothing for gc to collect.
    assert gc(worker, NAME, grace_seconds=0, dry_run=True) == []


def test_a_restore_is_left_for_the_next_start(
        tmp_path: Path, qwen_tokenizer: Any, no_server: None,
        caplog: pytest.LogCaptureFixture) -> None:
    cfg = verl_config(tmp_path)
    ds = train_set(cfg, qwen_tokenizer)
    store = Store(cfg.data.dyngen.root)
    store.append(NAME, [verl_row(100, "gen")])
    assert ds.refresh() is True and len(ds) == 8
    store.restore(NAME, 0)
    assert ds.refresh() is False
    assert ds.version == 1 and len(ds) == 8  # indices the sampler holds stay valid
    assert "does not extend version 1" in caplog.text
    assert train_set(cfg, qwen_tokenizer).version == 2


def test_verls_parallel_filter_writes_no_file_beside_the_shards(
        tmp_path: Path, qwen_tokenizer: Any) -> None:
    cfg = verl_config(tmp_path)
    cfg.data.filter_overlong_prompts_workers = 2  # verl's own datasets.filter, two processes
    ds = train_set(cfg, qwen_tokenizer)
    assert indices(ds) == list(range(7))
    data_dir = Path(cfg.data.dyngen.root) / NAME / "data"
    assert [p.name for p in data_dir.iterdir() if p.name.startswith("cache-")] == []
    assert gc(Store(cfg.data.dyngen.root), NAME, grace_seconds=0, dry_run=True) == []


@pytest.mark.usefixtures("prefect_server")
def test_inline_mode_runs_the_round_in_the_trainer_and_serves_its_rows(
        tmp_path: Path, qwen_tokenizer: Any) -> None:
    datagen = {"path": "pkg://tests.flows.gens", "name": "AddNewRows", "start": 100, "n": 2}
    # One generator call: AddNewRows writes the same rows whatever the attempt, so asking
    # again for the 4 rows verl draws before the next round (2 a batch) only repeats them.
    cfg = verl_config(tmp_path, mode="inline", every_n_batches=2,
                      config={"data": {"datagen": datagen},
                              "round": {"retries": 0, "top_up": {"max_attempts": 1}}})
    ds = train_set(cfg, qwen_tokenizer)
    batch = DataProto.from_single_dict(next(iter(dataloader(cfg, ds))))
    assert ds.on_batch_end(batch=scored(batch, [1.0, 0.0], 1)) is None  # batch 1 of every 2
    summary = ds.on_batch_end(batch=scored(batch, [1.0, 1.0], 2))
    assert summary is not None and (summary["version"], summary["created"]) == (1, True)
    assert summary["counts"]["rejected"] == {"duplicate": 1}  # AddNewRows re-proposes row 0
    assert ds.version == 1 and indices(ds) == [*range(7), 100, 101]

    lineage = Store(cfg.data.dyngen.root).head(NAME).lineage
    assert lineage["trigger"]["step"] == 2
    assert lineage["trigger"]["metrics"] == {"score/mean": 1.0, "score/max": 1.0,
                                             "score/min": 1.0, "acc/mean": 1.0,
                                             ROWS_WANTED: 4.0}
    # verl's 4 rows reached the round: it kept 2, with one call allowed, and says so
    assert (lineage["top_up"]["wanted"], lineage["top_up"]["kept"]) == (4, [2])
    assert lineage["top_up"]["stopped"] == "budget"


@pytest.mark.usefixtures("prefect_server")
def test_generate_on_start_runs_one_round_before_the_first_batch_not_again_on_restart(
        tmp_path: Path, qwen_tokenizer: Any) -> None:
    datagen = {"path": "pkg://tests.flows.gens", "name": "AddNewRows", "start": 100, "n": 2}
    cfg = verl_config(tmp_path, mode="inline", generate_on_start=True,
                      config={"data": {"datagen": datagen}, "round": {"retries": 0}})
    ds = train_set(cfg, qwen_tokenizer)  # seeds version 0, then the start round: version 1
    assert ds.version == 1 and indices(ds) == [*range(7), 100, 101]
    store = Store(cfg.data.dyngen.root)
    assert store.head(NAME).lineage["trigger"]["step"] == 0
    loader = dataloader(cfg, ds)
    assert len(loader) == 4  # the first epoch already samples the generated rows

    restarted = train_set(cfg, qwen_tokenizer)  # the head has a round: none is asked for
    assert restarted.version == 1 and store.head_version(NAME) == 1


def test_inline_a_generator_that_cannot_be_loaded_stops_verl_building_the_dataset(
        tmp_path: Path, qwen_tokenizer: Any) -> None:
    missing = str(tmp_path / "generators" / "my_gen.py")
    cfg = verl_config(tmp_path, mode="inline",
                      config={"data": {"datagen": {"path": missing, "name": "MyGen"}}})
    with pytest.raises(GeneratorNotFoundError, match="my_gen.py") as raised:
        train_set(cfg, qwen_tokenizer)
    assert "\n" not in str(raised.value)  # dyngen's one line, not a traceback per batch


CRASHES = """
from dyngen import AbstractDataGenerator

class MyGen(AbstractDataGenerator):
    def generate(self, dataset):
        raise RuntimeError("proposer crashed: CUDA error (simulated)")
"""


@pytest.mark.usefixtures("prefect_server")
def test_inline_a_round_that_fails_while_running_is_logged_and_verl_goes_on(
        tmp_path: Path, qwen_tokenizer: Any, caplog: pytest.LogCaptureFixture) -> None:
    gen = tmp_path / "my_gen.py"
    gen.write_text(CRASHES)
    cfg = verl_config(tmp_path, mode="inline", config={
        "data": {"datagen": {"path": str(gen), "name": "MyGen"}}, "round": {"retries": 0}})
    ds = train_set(cfg, qwen_tokenizer)
    batch = DataProto.from_single_dict(next(iter(dataloader(cfg, ds))))
    assert ds.on_batch_end(batch=scored(batch, [1.0, 0.0], 1)) is None
    assert "proposer crashed" in caplog.text and ds.version == 0 and indices(ds) == [*range(7)]
    gen.write_text("")  # the generator's file is emptied meanwhile: no round can start now
    with pytest.raises(GeneratorClassNotFoundError, match="no attribute 'MyGen'"):
        ds.on_batch_end(batch=scored(batch, [1.0, 0.0], 2))  # verl's trainer stops here
