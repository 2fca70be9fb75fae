"""The closed-loop benchmark's task family: sums and products of 1 to 5 digits.

Both arms draw from the same family. The mix (`draw`): the operation + or * with even odds;
both operands have d digits, d = 1, 2, 3, 4, 5 with weights 30/30/20/10/10. Each prompt is
a system line and two worked turns that restate the expression (SmolLM2-135M solves almost
no task asked for the number alone, see benchmarks/solve_rate.py), then the task; the
answer is exact (data_source dyngen-arithmetic: dyngen's exact-match reward grades it).

The held-out evaluation set is drawn from the same mix with its own seed; neither arm ever
trains on one of its questions, nor on a worked turn's. `ClosedLoopCandidates` is the
generator the dyngen arm's rounds run (data.datagen.path = this file).
"""

from __future__ import annotations

import random
from typing import Any

from dyngen import AbstractDataGenerator

SOURCE = "dyngen-arithmetic"
SYSTEM = "Compute it. Reply as: expression = result"
SHOTS = (("12 + 35", "12 + 35 = 47"), ("6 * 7", "6 * 7 = 42"))
DIGITS = (1, 2, 3, 4, 5)
DIGIT_WEIGHTS = (3, 3, 2, 1, 1)
EVAL_SEED = "held-out"


def messages(question: str) -> list[dict[str, str]]:
    """The chat of one task: the system line, the two worked turns, the question."""
    out = [{"role": "system", "content": SYSTEM}]
    for asked, answered in SHOTS:
        out += [{"role": "user", "content": asked}, {"role": "assistant", "content": answered}]
    return [*out, {"role": "user", "content": question}]


def draw(rng: random.Random) -> tuple[str, int, str, int]:
    """(question, answer, operation, digits) of one task of the mix."""
    op = rng.choice("+*")
    digits = rng.choices(DIGITS, DIGIT_WEIGHTS)[0]
    low = 10 ** (digits - 1) if digits > 1 else 1
    a, b = rng.randrange(low, 10 ** digits), rng.randrange(low, 10 ** digits)
    return f"{a} {op} {b}", (a + b if op == "+" else a * b), op, digits


def task_row(question: str, answer: int, op: str, digits: int, index: int) -> dict[str, Any]:
    """One task in verl's schema."""
    return {"data_source": SOURCE, "prompt": messages(question), "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(answer)},
            "extra_info": {"index": index, "op": op, "digits": digits}}


def held_out(size: int) -> list[dict[str, Any]]:
    """The evaluation set: `size` distinct tasks of the mix, none a worked turn."""
    rng, seen, out = random.Random(EVAL_SEED), {q for q, _ in SHOTS}, []
    while len(out) < size:
        question, answer, op, digits = draw(rng)
        if question not in seen:
            seen.add(question)
            out.append(task_row(question, answer, op, digits, len(out)))
    return out


def tasks(seed: str, count: int, eval_size: int, start: int = 0,
          exclude: set[str] | None = None) -> list[dict[str, Any]]:
    """`count` distinct tasks of the mix, none held out, a worked turn or in `exclude`."""
    banned = {r["prompt"][-1]["content"] for r in held_out(eval_size)}
    banned |= {q for q, _ in SHOTS} | (exclude or set())
    rng, out = random.Random(seed), []
    for _ in range(count * 50):  # one-digit tasks run out long before this
        if len(out) == count:
            break
        question, answer, op, digits = draw(rng)
        if question not in banned:
            banned.add(question)
            out.append(task_row(question, answer, op, digits, start + len(out)))
    return out


class ClosedLoopCandidates(AbstractDataGenerator):
    """`candidates` new tasks of the mix per round (seeded by the round), for the band to
    cut; a task already in the dataset is left to the round's duplicate filter."""

    defaults = {"candidates": 16, "seed": 0, "eval_size": 40}

    def generate(self, dataset: Any, context: Any = None) -> list[dict[str, Any]]:
        cfg = self.settings()
        round_no = context.round_seed if context is not None else 0
        start = len(getattr(dataset, "dataframe", dataset))
        return tasks(f"{cfg['seed']}-round-{round_no}", int(cfg["candidates"]),
                     int(cfg["eval_size"]), start=start)
