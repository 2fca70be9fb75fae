"""The model interface: requests, results, usage, the ChatModel base and its config keys."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

Message = Mapping[str, str]

# The keys (under data.datagen) that choose and tune a model; a generator that asks a model
# merges them into its `defaults`. `solver_*` name a second model (the proposer's verifier);
# unset, the solver is the proposer's model.
MODEL_DEFAULTS: dict[str, Any] = {
    # served
    "endpoint": None, "model_name": None, "api_key_env": None, "max_concurrency": 16,
    "request_timeout_seconds": None, "max_retries": 3,
    # in-process
    "model_path": None, "gguf_file": None, "cache_dir": None, "batch_size": 8,
    "num_threads": None,
}
SOLVER_DEFAULTS: dict[str, Any] = {
    "solver_endpoint": None, "solver_model_name": None, "solver_api_key_env": None,
    "solver_model_path": None, "solver_gguf_file": None,
}
_SOLVER_KEYS = {"endpoint": "solver_endpoint", "model_name": "solver_model_name",
                "api_key_env": "solver_api_key_env", "model_path": "solver_model_path",
                "gguf_file": "solver_gguf_file"}


@dataclass(frozen=True)
class ChatRequest:
    """One chat to complete, and how to sample its `n` completions."""

    messages: Sequence[Message]
    n: int = 1
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    # Generation stops before the first of these strings (OpenAI's `stop`; not included).
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChatResult:
    """A request's completions (`n` of them), or why it has none."""

    texts: tuple[str, ...] = ()
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str = ""  # the model the server says answered (a served reply's `model`), if any

    @property
    def ok(self) -> bool:
        """Whether the request was answered."""
        return self.error is None


@dataclass
class ModelUsage:
    """What a model was asked and what it cost, for lineage (no credentials, no paths)."""

    backend: str
    model: str
    endpoint: str | None = None  # scheme://host:port of a served model
    requests: int = 0  # chat requests asked (each of n samples)
    retries: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wait_seconds: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)  # failures by kind
    # HTTP requests a served model sent, retries and one-sample splits of n included.
    http_requests: int = 0

    def count(self, results: Sequence[ChatResult]) -> None:
        """Add `results` (one per request answered or failed) to the counts."""
        self.requests += len(results)
        for r in results:
            self.prompt_tokens += r.prompt_tokens
            self.completion_tokens += r.completion_tokens
            if not r.ok:
                self.failures += 1
                kind = (r.error or "").split(":", 1)[0]
                self.errors[kind] = self.errors.get(kind, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        """A JSON-safe copy."""
        out = asdict(self)
        out["wait_seconds"] = round(self.wait_seconds, 3)
        return out


class ChatModel(ABC):
    """A chat model that completes many requests at once."""

    backend: ClassVar[str]
    name: str
    usage: ModelUsage
    # The training step of the weights that answer, where the backend knows it (an
    # in-process policy loaded from a trainer's checkpoint); None otherwise.
    policy_step: int | None = None

    @abstractmethod
    def complete(self, requests: Sequence[ChatRequest]) -> list[ChatResult]:
        """One result per request, in order; a failed request has `error` set, no texts."""

    def check(self) -> None:
        """Raise a DyngenError now if the model cannot answer at all (before any work)."""
        return None

    def close(self) -> None:
        """Release what the model holds (connections); it may not be used afterwards."""
        return None

    def __enter__(self) -> ChatModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def seed_int(*parts: Any) -> int:
    """A 32-bit seed from `parts`, the same in every process (unlike hash())."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "little")


def model_settings(settings: Mapping[str, Any], role: str = "proposer") -> dict[str, Any]:
    """The model keys of `role` ("proposer" or "solver") from a generator's settings.

    The solver uses its `solver_*` keys when any is set, else the proposer's model.
    """
    base = {k: settings.get(k, v) for k, v in MODEL_DEFAULTS.items()}
    if settings.get("config_section"):  # where the keys live, for messages (data.datagen)
        base["config_section"] = settings["config_section"]
    if role == "proposer":
        return base
    if role != "solver":
        raise ValueError(f"role: expected 'proposer' or 'solver', found {role!r}")
    own = {k: settings.get(s) for k, s in _SOLVER_KEYS.items()}
    if not any(v is not None for v in own.values()):
        return base
    return {**base, **own}
