"""Tests for dyngen.config: defaults, YAML file, dotlist overrides, validation, hashing."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dyngen.config import (
    config_hash,
    default_config,
    load_config,
    tokenizer_path,
    validate,
)
from dyngen.errors import ConfigError


def write_yaml(tmp_path: Path, text: str, name: str = "dyngen.yaml") -> Path:
    """Write a YAML config file and return its path."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


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
            "datagen": {"path": "pkg://generators.base", "name": "MockDataGenerator"},
        },
        "round": {
            "retries": 2,
            "retry_delay_seconds": 2.0,
            "timeout_seconds": 600.0,
            "dedup": True,
            "filters": [],
            "partitions": 1,
            "task_runner": {"kind": "threads", "address": None, "init_kwargs": {},
                            "remote_options": {}},
            "rollouts_dirs": ["dyngen_store/rollouts"],
            "max_rollouts_bytes": 64 * 1024 * 1024,
            "compaction": {"enabled": True, "max_small_shards": 50, "fan_in": 8,
                           "target_shard_mb": 128.0},
        },
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
        "path": "pkg://generators.base",
        "name": "Foo",
        "seed": 3,
        "sampling": {"temperature": 0.5},
    }


def test_datagen_mapping_override_merges_into_the_section() -> None:
    cfg = load_config(overrides=["data.datagen={name: Foo, seed: 1}"])
    assert OmegaConf.to_container(cfg.data.datagen) == {
        "path": "pkg://generators.base",
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


# --- errors --------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(missing)
    message = str(info.value)
    assert str(missing) in message
    assert "expected an existing YAML file" in message
    assert "found nothing at that path" in message


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected an existing YAML file, found a directory"):
        load_config(tmp_path)


def test_yaml_syntax_error_shows_the_line(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "data:\n  prompt_key: prompt\n  max_prompt_length: 512: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert str(path) in message
    assert "expected valid YAML" in message
    assert "line 3" in message
    assert "max_prompt_length: 512: 3" in message  # the offending line itself
    assert info.value.__cause__ is not None


def test_unclosed_bracket_points_at_the_line_that_opened_it(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "round:\n  filters: [\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "line 2" in str(info.value)
    assert "filters: [" in str(info.value)


def test_duplicate_key_in_yaml(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "data:\n  max_prompt_length: 1\n  max_prompt_length: 2\n")
    with pytest.raises(ConfigError, match="line 3.*duplicate key max_prompt_length"):
        load_config(path)


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "- data\n- round\n")
    with pytest.raises(ConfigError, match="expected a mapping .* found a list"):
        load_config(path)


def test_unknown_section_key_in_file_suggests_close_match(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "data:\n  max_prompt_lenght: 512\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "unknown key data.max_prompt_lenght" in message
    assert "found 'max_prompt_lenght'" in message
    assert "Did you mean data.max_prompt_length?" in message
    assert str(path) in message


def test_unknown_top_level_key_suggests_close_match(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "rounds:\n  retries: 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "unknown key rounds" in message
    assert "expected one of store, data, round" in message
    assert "Did you mean round?" in message


def test_unknown_key_without_close_match() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["store.zzzz=1"])
    message = str(info.value)
    assert "unknown key store.zzzz" in message
    assert "Did you mean" not in message
    assert "Remove it or fix its spelling" in message


@pytest.mark.parametrize("prefix", ["", "+"])
def test_unknown_key_in_override_suggests_close_match(prefix: str) -> None:
    text = f"{prefix}data.max_prompt_lenght=512"
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[text])
    message = str(info.value)
    assert "unknown key data.max_prompt_lenght" in message
    assert "Did you mean data.max_prompt_length?" in message
    assert repr(text) in message  # names the override that caused it


def test_wrong_type_in_override() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["data.max_prompt_length=abc"])
    message = str(info.value)
    assert "data.max_prompt_length: expected an integer, found 'abc'" in message
    assert "data.max_prompt_length=512" in message  # what to do
    assert isinstance(info.value.__cause__, OmegaConfBaseException)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "data:\n  max_prompt_length: 1.5\n",
            "data.max_prompt_length: expected an integer, found 1.5",
        ),
        (
            "data:\n  filter_overlong_prompts: maybe\n",
            "data.filter_overlong_prompts: expected a boolean (true or false), found 'maybe'",
        ),
        (
            "data:\n  filter_overlong_prompts: 5\n",
            "data.filter_overlong_prompts: expected a boolean (true or false), found 5",
        ),
        (
            "round:\n  timeout_seconds: soon\n",
            "round.timeout_seconds: expected a number, found 'soon'",
        ),
        ("data:\n  tokenizer: [a, b]\n", "data.tokenizer: expected a string or null, found a list"),
        (
            "data:\n  max_prompt_length: {a: 1}\n",
            "data.max_prompt_length: expected an integer, found a mapping",
        ),
        ("data: 5\n", "data: expected a mapping with keys prompt_key"),
        ("data:\n  datagen: pkg://x\n", "data.datagen: expected a mapping with keys path, name"),
        (
            "data:\n  apply_chat_template_kwargs: [1]\n",
            "data.apply_chat_template_kwargs: expected a mapping",
        ),
        ("round:\n  filters: {path: a}\n", "round.filters: expected a list"),
        (
            "round:\n  filters: [pkg://f]\n",
            "round.filters[0]: expected a mapping with path and name",
        ),
        ("round:\n  rollouts_dirs: [{a: 1}]\n", "round.rollouts_dirs[0]: expected a string"),
    ],
)
def test_wrong_type_in_file(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write_yaml(tmp_path, text))
    assert expected in str(info.value)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "data.max_prompt_length=0",
            "data.max_prompt_length: expected a positive integer (tokens), found 0",
        ),
        (
            "data.max_prompt_length=-5",
            "data.max_prompt_length: expected a positive integer (tokens), found -5",
        ),
        ("round.retries=-1", "round.retries: expected an integer >= 0, found -1"),
        ("round.timeout_seconds=0", "round.timeout_seconds: expected a number > 0, found 0.0"),
        ("round.timeout_seconds=.nan", "round.timeout_seconds: expected a number > 0, found nan"),
        (
            "round.retry_delay_seconds=-1",
            "round.retry_delay_seconds: expected a number >= 0, found -1.0",
        ),
        ("data.prompt_key=''", "data.prompt_key: expected a non-empty column name, found ''"),
        ("store.root=' '", "store.root: expected a non-empty directory path or URL, found ' '"),
        ("data.datagen.name=''", "data.datagen.name: expected a generator class name, found ''"),
        (
            "round.filters=[{path: pkg://f}]",
            "round.filters[0].name: expected a non-empty string, found null",
        ),
        (
            "round.max_rollouts_bytes=0",
            "round.max_rollouts_bytes: expected a positive integer (bytes), found 0",
        ),
        ("round.rollouts_dirs=['']", "round.rollouts_dirs[0]: expected a folder path, found ''"),
    ],
)
def test_out_of_range(override: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[override])
    message = str(info.value)
    assert expected in message
    assert "e.g." in message or "Give each filter" in message  # says what to do


