"""dyngen.config's errors: every mistake names the key, what was expected, what was found
and what to do."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf.errors import OmegaConfBaseException

from dyngen.config import (
    load_config,
)
from dyngen.errors import ConfigError
from tests.config.files import write_yaml

# --- errors --------------------------------------------------------------------------------


def file_error(tmp_path: Path, text: str) -> str:
    """The ConfigError message of loading a config file holding `text`."""
    with pytest.raises(ConfigError) as info:
        load_config(write_yaml(tmp_path, text))
    return str(info.value)


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
    message = file_error(tmp_path, "round:\n  filters: [\n")
    assert "line 2" in message
    assert "filters: [" in message


def test_duplicate_key_in_yaml(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "data:\n  max_prompt_length: 1\n  max_prompt_length: 2\n")
    with pytest.raises(ConfigError, match="line 3.*duplicate key max_prompt_length"):
        load_config(path)


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "- data\n- round\n")
    with pytest.raises(ConfigError, match="expected a mapping .* found a list"):
        load_config(path)


def test_unknown_section_key_in_file_suggests_close_match(tmp_path: Path) -> None:
    message = file_error(tmp_path, "data:\n  max_prompt_lenght: 512\n")
    assert "unknown key data.max_prompt_lenght" in message
    assert "found 'max_prompt_lenght'" in message
    assert "Did you mean data.max_prompt_length?" in message
    assert str(tmp_path / "dyngen.yaml") in message


def test_unknown_top_level_key_suggests_close_match(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "rounds:\n  retries: 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "unknown key rounds" in message
    assert "expected one of store, data, round" in message
    assert "Did you mean round?" in message


def test_a_removed_key_says_it_was_removed_and_why(tmp_path: Path) -> None:
    message = file_error(tmp_path, "round:\n  order_wait_seconds: 900\n")
    assert "round.order_wait_seconds was removed: rounds no longer wait" in message
    assert "Delete it." in message and str(tmp_path / "dyngen.yaml") in message


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
    message = file_error(tmp_path, "data:\n  tokenizer: ${oc.env:DYNGEN_TEST_UNSET_VARIABLE}\n")
    assert "data.tokenizer: expected an interpolation that resolves" in message
    assert "DYNGEN_TEST_UNSET_VARIABLE" in message


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
