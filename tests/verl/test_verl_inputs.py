"""VerlDyngenDataset reads the files verl reads, and serves what verl's RLHFDataset serves.

Each test builds verl's own class and dyngen's (verl's `create_rl_dataset` with
`data.custom_cls`) over the same files and compares the rows `__getitem__` returns
(dyngen's `_dyngen_*` provenance keys aside).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from omegaconf import DictConfig
from verl.trainer.ppo.utils import create_rl_dataset
from verl.utils.dataset.rl_dataset import RLHFDataset

from dyngen.store import Store
from tests.rows import verl_row, verl_rows
from tests.verl.test_verl_dataset import NAME, verl_config

LONG = "word " * 400


def rows_without(keys: tuple[str, ...], n: int = 6) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in keys} for r in verl_rows(n)]


def both(cfg: DictConfig, tokenizer: Any, files: list[str], **kw: Any) -> tuple[Any, Any]:
    """(verl's RLHFDataset, dyngen's VerlDyngenDataset) over `files`."""
    ours = create_rl_dataset(files, cfg.data, tokenizer, None, **kw)
    theirs = RLHFDataset(files, tokenizer, cfg.data, max_samples=kw.get("max_samples", -1))
    return theirs, ours


def served(ds: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in ds[i].items() if not k.startswith("_dyngen_")
             and k != "dummy_tensor"} for i in range(len(ds))]


def config(tmp_path: Path, files: list[str], **data: Any) -> DictConfig:
    cfg = verl_config(tmp_path)
    cfg.data.train_files = files
    for key, value in data.items():
        cfg.data[key] = value
    return cfg


def test_a_pretty_printed_json_array_without_optional_columns(
        tmp_path: Path, qwen_tokenizer: Any) -> None:
    """The shape of verl's own video test file: `json.dump(rows, f, indent=2)`, a `.json`
    array whose rows have no `ability`, `extra_info` or `reward_model`."""
    path = tmp_path / "rows.json"
    rows = rows_without(("ability", "extra_info", "reward_model"))
    rows.append({**rows[0], "prompt": [{"role": "user", "content": LONG}]})  # over-long
    path.write_text(json.dumps(rows, indent=2))
    cfg = config(tmp_path, [str(path)])
    theirs, ours = both(cfg, qwen_tokenizer, [str(path)])
    assert len(theirs) == len(ours) == 6 and ours.version == 0
    assert served(ours) == served(theirs)
    assert {r["index"] for r in served(ours)} == {0}  # verl's default for no extra_info


def test_parquet_without_ability_or_extra_info(tmp_path: Path, qwen_tokenizer: Any) -> None:
    path = tmp_path / "mine.parquet"
    pq.write_table(pa.Table.from_pylist(rows_without(("ability", "extra_info"))), path)
    cfg = config(tmp_path, [str(path)], filter_overlong_prompts=False)
    theirs, ours = both(cfg, qwen_tokenizer, [str(path)])
    assert len(ours) == 6 and served(ours) == served(theirs)
    assert "ability" not in served(ours)[0] and served(ours)[0]["extra_info"] == {}


@pytest.mark.parametrize(("filter_overlong", "kept"), [(False, 6), (True, 0)])
def test_a_plain_string_prompt_is_served_where_verl_serves_it(
        tmp_path: Path, qwen_tokenizer: Any, filter_overlong: bool, kept: int) -> None:
    """verl serves a plain-string prompt as `raw_prompt` when it does not filter; its
    over-long filter cannot apply a chat template to a string and drops the row."""
    rows = verl_rows(6)
    for row in rows:
        row["prompt"] = row["prompt"][1]["content"]
    path = tmp_path / "mine.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    cfg = config(tmp_path, [str(path)], filter_overlong_prompts=filter_overlong)
    theirs, ours = both(cfg, qwen_tokenizer, [str(path)])
    assert len(theirs) == len(ours) == kept
    assert served(ours) == served(theirs)
    if kept:
        assert served(ours)[0]["raw_prompt"] == "What is 0 + 0?"


@pytest.mark.parametrize("shuffle", [True, False])
def test_max_samples_picks_the_files_rows_as_verl_does_and_the_same_at_every_start(
        tmp_path: Path, qwen_tokenizer: Any, shuffle: bool) -> None:
    path = tmp_path / "mine.parquet"
    pq.write_table(pa.Table.from_pylist(verl_rows(20)), path)
    cfg = config(tmp_path, [str(path)], shuffle=shuffle, seed=3, filter_overlong_prompts=False)
    theirs, ours = both(cfg, qwen_tokenizer, [str(path)], max_samples=5)
    picked = [r["index"] for r in served(theirs)]
    assert len(picked) == 5 and [r["index"] for r in served(ours)] == picked

    Store(cfg.data.dyngen.root).append(NAME, [verl_row(100, "gen"), verl_row(101, "gen")])
    restarted = create_rl_dataset([str(path)], cfg.data, qwen_tokenizer, None, max_samples=5)
    assert restarted.version == 1
    assert [r["index"] for r in served(restarted)] == [*picked, 100, 101]  # rounds' rows all
    assert ours.refresh() and [r["index"] for r in served(ours)] == [*picked, 100, 101]


def test_val_files_equal_to_train_files_are_verls_plain_validation_set(
        tmp_path: Path, qwen_tokenizer: Any) -> None:
    """As verl's trainer builds both: the validation set never grows with rounds."""
    cfg = verl_config(tmp_path)
    cfg.data.val_files = cfg.data.train_files
    cfg.data.filter_overlong_prompts = False  # all 8 rows (verl's filter is tested above)
    train = create_rl_dataset(cfg.data.train_files, cfg.data, qwen_tokenizer, None,
                              is_train=True)
    Store(cfg.data.dyngen.root).append(NAME, [verl_row(100, "gen")])
    assert train.refresh() and len(train) == 9
    val = create_rl_dataset(cfg.data.val_files, cfg.data, qwen_tokenizer, None,
                            is_train=False)
    assert val.version is None and val.state_dict() == {}
    assert served(val) == served(RLHFDataset(cfg.data.val_files, qwen_tokenizer, cfg.data))
    assert sorted(r["index"] for r in served(val)) == list(range(8))
    again = create_rl_dataset(cfg.data.train_files, cfg.data, qwen_tokenizer, None)
    assert again.version == 1 and len(again) == 9  # the training set is the store's
