"""VerlDyngenDataset resumed from a verl checkpoint: the interrupted epoch replays exactly.

verl's legacy trainer (`trainer.use_v1=false`) is reduced to its data path: batches from
verl's StatefulDataLoader and sampler (`create_rl_sampler`, shuffled, seeded), a checkpoint
saved as `_save_checkpoint` saves it (`data.pt` = the dataloader's `state_dict()`, then the
tracker file), restored as `_load_checkpoint` restores it (the tracker file names the step,
as for verl's `find_latest_ckpt_path`, whose module needs peft; then verl's epoch-boundary
check), and `on_batch_end(batch=)` after each step, the checkpoint first.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig
from torchdata.stateful_dataloader import StatefulDataLoader
from verl import DataProto

from dyngen.store import Store
from tests.rows import verl_row
from tests.verl.test_verl_dataset import NAME, dataloader, scored, train_set, verl_config

# Rounds that commit while the trainer runs: after the checkpoint of the step named, before
# that step's on_batch_end. 7 seed rows in batches of 2: epoch 1 is steps 1-3 (7 rows); the
# round at step 2 makes epoch 2 steps 4-8 (10 rows); the one at step 6 joins epoch 3.
ROUNDS = {2: [verl_row(i, "gen") for i in (100, 101, 102)],
          6: [verl_row(i, "gen") for i in (103, 104)]}
LAST_STEP = 14  # the end of epoch 3 (12 rows: steps 9-14)


def config(tmp_path: Path, workers: int) -> DictConfig:
    tmp_path.mkdir(exist_ok=True)
    cfg = verl_config(tmp_path, every_n_batches=1000)
    cfg.data.dataloader_num_workers = workers
    cfg.trainer.use_v1 = False
    cfg.trainer.default_local_dir = str(tmp_path / "checkpoints")
    return cfg


def save_checkpoint(cfg: DictConfig, loader: StatefulDataLoader, step: int) -> None:
    """verl's `_save_checkpoint`, its dataloader part."""
    folder = Path(cfg.trainer.default_local_dir) / f"global_step_{step}"
    folder.mkdir(parents=True)
    torch.save(loader.state_dict(), folder / "data.pt")
    (folder.parent / "latest_checkpointed_iteration.txt").write_text(str(step))


def load_checkpoint(cfg: DictConfig, loader: StatefulDataLoader) -> int:
    """verl's `_load_checkpoint`, its dataloader part: the step resumed from."""
    root = cfg.trainer.default_local_dir
    step = int((Path(root) / "latest_checkpointed_iteration.txt").read_text())
    folder = os.path.join(root, f"global_step_{step}")
    if not (len(loader) > 0 and step % len(loader) == 0):  # verl's epoch-boundary check
        loader.load_state_dict(torch.load(os.path.join(folder, "data.pt"), weights_only=False))
    return step


def fit(cfg: DictConfig, ds: Any, loader: StatefulDataLoader, step: int = 0,
        crash_at: int | None = None) -> dict[int, list[int]]:
    """The rows (extra_info.index) of each step, as verl's `fit` draws them."""
    drawn: dict[int, list[int]] = {}
    while step < LAST_STEP:
        for batch_dict in loader:
            step += 1
            batch = DataProto.from_single_dict(batch_dict)
            drawn[step] = [int(i) for i in batch.non_tensor_batch["index"]]
            if step == crash_at:
                save_checkpoint(cfg, loader, step)
            if step in ROUNDS:  # a round of the server commits meanwhile
                Store(cfg.data.dyngen.root).append(NAME, ROUNDS[step], generator="gen",
                                                   round_id=f"r{step}")
            if step == crash_at:
                return drawn  # the trainer dies before this step's on_batch_end
            ds.on_batch_end(batch=scored(batch, [1.0, 0.0], step))
            if step == LAST_STEP:
                break
    return drawn


@pytest.mark.usefixtures("no_server")
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("crash_at", [2, 6])
def test_a_resumed_run_finishes_the_epoch_on_the_same_rows_and_grows_at_its_end(
        tmp_path: Path, qwen_tokenizer: Any, workers: int, crash_at: int) -> None:
    cfg = config(tmp_path / "uninterrupted", workers)
    whole_ds = train_set(cfg, qwen_tokenizer)
    whole = fit(cfg, whole_ds, dataloader(cfg, whole_ds))
    epochs = [sorted(i for s in range(a, b + 1) for i in whole[s]) for a, b in
              ((1, 3), (4, 8), (9, LAST_STEP))]
    assert set(epochs[0]) <= set(range(7)) and len(epochs[0]) == 6
    assert sorted(epochs[1]) == [*range(7), 100, 101, 102]  # the round at step 2, next epoch
    assert epochs[2] == [*range(7), *range(100, 105)]  # the round at step 6 joins epoch 3

    cfg = config(tmp_path / "interrupted", workers)
    ds = train_set(cfg, qwen_tokenizer)
    before = fit(cfg, ds, dataloader(cfg, ds), crash_at=crash_at)
    assert before == {s: whole[s] for s in range(1, crash_at + 1)}
    epoch_version = 0 if crash_at < 4 else 1
    saved = torch.load(Path(cfg.trainer.default_local_dir) / f"global_step_{crash_at}" /
                       "data.pt", weights_only=False)
    assert f"'dyngen_dataset': '{NAME}', 'version': {epoch_version}," in str(saved)

    restarted = train_set(cfg, qwen_tokenizer)  # the head is newer: a round committed
    assert Store(cfg.data.dyngen.root).head_version(NAME) == epoch_version + 1
    assert restarted.version == epoch_version and len(restarted) == (7 if crash_at < 4 else 10)
    loader = dataloader(cfg, restarted)
    assert len(loader) == (3 if crash_at < 4 else 5)  # the interrupted epoch's steps
    step = load_checkpoint(cfg, loader)
    after = fit(cfg, restarted, loader, step=step)
    assert after == {s: whole[s] for s in range(crash_at + 1, LAST_STEP + 1)}  # row for row
    assert restarted.version == whole_ds.version == 2 and len(restarted) == len(whole_ds) == 12


@pytest.mark.usefixtures("no_server")
def test_a_restart_at_an_epochs_end_serves_the_newest_version(
        tmp_path: Path, qwen_tokenizer: Any) -> None:
    cfg = config(tmp_path, 0)
    ds = train_set(cfg, qwen_tokenizer)
    fit(cfg, ds, dataloader(cfg, ds), crash_at=3)  # the epoch's last step; a round at step 2

    restarted = train_set(cfg, qwen_tokenizer)
    assert restarted.version == 1 and len(restarted) == 10
    assert restarted.state_dict()["first_step"] == 4  # the next epoch, on all 10 rows


def test_without_the_legacy_trainer_a_restart_serves_the_newest_version(
        tmp_path: Path, qwen_tokenizer: Any) -> None:
    """verl's V1 trainer never calls on_batch_end: no epoch is followed, none is replayed."""
    cfg = config(tmp_path, 0)
    cfg.trainer.use_v1 = True
    ds = train_set(cfg, qwen_tokenizer)
    loader = dataloader(cfg, ds)
    next(iter(loader))
    save_checkpoint(cfg, loader, 1)
    Store(cfg.data.dyngen.root).append(NAME, ROUNDS[2], generator="gen", round_id="r")
    assert train_set(cfg, qwen_tokenizer).version == 1