def test_retries_zero_is_allowed() -> None:
    assert load_config(overrides=["round.retries=0"]).round.retries == 0


@pytest.mark.parametrize("bad", ["data.max_prompt_length", "data.max_prompt_length 512"])
def test_override_without_equals(bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[bad])
    message = str(info.value)
    assert repr(bad) in message
    assert "expected key=value" in message
    assert "found no '='" in message


@pytest.mark.parametrize("bad", ["=3", "data..max_prompt_length=3", "+=3"])
def test_override_with_empty_key(bad: str) -> None:
    with pytest.raises(ConfigError, match="expected a dotted key"):
        load_config(overrides=[bad])


def test_override_deletion_is_refused() -> None:
    with pytest.raises(ConfigError, match="found a deletion"):
        load_config(overrides=["~data.datagen.seed"])


def test_override_value_that_does_not_parse() -> None:
    with pytest.raises(ConfigError, match="expected a YAML value after '='"):
        load_config(overrides=["round.filters=[{path: a"])


def test_overrides_given_as_a_single_string() -> None:
    with pytest.raises(ConfigError, match="expected a list of key=value strings"):
        load_config(overrides="data.max_prompt_length=512")


def test_broken_interpolation(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "data:\n  tokenizer: ${oc.env:DYNGEN_TEST_UNSET_VARIABLE}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "data.tokenizer: expected an interpolation that resolves" in str(info.value)
    assert "DYNGEN_TEST_UNSET_VARIABLE" in str(info.value)


def test_interpolation_resolving_to_wrong_type(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "data:\n  max_prompt_length: ${data.prompt_key}\n")
    with pytest.raises(
        ConfigError, match="data.max_prompt_length: expected an integer, found 'prompt'"
    ):
        load_config(path)


def test_interpolation_that_resolves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYNGEN_TEST_MAXLEN", "333")
    path = write_yaml(tmp_path, "data:\n  max_prompt_length: ${oc.env:DYNGEN_TEST_MAXLEN}\n")
    assert load_config(path).data.max_prompt_length == 333


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        load_config(overrides=["round.retries=-1"])


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
