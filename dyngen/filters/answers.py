"""The reference answer as a duplicate gate: two rows whose answers differ are two tasks.

"Lena buys 4 notebooks at 3 dollars each. How much does she pay?" and "... How much change
does she get from a 20-dollar bill?" read alike to MinHash and to an embedding; their
ground truths (12 and 8) say they are different tasks. `answer_of` turns a row's reference
into a canonical text, `answer_key` into a 64-bit hash of it, or None when the row has no
answer that can be compared (the duplicate filters then keep their similarity rule alone):

- numbers and fractions as values: `12`, `12.0`, `$12`, `1,200`, `30%`, `\\frac{1}{4}`,
  `1/4` and `0.25` are each one value (`x = 6` is 6: a renamed variable is the same answer);
- text: case, whitespace, a final full stop and `\\boxed{}` / `$...$` do not count;
- a Python literal (`'HELLO'`, `[1, 2]`, `{'a': 1}`) by value, its case kept;
- a choice letter (`B`, `(B)`) stands for its option's text when the prompt lists options
  `A) ...  B) ...` (or `(A)`, `A.`), so a reordered list or an answer given as the text
  compares by what was chosen;
- code (dyngen.generators.code_tasks rows: `extra_info` holds `program`, `input` and
  `output`): what the reference does, the task kind with its input and output as Python
  values, whatever the function and its variables are called; test cases (a ground truth
  `{"inputs": [...], "outputs": [...]}`, or `assert f(...) == ...` lines) likewise;
- a list of accepted answers: the set of them.

A free-text reference (more than `MAX_WORDS` words: an essay, a proof) is not compared.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import unicodedata
from collections import Counter
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from dyngen.rows import RowBatch
from dyngen.store.minhash import numbers, prompt_text, words

MAX_WORDS = 12  # a longer reference is free text: not compared
# The fields of a row an answer is read from (the prompt too, for a choice's options).
ANSWER_FIELDS = {"reward_model": ("ground_truth",),
                 "extra_info": ("task", "program", "input", "output")}
_CHOICE = re.compile(r"^\(?([A-Ja-j])\s*[).:]?\)?$")
_OPTION = re.compile(r"(?:^|(?<=\s))\(?([A-J])[).:]\s+")
_NUMBER = re.compile(r"^[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:e[-+]?\d+)?$", re.I)
_FRAC = re.compile(r"^\\d?frac\{([^{}]+)\}\{([^{}]+)\}$")
_ASSIGN = re.compile(r"^[a-z]\w*\s*=\s*")
_ASSERT = re.compile(r"^\s*assert\s+[A-Za-z_][\w.]*\((.*)\)\s*==\s*(.+?)\s*$")
_UNIT = re.compile(r"^(\S+)\s+[a-z]{1,12}(?:\s+[a-z]{1,12})?$")


def answer_key(row: Mapping[str, Any], prompt_key: str = "prompt") -> int | None:
    """A 64-bit hash of the row's canonical reference answer; None if not comparable."""
    return key_of(answer_of(row, prompt_key))


def answer_keys(rows: Sequence[Mapping[str, Any]], prompt_key: str = "prompt"
                ) -> list[int | None]:
    """`answer_key` of each row, reading only the columns it needs."""
    names = (prompt_key, "reward_model", "extra_info")
    if isinstance(rows, RowBatch):
        columns = [rows.column(n) for n in names]
    else:
        columns = [[r.get(n) if isinstance(r, Mapping) else None for r in rows] for n in names]
    return [answer_key(dict(zip(names, values, strict=True)), prompt_key)
            for values in zip(*columns, strict=True)]


