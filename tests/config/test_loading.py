"""dyngen.config: defaults, YAML file, dotlist overrides, validation, hashing."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dyngen.config import (
    config_hash,
    default_config,
    load_config,
    tokenizer_path,
    validate,
)
from dyngen.errors import ConfigError
from tests.config.files import write_yaml

# --- defaults and sources ------------------------------------------------------------------


def test_defaults_match_documented_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DYNGEN_STORE_ROOT", raising=False)
    cfg = load_config()
    assert OmegaConf.to_container(cfg, resolve=True) == {
        "store": {"root": "dyngen_store", "storage_options": {}, "single_writer": False,
                  "cache_dir": None},
        "data": {
            "prompt_key": "prompt",
            "max_prompt_length": 512,
            "filter_overlong_prompts": False,
            "apply_chat_template_kwargs": {},
            "tokenizer": None,
            "datagen": {"path": "pkg://dyngen.generators.base", "name": "MockDataGenerator"},
        },
        "round": {
            "retries": 2,
            "retry_delay_seconds": 2.0,
            "timeout_seconds": 600.0,
            "dedup": True,
            "near_duplicate": {"enabled": True, "threshold": 0.8, "num_perm": 128, "bands": 16,
                               "ngram": 5, "min_words": 10, "answer_gate": True},
            "semantic_duplicate": {"enabled": False, "model": "minilm", "endpoint": None,
                                   "threshold": 0.95, "numbers_must_match": True,
                                   "answer_gate": True, "same_answer_threshold": 0.6},
            "solve_rate": {"enabled": False, "endpoint": None, "model_name": None,
                           "api_key_env": None, "model_path": None, "gguf_file": None,
                           "samples": 8, "keep": [0.125, 0.875], "temperature": 1.0,
                           "max_tokens": 512, "pass_threshold": 1.0,
                           "sequential": {"enabled": False, "first": 4, "step": 8, "cap": 32,
                                          "confidence": 0.9},
                           "reward": {"path": None, "name": "compute_score"},
                           "max_concurrency": 16, "max_retries": 3,
                           "request_timeout_seconds": None, "seed": 0},
            "filters": [],
            "partitions": 1,
            "task_runner": {"kind": "threads", "address": None, "init_kwargs": {},
                            "remote_options": {}},
            "rollouts_dirs": ["dyngen_store/rollouts"],
            "max_rollouts_bytes": 64 * 1024 * 1024,
            "compaction": {"enabled": True, "max_small_shards": 50, "fan_in": 8,
                           "target_shard_mb": 128.0},
            "difficulty": {"enabled": True, "half_life_steps": 4.0, "retire_min_samples": 16,
                           "retire_window_steps": 8, "revive_rise": 0.25,
                           "broken_reward_min_groups": 8, "broken_reward_share": 0.95},
            "top_up": {"min_rows": None, "max_attempts": 3},
        },
        "mirror": {"format": "delta", "dest": None, "storage_options": {},
                   "delta_options": {}},
    }


def test_default_config_is_fresh_each_call() -> None:
    first = default_config()
    first.data.max_prompt_length = 7
    assert default_config().data.max_prompt_length == 512


def test_file_overrides_defaults_and_keeps_the_rest(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path,
        """
store:
  root: /data/store
data:
  max_prompt_length: 512
  filter_overlong_prompts: false
  tokenizer: /models/qwen
  apply_chat_template_kwargs:
    enable_thinking: false
