"""What the served-model tests share: the session's key, by the name of its variable."""

from __future__ import annotations

import secrets
from typing import Any

from tests.llm.llama_server import LlamaServer

KEY_ENV = "DYNGEN_TEST_LLM_KEY"
KEY = f"sk-dyngen-test-{secrets.token_hex(12)}"  # fresh per session: found only if leaked


def served(llama: LlamaServer, **cfg: Any) -> dict[str, Any]:
    """Model settings (data.datagen keys) for the session's server."""
    return {"endpoint": llama.url, "api_key_env": KEY_ENV, **cfg}
