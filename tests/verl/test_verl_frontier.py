"""verl's dataset with `data.dyngen.sampler=frontier`: verl's sampler visits every index of
an epoch once, and the frontier decides which row fills each, by the difficulty record at
the served version; deterministic from the seed and version; verl's own order while nothing
is measured or with the default sampler."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dyngen.difficulty.record import LINEAGE_KEY, Observation, write_observations
from dyngen.errors import ConfigError
from dyngen.store import Store
from dyngen.store.keys import prompt_key
from tests.rows import verl_row, verl_rows
from tests.verl.test_verl_dataset import NAME, train_set, verl_config


def measured(root: Path, at_edge: list[int], all_right: list[int]) -> None:
    """Version 1 records rows `at_edge` at 4 of 8 right and `all_right` at 8 of 8."""
    store = Store(root)
    obs = [Observation(prompt_key(verl_row(i)["prompt"]), 5, 4, 8) for i in at_edge]
    obs += [Observation(prompt_key(verl_row(i)["prompt"]), 5, 8, 8) for i in all_right]
    store.append(NAME, verl_rows(1, start=900),
                 lineage={LINEAGE_KEY: {"observations": write_observations(store, NAME, obs)}})


def served(ds: Any) -> list[int]:
    return [int(ds[i]["index"]) for i in range(len(ds))]


def test_the_frontier_fills_verls_indices_with_measured_rows_by_weight(
        tmp_path: Path, qwen_tokenizer: Any) -> None:
    cfg = verl_config(tmp_path, sampler="frontier")
    train_set(cfg, qwen_tokenizer)  # the first run seeds version 0 from the files
    measured(tmp_path / "store", at_edge=[1, 2], all_right=[3])
    ds = train_set(cfg, qwen_tokenizer)
    assert ds.version == 1 and len(ds) == 8  # 7 files' rows + 1, the over-long one dropped
    drawn = Counter(served(ds))
    assert set(drawn) <= {1, 2, 3}  # unmeasured rows are not drawn
    assert drawn[1] + drawn[2] > drawn[3]  # 4 of 8 right is likelier mixed than 8 of 8
    assert served(train_set(cfg, qwen_tokenizer)) == served(ds)  # the same seed and version
    other = train_set(verl_config(tmp_path, sampler="frontier", seed=5), qwen_tokenizer)
    assert set(served(other)) <= {1, 2, 3} and served(other) != served(ds)  # another seed


def test_rows_a_new_version_adds_and_measures_are_weighed_where_they_join(
        tmp_path: Path, qwen_tokenizer: Any) -> None:
    cfg = verl_config(tmp_path, sampler="frontier")
    train_set(cfg, qwen_tokenizer)
    measured(tmp_path / "store", at_edge=[1], all_right=[])
    ds = train_set(cfg, qwen_tokenizer)
    assert set(served(ds)) == {1}
    # A round adds two rows, measures one of them at the edge and row 1 as all right since.
    store = Store(tmp_path / "store")
    obs = [Observation(prompt_key(verl_row(i)["prompt"]), 9, p, 8) for i, p in
           ((950, 4), (1, 8))]
    store.append(NAME, verl_rows(2, start=950),
                 lineage={LINEAGE_KEY: {"observations": write_observations(store, NAME, obs)}})
    assert ds.refresh() and ds.version == 2 and len(ds) == 10
    drawn = Counter(served(ds))
    assert set(drawn) <= {1, 950} and drawn[950] > 0  # row 951: never measured
    assert served(train_set(cfg, qwen_tokenizer)) == served(ds)  # read afresh: the same draw


def test_verls_own_order_while_nothing_is_measured_and_by_default(
        tmp_path: Path, qwen_tokenizer: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        ds = train_set(verl_config(tmp_path, sampler="frontier"), qwen_tokenizer)
    assert served(ds) == list(range(7))
    assert "no row of version 0 has a recent measurement" in caplog.text
    measured(tmp_path / "store", at_edge=[1], all_right=[])
    plain = train_set(verl_config(tmp_path), qwen_tokenizer)  # fresh_first: verl's order
    assert served(plain) == [*range(7), 900]


def test_a_sampler_that_is_not_one_is_refused_naming_the_choices(
        tmp_path: Path, qwen_tokenizer: Any) -> None:
    with pytest.raises(ConfigError, match="sampler: expected one of fresh_first, frontier"):
        train_set(verl_config(tmp_path, sampler="newest"), qwen_tokenizer)
