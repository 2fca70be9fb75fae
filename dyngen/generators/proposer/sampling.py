"""Sampling: the few-shot prompt, and `proposals_per_seed` completions per seed.

The model (dyngen.llm: in-process or served) sees a few-shot chat ("Question: ...\nAnswer:
<calculation> = <result>") per seed; every seed's request carries its own seed, derived
from (config seed, round, pass, seed), so an in-process model samples the same tokens for
the same config. Config (data.datagen): max_new_tokens, temperature, top_p,
proposals_per_seed, and the model's keys (dyngen.llm.MODEL_DEFAULTS).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dyngen.llm import ChatModel, ChatRequest, ChatResult, Message, seed_int

if TYPE_CHECKING:
    from dyngen.generators.proposer.seeds import Seed

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


# A reply is one task; a second "Question:" is the model running on.
STOP = ("\nQuestion:", "\n\n")


def seed_requests(seeds: list[Seed], messages_for: Callable[[Seed], list[Message]],
                  cfg: dict[str, Any], stream: tuple[Any, ...],
                  stop: tuple[str, ...] = ()) -> list[ChatRequest]:
    """One request per seed, `messages_for(seed)`, for `proposals_per_seed` completions,
    each on its own RNG stream (e.g. seed, round, pass): the same stream samples the same
    tokens in-process."""
    return [ChatRequest(messages_for(s), n=int(cfg["proposals_per_seed"]),
                        max_tokens=int(cfg["max_new_tokens"]),
                        temperature=float(cfg["temperature"]), top_p=float(cfg["top_p"]),
                        seed=seed_int(*stream, s.index), stop=stop) for s in seeds]


def proposer_requests(seeds: list[Seed], cfg: dict[str, Any],
                      stream: tuple[Any, ...]) -> list[ChatRequest]:
    """The proposer's request for each seed (see seed_requests)."""
    return seed_requests(seeds, messages_for, cfg, stream, STOP)


def propose(model: ChatModel, seeds: list[Seed], cfg: dict[str, Any],
            stream: tuple[Any, ...]) -> list[ChatResult]:
    """The model's completions for each seed: one result per seed, in order."""
    return model.complete(proposer_requests(seeds, cfg, stream))
