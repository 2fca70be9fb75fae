"""One llama.cpp server (xllamacpp, SmolLM2 on CPU) for every served-model test of the session.

It requires a key (tests/llm/support.py), which the tests give dyngen only as the name of an
environment variable, as a user would.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.llm.llama_server import LlamaServer
from tests.llm.support import KEY, KEY_ENV


@pytest.fixture(scope="session")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """4 slots of 1024 tokens each, one thread; stopped by PID at the end of the session."""
    server = LlamaServer(tmp_path_factory.mktemp("llama"), parallel=4, ctx=4096, key=KEY)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def key_env(monkeypatch: pytest.MonkeyPatch) -> str:
    """The environment variable that holds the server's key, set for each test."""
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY_ENV
