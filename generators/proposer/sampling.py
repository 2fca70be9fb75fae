"""Sampling: the few-shot prompt, and `proposals_per_seed` completions per seed, batched.

The model sees a few-shot chat ("Question: ...\nAnswer: <calculation> = <result>") per
seed. Sampling is batched and reproducible: the shared few-shot prefix runs through the
model once, each chat's prompt once, and every (seed, round, pass, batch) has its own RNG
stream, so the same config samples the same tokens and the caller's torch RNG is untouched.
`complete` samples any chats that share a few-shot prefix (the solver in verifying.py uses
it too); `propose` is the proposer's call. Config (data.datagen): max_new_tokens,
temperature, top_p, batch_size (chats per generate call), proposals_per_seed, num_threads
(one per two cores).
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import os
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from generators.proposer.seeds import Seed

# The answer line is done at its end, or once its first result number is complete.
_ANSWER_DONE = re.compile(r"Answer:(?:[^\n]*\S[^\n]*\n|[^\n=]*=\s*-?\d[\d,]*(?:\.\d+)?"
                          r"(?:[^\d.,]|\.\D))", re.I)

SYSTEM = ("You write new math word problems. Reply in exactly this format:\n"
          "Question: <the new problem>\nAnswer: <calculation with the problem's numbers> = "
          "<result>")
ASK = "Write a harder problem like this one, with new and larger numbers:\n"
SHOTS = (
    ("Ann has 5 pens and buys 3 more. How many pens does she have?",
     "Ann has 14 pens and buys 29 more. How many pens does she have?", "14 + 29 = 43"),
    ("A bag has 6 apples. How many apples are in 4 bags?",
     "A crate has 12 eggs. How many eggs are in 17 crates?", "12 * 17 = 204"),
    ("Joe had 20 cards and lost 8. How many cards are left?",
     "Joe had 145 cards and lost 68. How many cards are left?", "145 - 68 = 77"),
    ("12 candies are shared by 3 kids. How many does each kid get?",
     "156 stamps are shared by 12 kids. How many does each kid get?", "156 / 12 = 13"),
)


def few_shot() -> list[dict[str, str]]:
    """The fixed start of every prompt: the format, then worked examples."""
    out = [{"role": "system", "content": SYSTEM}]
    for seed, question, answer in SHOTS:
        out += [{"role": "user", "content": ASK + seed},
                {"role": "assistant", "content": f"Question: {question}\nAnswer: {answer}"}]
    return out


def messages_for(seed: Seed) -> list[dict[str, str]]:
    """The few-shot chat asking for one harder variation of `seed`."""
    return [*few_shot(), {"role": "user", "content": ASK + seed.question}]


Chat = list[dict[str, str]]


@dataclass(frozen=True)
class Sampling:
    """How to sample: completions per chat, their length, temperature, batching, threads."""

    n: int
    max_new_tokens: int
    temperature: float
    top_p: float
    batch_size: int
    num_threads: int | None = None


def proposer_sampling(cfg: dict[str, Any]) -> Sampling:
    """The proposer's sampling settings from its config."""
    return Sampling(int(cfg["proposals_per_seed"]), int(cfg["max_new_tokens"]),
                    float(cfg["temperature"]), float(cfg["top_p"]),
                    max(1, int(cfg["batch_size"])), cfg.get("num_threads"))


def encode(tokenizer: Any, shots: Chat, chats: list[Chat]) -> tuple[list[int], list[list[int]]]:
    """(shared prefix ids, per-chat suffix ids); the prefix is empty if the template splits it."""
    full = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False)
            for c in chats]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in full]
    prefix = tokenizer(tokenizer.apply_chat_template(shots, tokenize=False),
                       add_special_tokens=False)["input_ids"]
    if not all(len(i) > len(prefix) and i[:len(prefix)] == prefix for i in ids):
        prefix = []
    return prefix, [i[len(prefix):] for i in ids]


