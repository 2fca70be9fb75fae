"""A few dozen hand-written code tasks: a seed dataset for CodeTaskProposer's first rounds.

`seed_tasks.jsonl` (next to this file, in verl's row schema) holds one deduction task per
program below, labelled by running it in the sandbox; `python -m
dyngen.generators.code_tasks.seed_tasks` writes it again (tests check that it is what the
programs give). Import it: `dyngen import code-tasks generators/code_tasks/seed_tasks.jsonl`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SEED_FILE = Path(__file__).with_name("seed_tasks.jsonl")
SEED_SOURCE = "dyngen-code-seeds"

# (program, its input as a Python literal): each defines f of one argument.
PROGRAMS: tuple[tuple[str, str], ...] = (
    ("def f(x):\n    return sorted(x, reverse=True)[:3]", "[4, 9, 1, 7, 3]"),
    ("def f(s):\n    return s[::-1].upper()", "'stressed'"),
    ("def f(n):\n    return [i * i for i in range(n) if i % 2]", "9"),
    ("def f(words):\n    return max(words, key=len)", "['pear', 'banana', 'kiwi']"),
    ("def f(x):\n    return sum(x) - max(x) - min(x)", "[5, 1, 8, 3, 6]"),
    ("def f(s):\n    counts = {}\n    for c in s:\n        counts[c] = counts.get(c, 0) + 1\n"
     "    return counts", "'mississippi'"),
    ("def f(n):\n    digits = 0\n    while n:\n        digits += n % 10\n        n //= 10\n"
     "    return digits", "98765"),
    ("def f(x):\n    return [a + b for a, b in zip(x, x[1:])]", "[1, 4, 9, 16, 25]"),
    ("def f(s):\n    return ' '.join(w.capitalize() for w in s.split())", "'the quick brown fox'"),
    ("def f(x):\n    return {v: k for k, v in x.items()}", "{'a': 1, 'b': 2, 'c': 3}"),
    ("def f(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
     "12"),
    ("def f(x):\n    out = []\n    for v in x:\n        if v not in out:\n"
     "            out.append(v)\n    return out", "[3, 1, 3, 2, 1, 4]"),
    ("def f(s):\n    return sum(1 for c in s if c in 'aeiou')", "'programming puzzles'"),
    ("def f(x):\n    return [x[i] for i in range(0, len(x), 3)]", "'abcdefghij'"),
    ("def f(n):\n    return [d for d in range(1, n + 1) if n % d == 0]", "36"),
    ("def f(x):\n    evens = [v for v in x if v % 2 == 0]\n    odds = [v for v in x if v % 2]\n"
     "    return evens + odds", "[7, 2, 9, 4, 1, 6]"),
    ("def f(s):\n    return s.replace('a', '4').replace('e', '3').replace('o', '0')",
     "'hello world area'"),
    ("def f(x):\n    total, best = 0, 0\n    for v in x:\n        total = max(0, total + v)\n"
     "        best = max(best, total)\n    return best", "[2, -5, 3, 4, -1, 2, -8, 1]"),
    ("def f(pairs):\n    return sorted(pairs, key=lambda p: (p[1], p[0]))",
     "[('b', 2), ('a', 3), ('c', 2), ('d', 1)]"),
    ("def f(n):\n    bits = ''\n    while n:\n        bits = str(n % 2) + bits\n        n //= 2\n"
     "    return bits", "45"),
    ("def f(s):\n    return s == s[::-1]", "'racecar'"),
    ("def f(x):\n    return [[row[i] for row in x] for i in range(len(x[0]))]",
     "[[1, 2, 3], [4, 5, 6]]"),
    ("def f(s):\n    out = []\n    for c in s:\n        if out and out[-1][0] == c:\n"
     "            out[-1] = (c, out[-1][1] + 1)\n        else:\n            out.append((c, 1))\n"
     "    return out", "'aaabccdddd'"),
    ("def f(n):\n    steps = 0\n    while n != 1:\n"
     "        n = n // 2 if n % 2 == 0 else 3 * n + 1\n        steps += 1\n    return steps",
     "27"),
    ("def f(x):\n    return sum(v * (i + 1) for i, v in enumerate(x))", "[3, 0, 2, 5]"),
    ("def f(s):\n    return sorted(set(s.lower()) - set(' '))", "'Hello World'"),
    ("def f(x):\n    x = sorted(x)\n    mid = len(x) // 2\n    return x[mid] if len(x) % 2 else "
     "(x[mid - 1] + x[mid]) / 2", "[7, 3, 9, 1, 4, 8]"),
    ("def f(words):\n    groups = {}\n    for w in words:\n        groups.setdefault(len(w), [])"
     ".append(w)\n    return groups", "['a', 'to', 'cat', 'in', 'dog', 'be']"),
    ("def f(n):\n    return [n // 10 ** i % 10 for i in range(len(str(n)))][::-1]", "40213"),
    ("def f(s):\n    shift = 3\n    return ''.join(chr((ord(c) - 97 + shift) % 26 + 97) "
     "if c.isalpha() else c for c in s)", "'attack at dawn'"),
    ("def f(x):\n    return [v for v in x if all(v % d for d in range(2, v))] if x else []",
     "[2, 3, 4, 5, 9, 11, 15, 17]"),
    ("def f(x):\n    running = []\n    total = 0\n    for v in x:\n        total += v\n"
     "        running.append(total)\n    return running", "[5, -2, 7, 0, 3]"),
    ("def f(s):\n    words = s.split()\n    return ' '.join(reversed(words))",
     "'one two three four'"),
    ("def f(x):\n    a, b = x\n    while b:\n        a, b = b, a % b\n    return a", "(84, 126)"),
    ("def f(grid):\n    return sum(row.count('#') for row in grid)",
     "['#..#', '.##.', '#...']"),
    ("def f(x):\n    return dict(sorted(x.items(), key=lambda kv: -kv[1])[:2])",
     "{'red': 4, 'blue': 9, 'green': 6, 'gold': 1}"),
)


def seed_rows() -> list[dict[str, Any]]:
    """The seed tasks as rows, each labelled by running its program in the sandbox."""
    from concurrent.futures import ThreadPoolExecutor

    from dyngen.generators.code_tasks.tasks import DEDUCTION, deduction_prompt, literal
    from dyngen.sandbox import run_deterministic

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda p: run_deterministic(p[0], "f", literal(p[1])[1]),
                                PROGRAMS))
    rows = []
    for i, ((program, argument), result) in enumerate(zip(PROGRAMS, results, strict=True)):
        if not literal(argument)[0] or not result.ok or result.value is None:
            raise RuntimeError(f"seed task {i} does not run: {result}")
        rows.append({
            "data_source": SEED_SOURCE,
            "prompt": [{"role": "user", "content": deduction_prompt(program, "f", argument)}],
            "ability": "code",
            "reward_model": {"style": "rule", "ground_truth": result.value},
            "extra_info": {"index": i, "task": DEDUCTION, "program": program, "function": "f",
                           "input": argument, "output": result.value,
                           "verification": "execution"},
        })
    return rows


def write_seed_file(path: Path = SEED_FILE) -> Path:
    """Write the seed tasks as JSONL (one row a line) to `path`."""
    path.write_text("".join(json.dumps(r) + "\n" for r in seed_rows()), encoding="utf-8")
    return path


if __name__ == "__main__":
    print(write_seed_file(Path(sys.argv[1]) if len(sys.argv) > 1 else SEED_FILE))
