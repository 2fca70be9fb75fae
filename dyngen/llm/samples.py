"""The n samples of one request to a served model.

`n` samples go in one HTTP request where the server answers n choices and counts all
their tokens: asked once per endpoint and model with a one-token probe (`probe`), and
remembered for the process. Elsewhere they go as n one-sample requests, each with its own
seed (llama.cpp answers n choices but counts one choice's tokens), so usage counts every
choice. A server that answers fewer choices than asked is asked for the rest one by one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dyngen.llm.base import ChatRequest, ChatResult, seed_int

# (endpoint, model) -> whether one request answers n samples with all their tokens counted.
_N_IN_ONE_REQUEST: dict[tuple[str, str], bool] = {}


@dataclass(frozen=True)
class Answer:
    """What one HTTP request answered: its choices' texts and the tokens it counted."""

    texts: tuple[str, ...]
    prompt_tokens: int
    completion_tokens: int
    model: str = ""


class Failed(Exception):
    """A request that failed for good: its kind (a usage.errors key) and what the server said."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


# One HTTP request of `n` samples with `seed`; raises Failed when it is given up.
Call = Callable[[ChatRequest, int, "int | None"], Awaitable[Answer]]


def n_in_one_request(key: tuple[str, str]) -> bool | None:
    """Whether n samples go in one request to (endpoint, model) (None: not yet asked)."""
    return _N_IN_ONE_REQUEST.get(key)


def needs_probe(key: tuple[str, str], requests: Sequence[ChatRequest]) -> bool:
    """Whether these requests ask for n > 1 of a model not yet probed."""
    return key not in _N_IN_ONE_REQUEST and any(r.n > 1 for r in requests)


async def probe(key: tuple[str, str], client: Any, openai: Any, timeout: float) -> bool:
    """Ask whether one request answers 2 one-token samples and counts both samples' tokens,
    and remember the answer for `key`."""
    try:
        reply = await client.chat.completions.create(
            model=key[1], messages=[{"role": "user", "content": "Say yes."}], n=2,
            max_tokens=1, temperature=1.0, timeout=timeout)
    except openai.APIError:
        together = False  # a server that refuses n is asked one sample at a time
    else:
        counted = reply.usage.completion_tokens if reply.usage is not None else 0
        together = len(reply.choices) == 2 and counted >= 2
    _N_IN_ONE_REQUEST[key] = together
    return together


async def all_samples(req: ChatRequest, key: tuple[str, str], call: Call) -> ChatResult:
    """All `n` samples of one request, or its error (nothing partial)."""
    together = req.n == 1 or _N_IN_ONE_REQUEST.get(key, False)
    calls = ([call(req, req.n, req.seed)] if together else
             [call(req, 1, sample_seed(req.seed, j)) for j in range(req.n)])
    parts = await asyncio.gather(*calls, return_exceptions=True)
    for part in parts:
        if isinstance(part, Failed):
            return ChatResult(error=str(part))
        if isinstance(part, BaseException):
            raise part
    answers = [p for p in parts if isinstance(p, Answer)]
    texts = [t for a in answers for t in a.texts]
    prompt_tokens = sum(a.prompt_tokens for a in answers)
    completion_tokens = sum(a.completion_tokens for a in answers)
    if len(texts) >= req.n:
        return ChatResult(tuple(texts[:req.n]), None, prompt_tokens, completion_tokens,
                          _answered_by(answers))
    _N_IN_ONE_REQUEST[key] = False  # the server ignored n: ask for the rest one by one
    more = await all_samples(ChatRequest(req.messages, req.n - len(texts), req.max_tokens,
                                         req.temperature, req.top_p,
                                         sample_seed(req.seed, "rest"), req.stop), key, call)
    if not more.ok:
        return more
    return ChatResult(tuple(texts) + more.texts, None, prompt_tokens + more.prompt_tokens,
                      completion_tokens + more.completion_tokens,
                      _answered_by(answers) or more.model)


def sample_seed(seed: int | None, j: Any) -> int | None:
    """Each one-sample request its own seed: the same seed would sample the same text."""
    return None if seed is None else seed_int(seed, j)


def _answered_by(answers: Sequence[Answer]) -> str:
    """The model the server named in its replies (the first that named one)."""
    return next((a.model for a in answers if a.model), "")
