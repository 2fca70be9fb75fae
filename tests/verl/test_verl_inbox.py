"""verl's legacy path records each batch end in the store under its training run: verl's
`trainer.experiment_name`, or `data.dyngen.run` (real verl 0.9.1 builds the dataset)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from verl import DataProto

from dyngen.store import Store
from tests.verl.test_verl_dataset import NAME, dataloader, scored, train_set, verl_config


def one_batch_end(cfg: Any, tokenizer: Any) -> None:
    ds = train_set(cfg, tokenizer)
    batch = scored(DataProto.from_single_dict(next(iter(dataloader(cfg, ds)))), [1.0, 0.0], 4)
    ds.on_batch_end(batch=batch)


def test_the_batch_end_is_recorded_under_verls_experiment_name(
        tmp_path: Path, qwen_tokenizer: Any, no_server: None) -> None:
    cfg = verl_config(tmp_path)
    OmegaConf.update(cfg, "trainer.experiment_name", "qwen-grpo-3")
    one_batch_end(cfg, qwen_tokenizer)
    store = Store(tmp_path / "store")
    entry = store.batch_end(NAME, "qwen-grpo-3", 4)
    assert entry is not None and entry.metrics["score/mean"] == 0.5
    assert [e.key for e in store.pending(NAME)] == [("qwen-grpo-3", 4)]  # a round's to cover


def test_data_dyngen_run_names_the_run(tmp_path: Path, qwen_tokenizer: Any,
                                       no_server: None) -> None:
    one_batch_end(verl_config(tmp_path, run="given-run"), qwen_tokenizer)
    assert [e.key for e in Store(tmp_path / "store").batch_ends(NAME)] == [("given-run", 4)]
