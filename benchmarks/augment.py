"""Augmentation: label precision per method on held-out rows of our own, each label re-checked.

Every kept variant's label is checked again by another path than the one that made it:
  renumber       arithmetic rows of every level (the expression evaluated by Python), rows
                 of five templates of our own (numbers read back from the text by regex,
                 the answer computed by Python) and proposer-style renumbered word problems
                 (each with its formula written here by hand);
  reasoning_gym  rows of ten families at levels 0-1: the label scored by reasoning-gym's
                 own `score_answer` of the family's dataset at the row's level;
  code_inputs    the 36 seed tasks, three new inputs each: the program run once more in a
                 fresh sandbox, its value compared with the label;
  rephrase       two-number arithmetic rows rewritten by SmolLM2-135M served by llama.cpp
                 (xllamacpp), solved by the same server: a kept rewrite's label is re-read
                 from its words (the two numbers, one operation named by a sign or a word);
                 a rewrite naming no single operation is `unreadable`, counted apart.
The baseline, measured on the same variants in the same run: the source's label copied
onto the new question (what an augmenter that does not recompute would keep); for rephrase,
whose label is the source's by design, every rewrite kept unchecked.

    python benchmarks/augment.py [--rows 400] [--rephrase 48] [--no-rephrase]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# Not this folder: its reasoning_gym.py would shadow the reasoning_gym package.
sys.path[:] = [str(REPO)] + [p for p in sys.path if Path(p or ".").resolve() != REPO / "benchmarks"]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import datasets  # noqa: E402

from dyngen.generators.arithmetic import arithmetic_task  # noqa: E402

TEMPLATES = (  # (template, answer expression, the same as Python over the numbers in order)
    ("Ana packs {a} boxes of {b} apples each and eats {c}. How many apples are left?",
     "a * b - c", lambda a, b, c: a * b - c),
    ("A bus carries {a} people. At the first stop {b} get off and {c} get on. How many "
     "people are on the bus now?", "a - b + c", lambda a, b, c: a - b + c),
    ("{a} friends share {b} stickers equally. How many stickers does each friend get?",
     "b / a", lambda a, b: Fraction(b, a)),
    ("A shop sells pens at {a} dollars each. Joe buys {b} pens and pays with {c} dollars. "
     "How much change does he get?", "c - a * b", lambda a, b, c: c - a * b),
    ("Mia reads {a} pages a day for {b} days, then {c} more pages. How many pages did she "
     "read?", "a * b + c", lambda a, b, c: a * b + c),
)
WORD_PROBLEMS = (  # (question, label, the formula over its numbers in order, by hand)
    ("Tom has 12 apples. He buys 7 more apples. How many apples does Tom have now?", "19",
     lambda a, b: a + b),
    ("A box holds 24 pencils. How many pencils are in 6 boxes?", "144", lambda a, b: a * b),
    ("Sara had 45 stickers and gave 18 to her friend. How many stickers does she have left?",
     "27", lambda a, b: a - b),
    ("A baker made 96 cookies and packed them equally into 8 bags. How many cookies are in "
     "each bag?", "12", lambda a, b: Fraction(a, b)),
    ("There are 15 rows of chairs with 12 chairs in each row. How many chairs are there?",
     "180", lambda a, b: a * b),
    ("Lisa has 100 dollars. She spends 37 dollars on a book. How much money is left?", "63",
     lambda a, b: a - b),
)
FAMILIES = ("basic_arithmetic", "chain_sum", "leg_counting", "word_sorting", "base_conversion",
            "gcd", "lcm", "letter_counting", "number_sorting", "spell_backward")


def row(i: int, source: str, question: str, truth: str, **extra: Any) -> dict[str, Any]:
    return {"data_source": source, "ability": "math",
            "prompt": [{"role": "user", "content": question}],
            "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": {"index": i, "template": None, "answer": None, "method": None,
                           **extra}}


def as_number(text: str) -> Fraction | None:
    try:
        return Fraction(str(text).replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", text)]


def held_out_renumber(n: int) -> tuple[list[dict[str, Any]], list[Any]]:
    """Rows and, per row, the independent recomputation of a question's answer."""
    rng = random.Random(20_260)
    rows, recompute = [], []
    for i in range(n // 2):
        rows.append(arithmetic_task(rng, i, 1 + i % 8))
        rows[-1]["extra_info"].update(template=None, answer=None, method=None)
        recompute.append(lambda q: Fraction(eval(q.removeprefix("What is ").rstrip("?"),  # noqa: S307
                                                 {"__builtins__": {}})))
    while len(rows) < n - len(WORD_PROBLEMS):
        template, answer, fn = TEMPLATES[len(rows) % len(TEMPLATES)]
        fields = re.findall(r"{(\w+)}", template)
        while True:
            values = {f: rng.randint(2, 60) for f in fields}
            value = Fraction(fn(*values.values()))
            if value > 0 and value.denominator == 1:
                break
        rows.append(row(len(rows), "stories", template.format(**values), str(value),
                        template=template, answer=answer))
        recompute.append(lambda q, fn=fn: Fraction(fn(*numbers(q))))
    for question, truth, fn in WORD_PROBLEMS:
        rows.append(row(len(rows), "dyngen-proposer", question, truth, method="renumbered"))
        recompute.append(lambda q, fn=fn: Fraction(fn(*numbers(q))))
    return rows, recompute


def precision(name: str, made: list[dict[str, Any]], sources: list[dict[str, Any]],
              right: Any, tried: int) -> None:
    """Print the kept share, the precision, and the copied-label baseline's."""
    ok = sum(bool(right(r, r["reward_model"]["ground_truth"])) for r in made)
    copied = sum(bool(right(r, sources[r["extra_info"]["augmented_from"]["index"]]
                            ["reward_model"]["ground_truth"])) for r in made)
    n = len(made) or 1
    print(f"{name:<15}{tried:>8}{len(made):>8}{len(made) / max(tried, 1):>9.1%}"
          f"{ok / n:>11.2%}  ({ok}/{len(made)}){copied / n:>12.2%}")


def bench_renumber(n: int) -> None:
    from dyngen.generators.augment import RenumberAugmenter

    rows, recompute = held_out_renumber(n)
    gen = RenumberAugmenter({"select": "random", "rows_per_round": len(rows)})
    made = gen.generate(datasets.Dataset.from_list(rows)).to_list()
    precision("renumber", made, rows, lambda r, label: as_number(label) == recompute[
        r["extra_info"]["augmented_from"]["index"]](r["prompt"][-1]["content"]), len(rows))
    print(f"{'':15}skipped {gen.stats['methods']['renumber']['skipped']}, rejected "
          f"{gen.stats['methods']['renumber']['rejected']}")


def bench_reasoning_gym(n: int) -> None:
    import reasoning_gym

    from dyngen.generators.augment import ReasoningGymAugmenter
    from dyngen.generators.reasoning_gym import ReasoningGymCurriculum
    from dyngen.generators.reasoning_gym.families import Family, decode_entry
    from dyngen.round import RoundContext, Trigger

    rows: list[dict[str, Any]] = []
    for level in (0, 1):
        gen = ReasoningGymCurriculum({"tasks": list(FAMILIES), "rows_per_round": n // 2,
                                      "seed": 7 + level})
        state = {"levels": dict.fromkeys(FAMILIES, level)}
        made = gen.generate(datasets.Dataset.from_dict({"prompt": []}),
                            RoundContext("held-out", level, 0, Trigger(), state)).to_list()
        rows += made
    scorers: dict[tuple[str, int], Any] = {}

    def right(r: dict[str, Any], label: str) -> bool:
        info = r["extra_info"]["reasoning_gym"]
        key = (info["family"], info["level"])
        if key not in scorers:
            at = Family(key[0])
            at.start_at(key[1])
            scorers[key] = reasoning_gym.create_dataset(key[0], size=1, seed=1,
                                                        **at.configuration()).score_answer
        return scorers[key](label, decode_entry(info["entry"])) == 1.0

    aug = ReasoningGymAugmenter({"select": "random", "rows_per_round": len(rows), "seed": 3})
    made = aug.generate(datasets.Dataset.from_list(rows)).to_list()
    precision("reasoning_gym", made, rows, right, len(rows))


def bench_code_inputs() -> None:
    from dyngen.generators.augment import CodeInputsAugmenter
    from dyngen.generators.code_tasks.seed_tasks import SEED_FILE
    from dyngen.generators.code_tasks.tasks import literal
    from dyngen.sandbox import run_python, same_value

    rows = datasets.load_dataset("json", data_files=str(SEED_FILE), split="train")
    made: list[dict[str, Any]] = []
    for seed in range(3):
        made += CodeInputsAugmenter({"select": "random", "rows_per_round": len(rows),
                                     "seed": seed}).generate(rows).to_list()

    def right(r: dict[str, Any], label: str) -> bool:
        info = r["extra_info"]
        again = run_python(info["program"], info["function"], literal(info["input"])[1])
        return again.ok and same_value(again.value, label)

    precision("code_inputs", made, rows.to_list(), right, 3 * len(rows))


_OPS = {"+": r"\+|\bplus\b|\bsum\b|\badd(?:ed|ing)?\b|\btotal\b|\bmore\b|\btogether\b",
        "-": r"(?<!\d)-(?!\d)|\bminus\b|\bdifference\b|\bsubtract(?:ed|ing)?\b|\bless\b|"
             r"\bfewer\b|\bleft\b|\btake away\b",
        "*": r"\*|×|\btimes\b|\bproduct\b|\bmultipl(?:y|ied|ying)\b"}


def read_back(question: str) -> Fraction | None:
    """The value a two-number rewrite asks for, from its words; None if not one operation."""
    nums = numbers(question)
    named = [op for op, words in _OPS.items() if re.search(words, question, re.I)]
    if len(nums) != 2 or len(named) != 1:
        return None
    a, b = nums
    if named[0] == "-" and re.search(rf"subtract\w*\s+{a}\s+from\s+{b}", question, re.I):
        a, b = b, a
    return Fraction({"+": a + b, "-": a - b, "*": a * b}[named[0]])


def bench_rephrase(n: int) -> None:
    from dyngen.generators.augment import RephraseAugmenter
    from tests.llm.llama_server import LlamaServer

    rng = random.Random(41)
    rows = []
    for i in range(n):
        rows.append(arithmetic_task(rng, i, 1 + i % 4))
    server = LlamaServer(Path(tempfile.mkdtemp()), parallel=4, ctx=4096).start()
    try:
        gen = RephraseAugmenter({"select": "random", "rows_per_round": n, "endpoint": server.url,
                                 "model_name": "smollm2", "samples": 4, "agree": 0.5})
        t0 = time.perf_counter()
        made = gen.generate(datasets.Dataset.from_list(rows)).to_list()
        seconds = time.perf_counter() - t0
    finally:
        server.stop()
    rewrites = [*made, *(r["row"] for r in gen.rejected)]

    def readable(r: dict[str, Any]) -> bool:
        return read_back(r["prompt"][-1]["content"]) is not None

    def right(r: dict[str, Any], label: str) -> bool:
        return read_back(r["prompt"][-1]["content"]) == as_number(label)

    precision("rephrase", [r for r in made if readable(r)], rows, right, n)
    every = [r for r in rewrites if isinstance(r, dict) and readable(r)]
    ok = sum(right(r, r["reward_model"]["ground_truth"]) for r in every)
    print(f"{'':15}kept {len(made)} of {len(rewrites)} rewrites of {n} rows "
          f"({len(made) - sum(map(readable, made))} kept unreadable); rejected "
          f"{gen.stats['methods']['rephrase']['rejected']}; {seconds:.0f} s")
    print(f"{'':15}baseline, every rewrite kept unchecked: {len(every)} of {len(rewrites)} "
          f"readable, {ok} of those right; the other {len(rewrites) - len(every)} ask for "
          "something no label of ours is known to answer")
    for r in made:
        print(f"{'':15}kept: {r['prompt'][-1]['content']!r} -> {r['reward_model']['ground_truth']}"
              f" (agreement {r['extra_info']['agreement']})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=400, help="renumber and reasoning_gym rows")
    ap.add_argument("--rephrase", type=int, default=48, help="rows to rephrase")
    ap.add_argument("--no-rephrase", action="store_true", help="skip the served model")
    args = ap.parse_args()
    print(f"{'method':<15}{'sources':>8}{'kept':>8}{'share':>9}{'precision':>11}"
          f"{'':>10}{'copied label':>12}")
    bench_renumber(args.rows)
    bench_reasoning_gym(args.rows)
    bench_code_inputs()
    if not args.no_rephrase:
        bench_rephrase(args.rephrase)


if __name__ == "__main__":
    main()
