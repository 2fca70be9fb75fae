"""Asking the model for programs: a few-shot chat per seed, and reading a completion back.

The model sees worked examples ("in the style of this function, write a new one and an
input") and then the seed: its program and input when the seed is a code task, else its
question ("write a function that solves a problem like this one"). A completion is a
candidate when it holds a fenced ```python block defining a function of one argument and a
line `Input: <a Python literal>`; otherwise it is dropped as `unparsed`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dyngen.generators.code_tasks.tasks import code_block, functions_of, literal, program_of
from dyngen.generators.proposer.sampling import seed_requests
from dyngen.llm import ChatModel, ChatResult, Message
from dyngen.sandbox import SandboxInputError, argument_literal

if TYPE_CHECKING:
    from dyngen.generators.proposer.seeds import Seed

SYSTEM = ("You write short Python functions for programming puzzles. Reply with one function "
          "`f` of one argument in a ```python block, then one line `Input: <a Python literal "
          "to call f with>`.")
ASK_CODE = "Write a new, different function in the style of this one, with an input:\n"
ASK_TEXT = "Write a Python function that computes the answer to a problem like this one:\n"
# (the seed's program, its input, a new program, its input)
SHOTS = (
    ("def f(x):\n    return [v * 2 for v in x]", "[1, 2, 3]",
     "def f(x):\n    return sum(v for v in x if v % 2 == 0)", "[4, 7, 10, 3]"),
    ("def f(s):\n    return s.count('a')", "'banana'",
     "def f(s):\n    return ''.join(c for c in s if c not in 'aeiou')", "'programming'"),
    ("def f(n):\n    total = 0\n    for i in range(n):\n        total += i * i\n    return total",
     "5", "def f(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
     "    return a", "10"),
)
# A seed that is no code task (a word problem): its answer as a function of its numbers.
TEXT_SHOT = ("Tom has 12 apples and buys 7 more. How many apples does he have?",
             "def f(x):\n    apples, bought = x\n    return apples + bought", "(12, 7)")
# `[^\n]*` to the line's end, stripped after: a lazy group before `[ \t]*$` backtracks
# quadratically on a line of blanks a model may well write.
_INPUT = re.compile(r"^[ \t]*Input:[ \t]*(?P<arg>[^\n]*)", re.M | re.I)


def _shown(program: str, argument: str) -> str:
    """A program and its input as the examples show them."""
    return f"```python\n{program}\n```\nInput: {argument}"


def few_shot() -> list[Message]:
    """The fixed start of every prompt: the format, then worked examples."""
    out: list[Message] = [{"role": "system", "content": SYSTEM}]
    for program, argument, new, new_argument in SHOTS[:2]:
        out += [{"role": "user", "content": ASK_CODE + _shown(program, argument)},
                {"role": "assistant", "content": _shown(new, new_argument)}]
    question, new, new_argument = TEXT_SHOT
    out += [{"role": "user", "content": ASK_TEXT + question},
            {"role": "assistant", "content": _shown(new, new_argument)}]
    program, argument, new, new_argument = SHOTS[2]
    out += [{"role": "user", "content": ASK_CODE + _shown(program, argument)},
            {"role": "assistant", "content": _shown(new, new_argument)}]
    return out


def shot_programs() -> list[str]:
    """The programs the examples show (a proposal equal to one of them is a copy)."""
    return [p for shot in SHOTS for p in (shot[0], shot[2])] + [TEXT_SHOT[1]]


def messages_for(seed: Seed) -> list[Message]:
    """The few-shot chat asking for a new program in the style of `seed`."""
    shown = program_of(seed.question)
    if shown is not None:
        program, argument = shown
        ask = ASK_CODE + _shown(program, argument if argument is not None else "...")
    else:
        ask = ASK_TEXT + seed.question
    return [*few_shot(), {"role": "user", "content": ask}]


def propose(model: ChatModel, seeds: list[Seed], cfg: dict[str, Any],
            stream: tuple[Any, ...]) -> list[ChatResult]:
    """The model's completions for each seed: one result per seed, in order."""
    return model.complete(seed_requests(seeds, messages_for, cfg, stream))


@dataclass(frozen=True)
class Candidate:
    """A program and input read from a completion, not yet run."""

    program: str
    function: str
    argument: str  # the input, as the literal's canonical text (repr of its value)
    value: Any  # the input itself


def parse_candidate(text: str, max_program_chars: int,
                    max_input_chars: int) -> Candidate | str:
    """The candidate a completion proposes, or why it is none ("unparsed", "too_long")."""
    program = code_block(text)
    if program is None:
        # A reply cut at max_new_tokens (or without its closing fence) still counts.
        start = text.find("def ")
        end = _INPUT.search(text, start) if start >= 0 else None
        program = text[start:end.start()].strip().strip("`") if end else None
    if not program:
        return "unparsed"
    names = functions_of(program)
    m = _INPUT.search(text, text.find(program) + len(program) if program in text else 0)
    if not names or m is None:
        return "unparsed"
    ok, value = literal(m["arg"].strip().strip("`"))
    if not ok:
        return "unparsed"
    try:  # 1e999, nan, a 5,000-digit int, a nesting too deep: no input the sandbox can take
        shown = argument_literal(value)
    except SandboxInputError:
        return "unparsed"
    if len(program) > max_program_chars or len(shown) > max_input_chars:
        return "too_long"
    function = "f" if "f" in names else names[-1]
    return Candidate(program.strip(), function, shown, value)