round:
  retries: 5
  filters:
    - {path: pkg://my_filters, name: NoUrls}
""",
    )
    cfg = load_config(path)
    assert cfg.store.root == "/data/store"
    assert cfg.data.max_prompt_length == 512
    assert cfg.data.filter_overlong_prompts is False
    assert cfg.data.tokenizer == "/models/qwen"
    assert cfg.data.apply_chat_template_kwargs == {"enable_thinking": False}
    assert cfg.round.retries == 5
    assert OmegaConf.to_container(cfg.round.filters) == [
        {"path": "pkg://my_filters", "name": "NoUrls"}
    ]
    # untouched keys keep their defaults
    assert cfg.data.prompt_key == "prompt"
    assert cfg.round.timeout_seconds == 600.0


def test_str_path_is_accepted(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "data:\n  max_prompt_length: 256\n")
    assert load_config(str(path)).data.max_prompt_length == 256


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    assert load_config(write_yaml(tmp_path, "")) == default_config()


def test_overrides_apply_after_file(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "data:\n  max_prompt_length: 512\n  prompt_key: question\n")
    cfg = load_config(path, ["data.max_prompt_length=256", "round.timeout_seconds=30"])
    assert cfg.data.max_prompt_length == 256
    assert cfg.data.prompt_key == "question"
    assert cfg.round.timeout_seconds == 30.0


def test_overrides_apply_in_order() -> None:
    cfg = load_config(overrides=["round.retries=1", "round.retries=4"])
    assert cfg.round.retries == 4


def test_override_values_are_parsed_like_verl_dotlists() -> None:
    cfg = load_config(
        overrides=[
            "data.filter_overlong_prompts=false",
            "data.tokenizer=/models/qwen",
            "data.apply_chat_template_kwargs={enable_thinking: false}",
            "round.filters=[{path: pkg://f, name: A}]",
            "store.root='quoted root'",
        ]
    )
    assert cfg.data.filter_overlong_prompts is False
    assert cfg.data.tokenizer == "/models/qwen"
    assert cfg.data.apply_chat_template_kwargs == {"enable_thinking": False}
    assert OmegaConf.to_container(cfg.round.filters) == [{"path": "pkg://f", "name": "A"}]
    assert cfg.store.root == "quoted root"


def test_override_to_null_and_empty_dict_replace() -> None:
    cfg = load_config(
        overrides=[
            "data.tokenizer=/x",
            "data.tokenizer=null",
            "data.apply_chat_template_kwargs={a: 1}",
            "data.apply_chat_template_kwargs={}",
        ]
    )
    assert cfg.data.tokenizer is None
    assert cfg.data.apply_chat_template_kwargs == {}


# --- the open datagen subtree --------------------------------------------------------------


def test_extra_datagen_keys_from_file_reach_the_datagen_subtree(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path,
        """
data:
  datagen:
    path: /gens/proposer.py
    name: Proposer
    model: qwen-7b
    sampling: {temperature: 0.7, n: 4}
""",
    )
    datagen = load_config(path).data.datagen
    assert OmegaConf.to_container(datagen) == {
        "path": "/gens/proposer.py",
        "name": "Proposer",
        "model": "qwen-7b",
        "sampling": {"temperature": 0.7, "n": 4},
    }


@pytest.mark.parametrize("prefix", ["", "+", "++"])
def test_extra_datagen_keys_from_overrides(prefix: str) -> None:
    cfg = load_config(
        overrides=[
            "data.datagen.name=Foo",
            f"{prefix}data.datagen.seed=3",
            f"{prefix}data.datagen.sampling.temperature=0.5",
        ]
    )
    assert OmegaConf.to_container(cfg.data.datagen) == {
        "path": "pkg://dyngen.generators.base",
        "name": "Foo",
        "seed": 3,
        "sampling": {"temperature": 0.5},
    }


def test_datagen_mapping_override_merges_into_the_section() -> None:
    cfg = load_config(overrides=["data.datagen={name: Foo, seed: 1}"])
    assert OmegaConf.to_container(cfg.data.datagen) == {
        "path": "pkg://dyngen.generators.base",
        "name": "Foo",
        "seed": 1,
    }


def test_datagen_path_and_name_stay_typed() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["data.datagen.path=null"])
    assert "data.datagen.path: expected a string, found null" in str(info.value)


def test_filters_keep_extra_keys_for_the_filter(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path,
        "round:\n  filters:\n    - {path: pkg://f, name: MinChars, min_chars: 20}\n",
    )
    assert load_config(path).round.filters[0].min_chars == 20


# --- validate ------------------------------------------------------------------------------


def test_validate_accepts_a_plain_dict_and_fills_defaults() -> None:
    cfg = validate({"data": {"max_prompt_length": 64, "datagen": {"seed": 1}}})
    assert cfg.data.max_prompt_length == 64
    assert cfg.data.datagen.seed == 1
    assert cfg.round.retries == 2


def test_validate_is_idempotent_on_a_loaded_config() -> None:
    cfg = load_config(overrides=["+data.datagen.seed=3"])
    assert validate(cfg) == cfg


def test_validate_catches_a_value_changed_after_loading() -> None:
    cfg = load_config()
    cfg.round.timeout_seconds = -1.0
    with pytest.raises(ConfigError, match="round.timeout_seconds: expected a number > 0"):
        validate(cfg)


def test_validate_rejects_unknown_keys_in_a_dict() -> None:
    with pytest.raises(ConfigError, match="Did you mean round.retries"):
        validate({"round": {"retires": 1}})


def test_validate_rejects_a_non_mapping() -> None:
    with pytest.raises(ConfigError, match="expected a mapping .* found a list"):
        validate([1, 2])  # type: ignore[arg-type]


# --- tokenizer_path ------------------------------------------------------------------------


def test_tokenizer_path_required_only_when_filtering() -> None:
    with pytest.raises(ConfigError) as info:
        tokenizer_path(load_config(overrides=["data.filter_overlong_prompts=true"]))
    assert "data.tokenizer" in str(info.value)
    assert "found null" in str(info.value)
    assert tokenizer_path(load_config()) is None
    filtering = ["data.filter_overlong_prompts=true", "data.tokenizer=/models/q"]
    assert tokenizer_path(load_config(overrides=filtering)) == "/models/q"


# --- config_hash ---------------------------------------------------------------------------


def test_config_hash_is_stable_across_key_order(tmp_path: Path) -> None:
    one = write_yaml(tmp_path, "data:\n  datagen:\n    seed: 1\n    model: m\n", "one.yaml")
    two = write_yaml(tmp_path, "data:\n  datagen:\n    model: m\n    seed: 1\n", "two.yaml")
    hash_one = config_hash(load_config(one).data.datagen)
    assert hash_one == config_hash(load_config(two).data.datagen)
    assert config_hash(OmegaConf.create({"a": 1, "b": {"c": 2, "d": 3}})) == config_hash(
        OmegaConf.create({"b": {"d": 3, "c": 2}, "a": 1})
    )


def test_config_hash_is_a_sha256_hex_and_repeatable() -> None:
    digest = config_hash(default_config().data.datagen)
    assert len(digest) == 64
    int(digest, 16)
    assert digest == config_hash(default_config().data.datagen)


def test_config_hash_changes_when_a_value_changes() -> None:
    base = config_hash(load_config().data.datagen)
    assert config_hash(load_config(overrides=["data.datagen.name=Other"]).data.datagen) != base
    assert config_hash(load_config(overrides=["+data.datagen.seed=1"]).data.datagen) != base
    seeded = load_config(overrides=["+data.datagen.seed=1"]).data.datagen
    assert config_hash(seeded) != config_hash(
        load_config(overrides=["+data.datagen.seed=2"]).data.datagen
    )


def test_config_hash_resolves_interpolations() -> None:
    literal = OmegaConf.create({"a": 5, "b": 5})
    interpolated = OmegaConf.create({"a": 5, "b": "${a}"})
    assert config_hash(literal) == config_hash(interpolated)


def test_store_root_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYNGEN_STORE_ROOT", "/data/stores")
    assert load_config().store.root == "/data/stores"
    assert load_config(overrides=["store.root=/elsewhere"]).store.root == "/elsewhere"
