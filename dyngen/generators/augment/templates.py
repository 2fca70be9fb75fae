"""A row's program as a template: its text with named numbers, and its answer's expression.

A user's row says it in extra_info: `template` ("Tom has {a} apples and buys {b} more. How
many apples does he have?") and `answer` ("a + b": numbers, the template's names, + - * /
and parentheses). The row's question must be the template with numbers in place of the
names, and its label the answer at those numbers; new numbers give a new question whose
label is computed, never copied.

dyngen's own arithmetic rows ("What is 3 + 4 * 5?") are their own program: `of_arithmetic`
makes the template from the question, each number a name, the expression its answer.
"""

from __future__ import annotations

import ast
import random
import re
import string
from dataclasses import dataclass
from fractions import Fraction

from dyngen.generators.proposer.arithmetic import (
    RAW_NUMBER,
    as_number,
    clean_math,
    format_number,
    safe_eval,
)
from dyngen.generators.proposer.checking import pure_arithmetic
from dyngen.generators.proposer.renumbering import formula_steps

_NUMBER_TEXT = r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?"
_NAME = re.compile(r"[A-Za-z_]\w*")
MAX_TRIES = 200  # draws of new numbers before a row counts as one renumbering cannot serve


class TemplateError(ValueError):
    """A template or answer expression that cannot be read, or a row it does not describe."""


@dataclass(frozen=True)
class Template:
    """A question's text with named numbers, and the expression of its answer."""

    text: str
    answer: str
    names: tuple[str, ...]  # in order of first appearance in the text

    @classmethod
    def parse(cls, text: object, answer: object) -> Template:
        """The template, or TemplateError saying what is wrong with it."""
        if not isinstance(text, str) or not isinstance(answer, str):
            raise TemplateError(f"expected extra_info.template and extra_info.answer as text, "
                                f"found {type(text).__name__} and {type(answer).__name__}")
        try:
            parts = list(string.Formatter().parse(text))
        except ValueError as exc:
            raise TemplateError(f"extra_info.template does not parse: {exc} (write a literal "
                                "brace as {{ or }})") from None
        names: list[str] = []
        for _, field, spec, conversion in parts:
            if field is None:
                continue
            if not field.isidentifier() or spec or conversion:
                raise TemplateError(f"extra_info.template: expected fields such as {{a}}, "
                                    f"found {{{field}{'!' + conversion if conversion else ''}"
                                    f"{':' + spec if spec else ''}}}")
            if field not in names:
                names.append(field)
        if not names:
            raise TemplateError("extra_info.template has no field such as {a}: no number "
                                "to change")
        used = _names_of(answer)
        if not used <= set(names):
            raise TemplateError(f"extra_info.answer uses {sorted(used - set(names))}, which "
                                f"extra_info.template does not have (it has {names})")
        return cls(text, answer, tuple(names))

    def values_in(self, question: str) -> dict[str, Fraction]:
        """The numbers that stand for the names in `question`, or TemplateError."""
        pattern, seen = "", set()
        for literal, field, _, _ in string.Formatter().parse(self.text):
            pattern += re.escape(literal)
            if field is not None:
                pattern += f"(?P={field})" if field in seen else f"(?P<{field}>{_NUMBER_TEXT})"
                seen.add(field)
        m = re.fullmatch(pattern, question.strip(), re.S)
        if m is None:
            raise TemplateError("the row's question is not extra_info.template with numbers "
                                "in place of its fields")
        return {name: Fraction(m[name].replace(",", "")) for name in self.names}

    def value(self, values: dict[str, Fraction]) -> Fraction | None:
        """The answer at `values`, exactly (None: it divides by zero)."""
        return safe_eval(self._numeric(values))

    def fill(self, values: dict[str, Fraction]) -> str:
        """The question at `values`."""
        return self.text.format(**{n: format_number(v) for n, v in values.items()})

    def renumbered(self, values: dict[str, Fraction], rng: random.Random
                   ) -> tuple[dict[str, Fraction], str] | None:
        """New values of the same size and its label, keeping every step's sign (and
        wholeness where it was whole) and the label exact; None if no draw does."""
        old_steps = formula_steps(self._numeric(values))
        for _ in range(MAX_TRIES):
            new = {n: _same_size(v, rng) for n, v in values.items()}
            if new == values:
                continue
            label = format_number(value) if (value := self.value(new)) is not None else None
            try:
                steps = formula_steps(self._numeric(new))
            except ZeroDivisionError:
                continue
            if label is not None and all(
                    (o > 0) == (s > 0) and (o < 0) == (s < 0)
                    and (o.denominator != 1 or s.denominator == 1)
                    for o, s in zip(old_steps, steps, strict=True)):
                return new, label
        return None

    def _numeric(self, values: dict[str, Fraction]) -> str:
        return _NAME.sub(lambda m: f"({format_number(values[m[0]])})", self.answer)


def _names_of(answer: str) -> set[str]:
    """The names an answer expression uses; TemplateError if it is not plain arithmetic."""
    try:
        tree = ast.parse(answer, mode="eval")
    except SyntaxError:
        raise TemplateError(f"extra_info.answer {answer!r} does not parse as an "
                            "expression") from None
    names = set()
    for node in ast.walk(tree.body):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.BinOp) and not isinstance(
                node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
            raise TemplateError(f"extra_info.answer may use + - * / only, found "
                                f"{type(node.op).__name__} in {answer!r}")
        elif not isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Constant, ast.Load,
                                   ast.operator, ast.unaryop)) or (
                isinstance(node, ast.Constant) and type(node.value) not in (int, float)):
            raise TemplateError(f"extra_info.answer may hold numbers, names, + - * / and "
                                f"parentheses only, found {ast.unparse(node)!r}")
    if len(answer) > 100:
        raise TemplateError(f"extra_info.answer is {len(answer)} characters; at most 100")
    return names


def _same_size(v: Fraction, rng: random.Random) -> Fraction:
    """A number with as many digits as `v` (its sign, and cents where it has them)."""
    unit = Fraction(1) if v.denominator == 1 else Fraction(1, 100)
    steps = abs(int(v / unit))
    digits = len(str(steps))
    low = 10 ** (digits - 1) if digits > 1 else 1
    drawn = unit * rng.randint(low, 10 ** digits - 1)
    return -drawn if v < 0 else drawn


def of_arithmetic(question: str) -> Template | None:
    """A question that is only arithmetic ("What is 3 + 4 * 5?") as its own template."""
    if pure_arithmetic(question) is None:
        return None
    expression = clean_math(question).strip(" ?.")
    numbers = list(RAW_NUMBER.finditer(question))
    names = tuple(f"n{i}" for i in range(len(numbers)))
    text, last = "", 0
    for name, m in zip(names, numbers, strict=True):
        text += question[last:m.start()].replace("{", "{{").replace("}", "}}") + f"{{{name}}}"
        last = m.end()
    text += question[last:].replace("{", "{{").replace("}", "}}")
    answer = iter(names)
    formula = re.sub(r"\d+(?:\.\d+)?", lambda _: next(answer), expression)
    if safe_eval(expression) is None or len(formula) > 100:
        return None
    return Template(text, formula, names)


def label_matches(label: object, value: Fraction | None) -> bool:
    """Whether a row's label is `value` (as a number: "1,000" and "1000.0" alike)."""
    return value is not None and as_number(str(label)) == value
