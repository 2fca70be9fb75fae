"""What the served-model tests share: the session's key, by the name of its variable, and
a handler that keeps every log line (where a leaked key would show)."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.llm.llama_server import LlamaServer

KEY_ENV = "DYNGEN_TEST_LLM_KEY"
KEY = f"sk-dyngen-test-{secrets.token_hex(12)}"  # fresh per session: found only if leaked


def served(llama: LlamaServer, **cfg: Any) -> dict[str, Any]:
    """Model settings (data.datagen keys) for the session's server."""
    return {"endpoint": llama.url, "api_key_env": KEY_ENV, **cfg}


class Records(logging.Handler):
    """Every log record of the process, DEBUG up, as text."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name}: {record.getMessage()}")


@contextmanager
def key_set_and_every_log_kept() -> Iterator[Records]:
    """The session's key in its variable, and every log line kept meanwhile, from DEBUG up:
    the openai and httpx clients' logs, and Prefect's (which does not propagate to the root
    logger)."""
    records = Records()
    loggers = [logging.getLogger(), logging.getLogger("prefect")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(records)
        lg.setLevel(logging.DEBUG)
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv(KEY_ENV, KEY)
            yield records
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.removeHandler(records)
            lg.setLevel(level)