def key_of(canonical: str | None) -> int | None:
    """The 64-bit hash of a canonical answer (never 0); None stays None."""
    if canonical is None:
        return None
    digest = hashlib.blake2b(canonical.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1


def answer_of(row: Mapping[str, Any], prompt_key: str = "prompt") -> str | None:
    """The row's reference answer in canonical form, or None if it has none comparable."""
    info = row.get("extra_info")
    # (An Arrow struct column gives every row every field: absent ones are None.)
    if isinstance(info, Mapping) and info.get("program") is not None \
            and info.get("output") is not None:
        return "code:" + "|".join([str(info.get("task") or ""), _value(info.get("input")),
                                   _value(info.get("output"))])
    reward = row.get("reward_model")
    truth = reward.get("ground_truth") if isinstance(reward, Mapping) else None
    # The prompt is read only for a choice letter's options (most answers need none).
    lettered = isinstance(truth, str) and _CHOICE.match(_unwrap(truth)) is not None
    if lettered or (isinstance(truth, (list, tuple)) and truth):
        return canonical(truth, prompt_text(row.get(prompt_key)))
    return canonical(truth)


def canonical(truth: Any, prompt: str = "") -> str | None:
    """A ground truth in canonical form (see the module's rules); None if not comparable."""
    if truth is None or isinstance(truth, bool):
        return None if truth is None else f"text:{str(truth).lower()}"
    if isinstance(truth, (int, float)):
        return _number(str(truth)) or f"text:{truth}"
    if isinstance(truth, Mapping):
        return _tests(truth)
    if isinstance(truth, Sequence) and not isinstance(truth, str):
        parts = [canonical(t, prompt) for t in truth]
        if not parts or any(p is None for p in parts):
            return None
        return "any:" + "|".join(sorted(set(str(p) for p in parts)))
    text = unicodedata.normalize("NFKC", str(truth)).strip()
    if text[:1] in "{[":
        tests = _tests_text(text)
        if tests is not None:
            return tests
    asserts = _asserts(text) if "assert" in text else None
    if asserts is not None:
        return asserts
    text = _unwrap(text)
    if not text or len(text.split()) > MAX_WORDS:
        return None
    if text[0] in "'\"[({" and text[-1] in "'\"])}":  # a Python literal: by value, case kept
        try:
            return f"value:{_spell(ast.literal_eval(text))}"
        except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
            pass
    choice = _CHOICE.match(text)
    if choice:
        option = options(prompt).get(choice.group(1).upper())
        if option is None:
            return f"choice:{choice.group(1).lower()}"
        text = option
    return _number(text) or "text:" + " ".join(text.lower().split())


def options(prompt: str) -> dict[str, str]:
    """A multiple-choice prompt's options by letter (`A) x B) y`, `(A) x`, `A. x`), read
    only when they run A, B, C... in order; {} otherwise."""
    marks = list(_OPTION.finditer(prompt))
    letters = [m.group(1) for m in marks]
    if len(marks) < 2 or letters != [chr(ord("A") + i) for i in range(len(marks))]:
        return {}
    out = {}
    for m, nxt in zip(marks, [*marks[1:], None], strict=True):
        text = prompt[m.end():nxt.start() if nxt is not None else len(prompt)]
        out[m.group(1)] = _unwrap(text.split("\n")[0].strip())
    return out


def _unwrap(text: str) -> str:
    """Without the wrappings a reference may carry: `\\boxed{}`, `$...$`, a full stop."""
    text = text.strip()
    for head, tail in (("\\boxed{", "}"), ("$", "$"), ("\\(", "\\)")):
        if len(text) > len(head) + len(tail) and text.startswith(head) and text.endswith(tail):
            text = text[len(head):-len(tail)].strip()
    return text.rstrip(".").strip()


def _number(text: str) -> str | None:
    """`num:<value as a fraction>` if the text is a number, fraction or percentage (with a
    currency sign, a variable assigned, or a unit word after it); else None."""
    text = _ASSIGN.sub("", text.strip().lower()).strip()
    unit = _UNIT.match(text)
    if unit and _number_value(unit.group(1)) is not None:
        text = unit.group(1)
    value = _number_value(text)
    return None if value is None else f"num:{value}"


def _number_value(text: str) -> Fraction | None:
    text = text.strip().lstrip("$€£").rstrip("%").strip().replace(" ", "")
    frac = _FRAC.match(text)
    if frac:
        text = f"{frac.group(1)}/{frac.group(2)}"
    top, slash, bottom = text.partition("/")
    try:
        if slash:
            if not (_NUMBER.match(top) and _NUMBER.match(bottom)) or not top or not bottom:
                return None
            return Fraction(top.replace(",", "")) / Fraction(bottom.replace(",", ""))
        if not text or not _NUMBER.match(text) or text in "+-.":
            return None
        return Fraction(text.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def _value(literal: Any) -> str:
    """A Python literal's value in one canonical spelling (dicts and sets in sorted order);
    text that is no literal, with its whitespace collapsed."""
    text = str(literal)
    try:
        return _spell(ast.literal_eval(text))
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
        return " ".join(text.split())


def _spell(value: Any) -> str:
    if isinstance(value, dict):
        items = sorted(f"{_spell(k)}:{_spell(v)}" for k, v in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, (set, frozenset)):
        return "set(" + ",".join(sorted(_spell(v) for v in value)) + ")"
    if isinstance(value, (list, tuple)):
        inner = ",".join(_spell(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    return repr(value)


def _tests(truth: Mapping[str, Any]) -> str | None:
    """Test cases' inputs and expected outputs, as a set of pairs."""
    ins, outs = truth.get("inputs"), truth.get("outputs")
    if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs):
        return None
    pairs = sorted(f"{_value(i) if not isinstance(i, str) else ' '.join(i.split())}->"
                   f"{_value(o) if not isinstance(o, str) else ' '.join(o.split())}"
                   for i, o in zip(ins, outs, strict=True))
    return "tests:" + "|".join(pairs)


def _tests_text(text: str) -> str | None:
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    return _tests(parsed) if isinstance(parsed, Mapping) else None


def _asserts(text: str) -> str | None:
    """`assert name(args) == expected` lines: their arguments and expected values, the
    function's name left out (a renamed function does the same)."""
    lines = [line for line in text.splitlines() if line.strip()]
    found = [_ASSERT.match(line) for line in lines]
    if not lines or not all(found):
        return None
    return "asserts:" + "|".join(sorted(f"{_value('(' + m.group(1) + ',)')}->"
                                        f"{_value(m.group(2))}" for m in found if m))


SAME, DIFFERENT = "same answer", "different answer"
UNKNOWN = "no comparable answer"


def compare(mine: int | None, theirs: int | None) -> str:
    """SAME or DIFFERENT when both rows have a comparable answer; else UNKNOWN."""
    if mine is None or theirs is None:
        return UNKNOWN
    return SAME if mine == theirs else DIFFERENT


def numbers_within(a: Sequence[str], b: Sequence[str]) -> bool:
    """Whether one text's number literals (a multiset) hold all of the other's: a paraphrase
    may reorder its numbers or spell one out ("three times"), a number variant changes one."""
    ca, cb = Counter(a), Counter(b)
    return not (ca - cb) or not (cb - ca)


def swapped(a: str, b: str) -> bool:
    """Whether one text is the other with its numbers in other roles: the same number
    literals in another order and the same words besides ("Tom is 12 and his sister is 8.
    How much older is Tom?" / "Tom is 8 and his sister is 12. How much older is his
    sister?"; "9 percent of 50" / "50 percent of 9"). Such a pair may share its answer by
    chance; a paraphrase that moves a number rewords the text around it."""
    na, nb = numbers(a), numbers(b)
    if na == nb or Counter(na) != Counter(nb):
        return False
    return {w for w in words(a) if not w.isdigit()} == {w for w in words(b) if not w.isdigit()}
