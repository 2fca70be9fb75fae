"""round_params, the one builder of a round's config, and the one rule for the store root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dyngen.config import round_params
from dyngen.errors import ConfigError
from dyngen.locations import store_root
from tests.config.files import write_yaml


def test_round_params_are_plain_resolved_and_validated(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "data:\n  max_prompt_length: 256\n")
    params = round_params({"round": {"retries": 0}}, path=path,
                          overrides=["round.partitions=2"], root=tmp_path / "store")
    assert isinstance(params, dict) and not OmegaConf.is_config(params)
    assert params["store"]["root"] == str(tmp_path / "store")
    assert params["data"]["max_prompt_length"] == 256
    assert (params["round"]["retries"], params["round"]["partitions"]) == (0, 2)
    # The default rollouts folder follows the root it was given.
    assert params["round"]["rollouts_dirs"] == [f"{tmp_path / 'store'}/rollouts"]


def test_round_params_allow_more_rollouts_folders(tmp_path: Path) -> None:
    params = round_params(root="/s", rollouts_dirs=[tmp_path])
    assert params["round"]["rollouts_dirs"] == ["/s/rollouts", str(tmp_path)]


def test_round_params_absolute_for_runs_started_elsewhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    params = round_params(root="rel", rollouts_dirs=["more"], absolute=True)
    assert params["store"]["root"] == str(tmp_path / "rel")
    assert params["round"]["rollouts_dirs"] == [str(tmp_path / "rel" / "rollouts"),
                                                str(tmp_path / "more")]


def test_round_params_absolute_name_plugin_files_from_where_they_were_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A served round runs in another folder: `generators/my_gen.py` must still be found."""
    monkeypatch.chdir(tmp_path)
    params = round_params(overrides=["data.datagen.path=generators/my_gen.py",
                                     "data.datagen.name=MyGen"], absolute=True)
    assert params["data"]["datagen"]["path"] == str(tmp_path / "generators" / "my_gen.py")
    params = round_params(overrides=["data.datagen.path=file://gens/g.py",
                                     "data.datagen.name=G"], absolute=True)
    assert params["data"]["datagen"]["path"] == "file://" + str(tmp_path / "gens" / "g.py")
    builtin = round_params(overrides=["data.datagen.path=pkg://dyngen.generators.arithmetic",
                                      "data.datagen.name=ArithmeticCurriculum"], absolute=True)
    assert builtin["data"]["datagen"]["path"] == "pkg://dyngen.generators.arithmetic"


def test_round_params_refuse_a_config_that_is_not_a_mapping() -> None:
    with pytest.raises(ConfigError, match="config: expected a mapping with sections store, "
                                          "data and round, found list"):
        round_params(["store"])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="round.partitions"):
        round_params({"round": {"partitions": 0}})


def test_store_root_given_then_environment_then_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DYNGEN_STORE_ROOT", raising=False)
    assert store_root() == "dyngen_store"
    monkeypatch.setenv("DYNGEN_STORE_ROOT", "s3://bucket/store")
    assert store_root() == "s3://bucket/store"  # a URL stays a URL
    assert store_root(Path("/given")) == "/given"
    # The config's default store.root follows the same rule.
    assert round_params()["store"]["root"] == os.environ["DYNGEN_STORE_ROOT"]
