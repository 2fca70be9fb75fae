"""The served backend: any OpenAI-compatible chat endpoint (vLLM, SGLang, llama.cpp, a hosted API).

Config (data.datagen; dyngen.llm.MODEL_DEFAULTS): `endpoint` (a base URL ending in /v1),
`model_name` (else the first of GET /v1/models), `api_key_env` (the NAME of the environment
variable that holds the key: the key is read here, sent to the endpoint and nowhere else),
`max_concurrency` (requests in flight, 16), `request_timeout_seconds` (unset: sized to each
request's max_tokens), `max_retries` (3).

`complete()` is synchronous; its requests go out from an asyncio loop in the model's own
thread (a round may already run inside an event loop, under Prefect), through the `openai`
package's AsyncOpenAI client, at most `max_concurrency` at a time. A request is retried, with
jittered exponential backoff (or the server's Retry-After), on connection errors, timeouts,
429 and 5xx only; any other status (a 400: e.g. a prompt longer than the context) fails it
at once. `n` samples go in one request where the server answers n choices and counts all
their tokens, else as n one-sample requests (dyngen.llm.samples). A call whose requests
fail for more than half raises rather than returning: ModelUnavailableError when most
failed as a later attempt might not (unreachable, timeouts, 429, 5xx), else ModelError.
Needs `pip install 'dyngen[served]'`; imports no torch.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import threading
import time
import weakref
from collections import Counter
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

from dyngen.errors import ConfigError, MissingDependencyError, ModelError, ModelUnavailableError
from dyngen.llm import samples
from dyngen.llm.base import MODEL_DEFAULTS, ChatModel, ChatRequest, ChatResult, ModelUsage

INSTALL_HINT = "pip install 'dyngen[served]'"
# Unset request_timeout_seconds: a base for queueing and the prompt, plus a generous time per
# token (a busy CPU server makes ~4 tokens/s per request; a GPU server 20-100x that).
BASE_TIMEOUT_SECONDS = 60.0
SECONDS_PER_TOKEN = 0.5
CHECK_TIMEOUT_SECONDS = 15.0  # check(): one try, so that a dead endpoint fails the round fast
BACKOFF_SECONDS, BACKOFF_CAP_SECONDS, RETRY_AFTER_CAP_SECONDS = 0.5, 20.0, 60.0
# Failure kinds a retry may get past; the others (bad_request, refused, ...) it will not.
TRANSIENT = frozenset({"connection", "timeout", "rate_limited", "server_error"})
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

T = TypeVar("T")


def base_url(endpoint: Any, section: str = "data.datagen") -> str:
    """The endpoint as the client takes it (http(s), a host, no credentials), or a ConfigError."""
    text = str(endpoint).strip()
    parts = urlsplit(text)
    if parts.username or parts.password:  # never echo it: the URL holds a secret
        raise ConfigError(
            f"{section}.endpoint: expected a base URL without credentials; found one with a "
            "user or password in it (not shown). Put the key in an environment variable and "
            f"name it in {section}.api_key_env.")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{section}.endpoint: expected an http(s) base URL ending in /v1 "
                          f"(e.g. http://gpu-host:8000/v1); found {text!r}.")
    return text.rstrip("/")


def endpoint_address(url: str) -> str:
    """scheme://host:port of `url`: what lineage records (no path, query or credentials)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
    return f"{parts.scheme}://{host}:{port}"


def api_key(name: Any, section: str = "data.datagen") -> str | None:
    """The key held by the environment variable `name` (None without one), else a ConfigError."""
    if name is None or name == "":
        return None
    if not _ENV_NAME.match(str(name)):
        raise ConfigError(
            f"{section}.api_key_env: expected the NAME of an environment variable (letters, "
            "digits and _), found a value that is not one (not shown: it may be a key). Put "
            "the key in a variable (export MY_LLM_KEY=...) and set api_key_env: MY_LLM_KEY.")
    value = os.environ.get(str(name))
    if not value:
        raise ConfigError(
            f"{section}.api_key_env is {name}, but the environment variable {name} is not "
            "set (or empty) where this round runs. Set it in the environment of every process "
            "that runs rounds or partitions (a worker, `dyngen serve`, each Ray node).")
    return value


def sized_timeout(max_tokens: int) -> float:
    """Seconds one request may take when request_timeout_seconds is unset."""
    return BASE_TIMEOUT_SECONDS + SECONDS_PER_TOKEN * max(1, int(max_tokens))