class AnswerLineDone:
    """Stops a sequence once its Answer line is complete (saves most of max_new_tokens)."""

    def __init__(self, tokenizer: Any, start: int) -> None:
        self.tokenizer, self.start = tokenizer, start

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        texts = self.tokenizer.batch_decode(input_ids[:, self.start:], skip_special_tokens=True)
        return torch.tensor([bool(_ANSWER_DONE.search(t)) for t in texts],
                            device=input_ids.device)


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def seed_int(*parts: Any) -> int:
    """A 32-bit seed from `parts`, the same in every process (unlike hash())."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "little")


def propose(model: Any, tokenizer: Any, seeds: list[Seed], cfg: dict[str, Any],
            stream: tuple[Any, ...]) -> tuple[list[list[str]], int, float]:
    """(`proposals_per_seed` completions per seed, tokens generated, seconds), batched."""
    return complete(model, tokenizer, few_shot(), [messages_for(s) for s in seeds],
                    proposer_sampling(cfg), stream)


def complete(model: Any, tokenizer: Any, shots: Chat, chats: list[Chat], sampling: Sampling,
             stream: tuple[Any, ...]) -> tuple[list[list[str]], int, float]:
    """(`sampling.n` completions per chat, tokens generated, seconds), batched.

    Every chat starts with `shots` (computed once). `stream` names the RNG stream (e.g. seed,
    round, pass): the same stream samples the same tokens.
    """
    import torch

    n, size, temperature = sampling.n, sampling.batch_size, sampling.temperature
    pad = tokenizer.pad_token_id
    out: list[list[str]] = []
    tokens, t0 = 0, time.perf_counter()
    threads = torch.get_num_threads()
    # Two OpenMP threads on two busy cores wait on each other at every op: one thread per
    # two cores ran 3x faster than torch's default under load (see benchmarks/proposer.py).
    torch.set_num_threads(int(sampling.num_threads or max(1, _cpus() // 2)))
    try:
        prefix, _ = encode(tokenizer, shots, chats[:1])
        params = inspect.signature(type(model).forward).parameters
        cache_kw = "cache" if "cache" in params else "past_key_values"  # renamed in v5
        # Only the cache is wanted from these calls, not logits over the whole vocabulary.
        last_logits = {k: 1 for k in ("logits_to_keep", "num_logits_to_keep") if k in params}
        with torch.inference_mode():
            # The instructions and examples (~80% of a prompt) go through the model once.
            shared = (model(input_ids=torch.tensor([prefix]), use_cache=True,
                            **last_logits)[cache_kw] if prefix else None)
        for b in range(0, len(chats), size):
            batch = chats[b:b + size]
            prefix, suffixes = encode(tokenizer, shots, batch)
            width = max(map(len, suffixes))
            # [prefix | left padding | suffix]: positions come from the attention mask, so
            # each suffix continues the prefix exactly as if it were unpadded.
            ids = torch.tensor([prefix + [pad] * (width - len(x)) + x for x in suffixes])
            mask = torch.tensor([[1] * len(prefix) + [0] * (width - len(x)) + [1] * len(x)
                                 for x in suffixes])
            with torch.inference_mode():
                # Each seed's prompt but its last token runs once, not once per sample;
                # generate() then starts from copies of that cache.
                cache = copy.deepcopy(shared) if prefix and shared is not None else None
                start = len(prefix) if cache is not None else 0
                if cache is not None:
                    cache.batch_repeat_interleave(len(batch))
                pos = (mask.cumsum(-1) - 1).clamp(min=0)
                cache = model(input_ids=ids[:, start:-1], attention_mask=mask[:, :-1],
                              position_ids=pos[:, start:-1], use_cache=True,
                              **{cache_kw: cache}, **last_logits)[cache_kw]
                cache.batch_repeat_interleave(n)
            # A private RNG stream: the same seed, round, pass and batch sample the same
            # tokens, and the caller's global torch RNG is left as it was.
            with torch.random.fork_rng(devices=[]), torch.inference_mode():
                torch.manual_seed(seed_int(*stream, b))
                gen = model.generate(
                    input_ids=ids, attention_mask=mask, num_return_sequences=n,
                    max_new_tokens=sampling.max_new_tokens, do_sample=temperature > 0,
                    temperature=temperature or None, pad_token_id=pad,
                    top_p=sampling.top_p if temperature > 0 else None,
                    stopping_criteria=[AnswerLineDone(tokenizer, ids.shape[1])],
                    **{cache_kw: cache},
                )[:, ids.shape[1]:]
            tokens += int((gen != pad).sum())
            decoded = tokenizer.batch_decode(gen, skip_special_tokens=True)
            out += [decoded[i * n:(i + 1) * n] for i in range(len(batch))]
    finally:
        torch.set_num_threads(threads)
    return out, tokens, time.perf_counter() - t0
