"""The in-process backend: a transformers model in the round's own process, batched on CPU.

Requests that sample alike (n, max_tokens, temperature, top_p, stop) are batched
`batch_size` chats per generate call. The messages all of them start with (a few-shot
prefix, typically ~80% of a prompt) run through the model once; each chat's own part once,
not once per sample. Sampling is reproducible: a batch whose requests all carry a `seed`
draws from its own RNG stream (the caller's torch RNG is untouched), so the same requests
sample the same tokens. Sampling has no top-k cut unless the model's generation config
sets one, as an OpenAI-compatible server samples. Needs `pip install 'dyngen[llm]'`.
"""

from __future__ import annotations

import copy
import inspect
import os
import time
from collections.abc import Sequence
from typing import Any

from dyngen.llm.base import ChatModel, ChatRequest, ChatResult, Message, ModelUsage, seed_int
from dyngen.llm.weights import load_weights


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class InProcessChatModel(ChatModel):
    """A transformers chat model, loaded once per process (weights.py finds it)."""

    backend = "in_process"

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        loaded = load_weights(cfg)
        self.model, self.tokenizer, self.name = loaded.model, loaded.tokenizer, loaded.name
        # The training step of the checkpoint loaded (a trainer's output_dir), if it says.
        self.policy_step: int | None = loaded.policy_step
        self.usage = ModelUsage(backend=self.backend, model=self.name)

    def complete(self, requests: Sequence[ChatRequest]) -> list[ChatResult]:
        """One result per request, in order; batched by how they sample."""
        results: list[ChatResult | None] = [None] * len(requests)
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, req in enumerate(requests):
            key = (req.n, req.max_tokens, req.temperature, req.top_p, tuple(req.stop))
            groups.setdefault(key, []).append(i)
        t0 = time.perf_counter()
        for indices in groups.values():
            for i, result in zip(indices, self._sample([requests[i] for i in indices]),
                                 strict=True):
                results[i] = result
        self.usage.wait_seconds += time.perf_counter() - t0
        answered = [r for r in results if r is not None]
        self.usage.count(answered)
        return answered

    def _sample(self, requests: list[ChatRequest]) -> list[ChatResult]:
        """Results for requests that all sample alike."""
        import torch

        first = requests[0]
        tokenizer, model = self.tokenizer, self.model
        shots = _common_prefix([list(r.messages) for r in requests])
        threads = torch.get_num_threads()
        # Two OpenMP threads on two busy cores wait on each other at every op: one thread per
        # two cores ran 3x faster than torch's default under load (benchmarks/proposer.py).
        torch.set_num_threads(int(self.cfg.get("num_threads") or max(1, _cpus() // 2)))
        try:
            params = inspect.signature(type(model).forward).parameters
            cache_kw = "cache" if "cache" in params else "past_key_values"  # renamed in v5
            # Only the cache is wanted from prefix calls, not logits over the vocabulary.
            last = {k: 1 for k in ("logits_to_keep", "num_logits_to_keep") if k in params}
            prefix = _encode(tokenizer, shots, [list(r.messages) for r in requests[:1]])[0]
            with torch.inference_mode():
                shared = (model(input_ids=torch.tensor([prefix]), use_cache=True,
                                **last)[cache_kw] if prefix else None)
            out: list[ChatResult] = []
            size = max(1, int(self.cfg.get("batch_size") or 8))
            limit = _context_limit(model)
            for b in range(0, len(requests), size):
                batch = requests[b:b + size]
                prefix, suffixes = _encode(tokenizer, shots, [list(r.messages) for r in batch])
                fits = [len(prefix) + len(s) + first.max_tokens <= limit for s in suffixes]
                runnable = [r for r, ok in zip(batch, fits, strict=True) if ok]
                texts = iter(self._generate(runnable, prefix, [
                    s for s, ok in zip(suffixes, fits, strict=True) if ok], shared, cache_kw,
                    last, b) if runnable else [])
                for s, ok in zip(suffixes, fits, strict=True):
                    n_prompt = len(prefix) + len(s)
                    if not ok:
                        out.append(ChatResult(error=(
                            f"context_length: {n_prompt} prompt tokens + max_tokens "
                            f"{first.max_tokens} exceed the model's {limit}"),
                            prompt_tokens=n_prompt))
                        continue
                    samples, n_tokens = next(texts)
                    out.append(ChatResult(tuple(samples), None, n_prompt, n_tokens))
            return out
        finally:
            torch.set_num_threads(threads)

    def _generate(self, batch: list[ChatRequest], prefix: list[int], suffixes: list[list[int]],
                  shared: Any, cache_kw: str, last: dict[str, int], batch_no: int
                  ) -> list[tuple[list[str], int]]:
        """(n texts, completion tokens) per request of one batch."""
        import torch

        tokenizer, model, req = self.tokenizer, self.model, batch[0]
        n, pad = req.n, tokenizer.pad_token_id
        width = max(map(len, suffixes))
        # [prefix | left padding | suffix]: positions come from the attention mask, so each
        # suffix continues the prefix exactly as if it were unpadded.
        ids = torch.tensor([prefix + [pad] * (width - len(x)) + x for x in suffixes])
        mask = torch.tensor([[1] * len(prefix) + [0] * (width - len(x)) + [1] * len(x)
                             for x in suffixes])
        with torch.inference_mode():
            # Each chat's prompt but its last token runs once, not once per sample;
            # generate() then starts from copies of that cache.
            cache = copy.deepcopy(shared) if prefix and shared is not None else None
            start = len(prefix) if cache is not None else 0
            if cache is not None:
                cache.batch_repeat_interleave(len(batch))
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            cache = model(input_ids=ids[:, start:-1], attention_mask=mask[:, :-1],
                          position_ids=pos[:, start:-1], use_cache=True, **{cache_kw: cache},
                          **last)[cache_kw]
            cache.batch_repeat_interleave(n)
        seeds = [r.seed for r in batch]
        with torch.random.fork_rng(devices=[]), torch.inference_mode():
            if all(s is not None for s in seeds):
                torch.manual_seed(seed_int(*seeds, batch_no))
            stopping = [_StopStrings(tokenizer, ids.shape[1], req.stop)] if req.stop else []
            gen = model.generate(
                input_ids=ids, attention_mask=mask, num_return_sequences=n,
                max_new_tokens=req.max_tokens, do_sample=req.temperature > 0,
                temperature=req.temperature or None, pad_token_id=pad,
                top_p=req.top_p if req.temperature > 0 else None,
                **_top_k(model, req.temperature),
                stopping_criteria=stopping, **{cache_kw: cache},
            )[:, ids.shape[1]:]
        decoded = [_cut(t, req.stop)
                   for t in tokenizer.batch_decode(gen, skip_special_tokens=True)]
        counts = (gen != pad).sum(dim=1).tolist()
        return [(decoded[i * n:(i + 1) * n], int(sum(counts[i * n:(i + 1) * n])))
                for i in range(len(batch))]


def _top_k(model: Any, temperature: float) -> dict[str, int]:
    """No top-k cut unless the model's own generation config sets one: an OpenAI-compatible
    request has no top_k, and TRL samples without one, but transformers cuts to the 50 most
    likely tokens when nothing says otherwise: a pass rate measured so is not the one the
    trainer's own sampling sees."""
    config = getattr(model, "generation_config", None)
    if temperature <= 0 or getattr(config, "top_k", None) is not None:
        return {}
    return {"top_k": 0}


class _StopStrings:
    """Stops a sequence once its text holds one of `stops` (OpenAI's `stop`)."""

    def __init__(self, tokenizer: Any, start: int, stops: Sequence[str]) -> None:
        self.tokenizer, self.start, self.stops = tokenizer, start, tuple(stops)

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        texts = self.tokenizer.batch_decode(input_ids[:, self.start:], skip_special_tokens=True)
        return torch.tensor([any(s in t for s in self.stops) for t in texts],
                            device=input_ids.device)


def _cut(text: str, stops: Sequence[str]) -> str:
    """`text` up to the first of `stops`, as a server returns it."""
    ends = [text.find(s) for s in stops if s in text]
    return text[:min(ends)] if ends else text


def _common_prefix(chats: list[list[Message]]) -> list[Message]:
    """The messages every chat starts with, leaving each chat at least its last message."""
    shortest = min(len(c) for c in chats) - 1
    n = 0
    while n < shortest and all(c[n] == chats[0][n] for c in chats):
        n += 1
    return chats[0][:n]


def _encode(tokenizer: Any, shots: list[Message], chats: list[list[Message]]
            ) -> tuple[list[int], list[list[int]]]:
    """(shared prefix ids, per-chat suffix ids); the prefix is empty if the template splits it."""
    full = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False)
            for c in chats]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in full]
    prefix = (tokenizer(tokenizer.apply_chat_template(shots, tokenize=False),
                        add_special_tokens=False)["input_ids"] if shots else [])
    if not all(len(i) > len(prefix) and i[:len(prefix)] == prefix for i in ids):
        prefix = []
    return prefix, [i[len(prefix):] for i in ids]


def _context_limit(model: Any) -> int:
    """The most positions the model takes (prompt and completion together)."""
    return int(getattr(model.config, "max_position_embeddings", None) or 1 << 30)