class ServedChatModel(ChatModel):
    """A chat model behind an OpenAI-compatible endpoint, asked concurrently, with retries."""

    backend = "served"

    def __init__(self, cfg: dict[str, Any]) -> None:
        cfg = {**MODEL_DEFAULTS, **cfg}  # a partial dict (not through chat_model) works too
        self.cfg = cfg
        # Which config section named this model, for messages ("round.solve_rate").
        self.section = str(cfg.get("config_section") or "data.datagen")
        self.url = base_url(cfg.get("endpoint"), self.section)
        self.concurrency = _whole(cfg, "max_concurrency", 1)
        self.max_retries = _whole(cfg, "max_retries", 0)
        self.timeout = _seconds(cfg.get("request_timeout_seconds"), self.section)
        self.key_env = cfg.get("api_key_env") or None
        key = api_key(self.key_env, self.section)
        self._openai = _import_openai()
        self.name = str(cfg.get("model_name") or "")
        self.usage = ModelUsage(backend=self.backend, model=self.name,
                                endpoint=endpoint_address(self.url))
        self._ready = False
        # The model's own loop and thread: complete() may be called from inside a running
        # event loop (a Prefect task), where asyncio.run() would refuse.
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name=f"dyngen-llm {self.usage.endpoint}")
        self._thread.start()
        self._finalizer = weakref.finalize(self, _stop_loop, self._loop, self._thread)
        self._client, self._slots = self._run(self._connect(key))

    # ---- the synchronous interface ----------------------------------------------------
    @property
    def n_in_one_request(self) -> bool | None:
        """Whether n samples go in one request (None: not yet asked for n > 1)."""
        return samples.n_in_one_request(self._n_key())

    def check(self) -> None:
        """Reach the endpoint (GET /models) and learn the model's name, or raise a ModelError."""
        self._run(self._prepare())

    def complete(self, requests: Sequence[ChatRequest]) -> list[ChatResult]:
        """One result per request, in order, asked concurrently; raises if most failed."""
        if not requests:
            return []
        started = time.perf_counter()
        try:
            results = self._run(self._complete(list(requests)))
        finally:
            self.usage.wait_seconds += time.perf_counter() - started
        self.usage.count(results)
        self._fail_if_most_failed(results)
        return results

    def close(self) -> None:
        """Close the client's connections and stop the model's thread."""
        if not self._finalizer.alive:
            return
        try:
            self._run(self._client.close())
        finally:
            self._finalizer()

    # ---- on the model's loop --------------------------------------------------------------
    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if not self._finalizer.alive:
            coro.close()
            raise RuntimeError(f"the model at {self.url} was closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # e.g. the round's timeout interrupted the waiting thread
            raise

    async def _connect(self, key: str | None) -> tuple[Any, asyncio.Semaphore]:
        # Retries are ours (counted, jittered, only for what may pass), not the client's.
        client = self._openai.AsyncOpenAI(base_url=self.url, api_key=key or "no-key",
                                          max_retries=0)
        return client, asyncio.Semaphore(self.concurrency)

    async def _prepare(self) -> None:
        """Reach the endpoint once; without model_name, take the first model it lists."""
        if self._ready:
            return
        o = self._openai
        try:
            page = await self._client.models.list(timeout=CHECK_TIMEOUT_SECONDS)
            ids = [m.id for m in page.data]
        except o.NotFoundError:
            ids = []  # reachable; it only lists no models
        except o.APIConnectionError as exc:
            raise ModelUnavailableError(
                f"the model endpoint {self.url} is unreachable ({_why(exc)}). Start the server, "
                f"or fix {self.section}.endpoint (an OpenAI-compatible base URL ending in /v1, "
                "e.g. http://gpu-host:8000/v1).") from None
        except o.APIStatusError as exc:
            raise self._status_error(exc) from None
        if not self.name:
            if not ids:
                hint = ("" if self.url.endswith("/v1") else " Is the base URL right? An "
                        "OpenAI-compatible one usually ends in /v1.")
                raise ModelError(f"the model endpoint {self.url} lists no model (GET /models); "
                                 f"set {self.section}.model_name to the model to ask.{hint}")
            self.name = self.usage.model = str(ids[0])
        self._ready = True

    def _status_error(self, exc: Any) -> ModelError:
        code = exc.status_code
        if code in (401, 403):
            held = (f"the key in ${self.key_env}" if self.key_env else
                    f"no key (set {self.section}.api_key_env to the NAME of the environment "
                    "variable that holds one)")
            return ModelError(f"the model endpoint {self.url} refused {held} (HTTP {code}).")
        cls = ModelUnavailableError if code == 429 or code >= 500 else ModelError
        return cls(f"the model endpoint {self.url} answered GET /models with HTTP {code} "
                   f"({_why(exc)}).")

    async def _complete(self, requests: list[ChatRequest]) -> list[ChatResult]:
        await self._prepare()
        if samples.needs_probe(self._n_key(), requests):
            self.usage.http_requests += 1
            await samples.probe(self._n_key(), self._client, self._openai,
                                self.timeout or sized_timeout(1))
        return list(await asyncio.gather(
            *(samples.all_samples(r, self._n_key(), self._call) for r in requests)))

    def _n_key(self) -> tuple[str, str]:
        return self.url, self.name

    async def _call(self, req: ChatRequest, n: int, seed: int | None) -> samples.Answer:
        """One HTTP request, retried on what may pass; raises Failed when it is given up."""
        o = self._openai
        params: dict[str, Any] = {
            "model": self.name, "messages": [dict(m) for m in req.messages],
            "max_tokens": req.max_tokens, "temperature": req.temperature, "top_p": req.top_p,
            "timeout": self.timeout or sized_timeout(req.max_tokens)}
        if n > 1:
            params["n"] = n
        if seed is not None:
            params["seed"] = seed
        if req.stop:
            params["stop"] = list(req.stop)
        for attempt in range(self.max_retries + 1):
            retry_after: float | None = None
            async with self._slots:
                self.usage.http_requests += 1
                try:
                    reply = await self._client.chat.completions.create(**params)
                    usage = reply.usage
                    choices = sorted(reply.choices, key=lambda c: c.index)
                    return samples.Answer(tuple(c.message.content or "" for c in choices),
                                   usage.prompt_tokens if usage else 0,
                                   usage.completion_tokens if usage else 0,
                                   str(getattr(reply, "model", "") or ""))
                except o.APITimeoutError as exc:
                    kind, detail = "timeout", f"no answer within {params['timeout']:g} s ({exc})"
                except o.APIConnectionError as exc:
                    kind, detail = "connection", _why(exc)
                except o.APIStatusError as exc:
                    code = exc.status_code
                    detail = f"HTTP {code}: {_why(exc)}"
                    if code == 429:
                        kind, retry_after = "rate_limited", _retry_after(exc)
                    elif code >= 500:
                        kind, retry_after = "server_error", _retry_after(exc)
                    else:
                        raise samples.Failed(_status_kind(code), detail) from None
            if attempt == self.max_retries:
                raise samples.Failed(kind, f"{detail} (after {self.max_retries} retries)")
            self.usage.retries += 1
            await asyncio.sleep(_backoff(attempt, retry_after))
        raise AssertionError("unreachable")

    def _fail_if_most_failed(self, results: list[ChatResult]) -> None:
        failed = [r for r in results if not r.ok]
        if len(failed) * 2 <= len(results):
            return
        kinds = Counter((r.error or "").split(":", 1)[0] for r in failed)
        transient = sum(n for k, n in kinds.items() if k in TRANSIENT)
        cls = ModelUnavailableError if transient * 2 > len(failed) else ModelError
        raise cls(f"{len(failed)} of {len(results)} requests to the model at {self.url} failed "
                  f"({', '.join(f'{k}: {n}' for k, n in kinds.most_common())}), more than half: "
                  f"the round stops and commits nothing. First: {failed[0].error}")


def _whole(cfg: dict[str, Any], key: str, least: int) -> int:
    value = cfg.get(key)
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or value < least:
        section = cfg.get("config_section") or "data.datagen"
        raise ConfigError(f"{section}.{key}: expected a whole number >= {least}; "
                          f"found {value!r}.")
    return int(value)


def _seconds(value: Any, section: str = "data.datagen") -> float | None:
    """request_timeout_seconds: a number > 0, or None (sized to each request's max_tokens)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if isinstance(value, bool) or not seconds > 0:
        raise ConfigError(f"{section}.request_timeout_seconds: expected a number of seconds "
                          f"> 0 (or null: sized to max_tokens); found {value!r}.")
    return seconds


def _backoff(attempt: int, retry_after: float | None) -> float:
    """Full jitter (a random share of the doubling delay), or the server's Retry-After."""
    if retry_after is not None:
        return min(retry_after, RETRY_AFTER_CAP_SECONDS)
    return random.uniform(0, min(BACKOFF_CAP_SECONDS, BACKOFF_SECONDS * 2 ** (attempt + 1)))


def _retry_after(exc: Any) -> float | None:
    raw = getattr(getattr(exc, "response", None), "headers", {}).get("retry-after")
    try:
        return max(0.0, float(raw)) if raw is not None else None
    except ValueError:
        return None


def _status_kind(code: int) -> str:
    return {400: "bad_request", 401: "refused", 403: "refused", 404: "not_found",
            413: "bad_request", 422: "bad_request"}.get(code, f"http_{code}")


def _why(exc: BaseException) -> str:
    """A short, one-line reason from a client error (never its request headers)."""
    text = " ".join(str(getattr(exc, "message", None) or exc).split())
    cause = exc.__cause__
    if cause is not None and str(cause):
        text += f": {' '.join(str(cause).split())}"
    return text[:300]


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Stop a model's loop and thread (on close, or when the model is collected)."""
    if loop.is_running():
        loop.call_soon_threadsafe(loop.stop)
        if thread is not threading.current_thread():
            thread.join(timeout=5)
    if not loop.is_running() and not loop.is_closed():
        loop.close()


def _import_openai() -> Any:
    try:
        import openai
    except ImportError as exc:
        raise MissingDependencyError(
            f"a served model (data.datagen.endpoint) needs the openai package, which is not "
            f"installed ({exc}). Install the extra: {INSTALL_HINT}.") from exc
    return openai
