"""`renumber`: a source's question with new numbers, its label recomputed by its program.

Which program, by the row:
  template    extra_info.template and extra_info.answer (templates.py): the user's own rows.
              A template that does not parse, or does not describe its row (the question
              is not the template with numbers, or the answer at those numbers is not the
              label), quarantines the row as `bad_template`, with what is wrong;
  arithmetic  a question that is only arithmetic ("What is 3 + 4 * 5?", dyngen's arithmetic
              curriculum, the proposer's `arithmetic` rows) is its own program;
  formula     the proposer's `renumbered` rows: the one formula over the question's numbers,
              each used once, that gives its label (renumbering.ambiguous refuses a row
              that another formula could also explain), renumbered as the proposer does.
Other rows are skipped: `no_program`, or `label_unproved` (a proposer row whose label a
solver only voted for). New numbers have the digits of the old ones; every step of the
program keeps its sign, and stays whole where it was. `check` recomputes each variant's
label from its own text: the numbers read back from the question, the program run on them.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from dyngen.generators.augment.base import (
    AugmentContext,
    Augmenter,
    BadRow,
    Check,
    NotApplicable,
    with_question,
)
from dyngen.generators.augment.templates import (
    Template,
    TemplateError,
    label_matches,
    of_arithmetic,
)
from dyngen.generators.proposer.arithmetic import (
    NUMBER,
    RAW_NUMBER,
    as_number,
    clean_math,
    format_number,
    safe_eval,
)
from dyngen.generators.proposer.checking import pure_arithmetic
from dyngen.generators.proposer.renumbering import MAX_FORMULA_NUMBERS, renumber
from dyngen.text import question_of

PROPOSER_SOURCE = "dyngen-proposer"
PROVED_PROPOSER_METHODS = ("renumbered", "arithmetic")


class RenumberAugmenter(Augmenter):
    """New numbers for rows whose answer is a computation; each label recomputed."""

    method = "renumber"

    def augment(self, row: dict[str, Any], context: AugmentContext) -> list[dict[str, Any]]:
        """One variant: the question with new numbers, the label its program gives."""
        question, truth = question_of(row["prompt"]), row["reward_model"]["ground_truth"]
        kind, program = program_of(row)
        context.notes["program"] = kind
        if kind == "formula":
            made, why = renumber(question, program, context.rng)
            if made is None:
                raise NotApplicable(why)
            new_question, label = made
        else:
            values = program.values_in(question)
            if not label_matches(truth, program.value(values)):
                if kind == "template":
                    raise BadRow("bad_template", f"extra_info.answer gives "
                                 f"{_shown(program.value(values))} at the row's numbers; its "
                                 f"label is {truth!r}")
                raise NotApplicable("label_disagrees")
            drawn = program.renumbered(values, context.rng)
            if drawn is None:
                raise NotApplicable("renumber_failed")
            new_question, label = program.fill(drawn[0]), drawn[1]
        return [with_question(row, new_question, label)]

    def check(self, source: dict[str, Any], variant: dict[str, Any],
              context: AugmentContext) -> Check:
        """The variant's label, recomputed from its own question by the source's program."""
        truth = variant["reward_model"]["ground_truth"]
        question = question_of(variant["prompt"])
        kind, program = program_of(source)
        if kind == "formula":
            value = _formula_at(program, question_of(source["prompt"]), question)
        elif kind == "arithmetic":
            value = pure_arithmetic(question)
        else:
            try:
                value = program.value(program.values_in(question))
            except TemplateError as exc:
                return ("label_unchecked", str(exc))
        if not label_matches(truth, value):
            return ("label_mismatch", f"label {truth!r}, recomputed {_shown(value)}")
        return None


def program_of(row: dict[str, Any]) -> tuple[str, Any]:
    """(kind, program) of a row: a Template, or a formula's text (see the module)."""
    info = row.get("extra_info") or {}
    question = question_of(row.get("prompt"))
    if info.get("template") is not None or info.get("answer") is not None:
        try:
            template = Template.parse(info.get("template"), info.get("answer"))
            template.values_in(question)
        except TemplateError as exc:
            raise BadRow("bad_template", str(exc)) from None
        return "template", template
    arithmetic = of_arithmetic(question)
    if arithmetic is not None:
        return "arithmetic", arithmetic
    if row.get("data_source") == PROPOSER_SOURCE:
        if info.get("method") not in PROVED_PROPOSER_METHODS:
            raise NotApplicable("label_unproved")
        formula = formula_for(question, row["reward_model"]["ground_truth"])
        if formula is None:
            raise NotApplicable("formula_unknown")
        return "formula", formula
    raise NotApplicable("no_program")


def formula_for(question: str, truth: Any) -> str | None:
    """A formula over the question's numbers, each used once, whose value is `truth`."""
    numbers = NUMBER.findall(clean_math(question))
    target = as_number(str(truth))
    if target is None or not 2 <= len(numbers) <= MAX_FORMULA_NUMBERS:
        return None
    leaves = tuple((Fraction(n), n) for n in numbers)
    return next((text for value, text in _formulas(leaves) if value == target), None)


def _formulas(leaves: tuple[tuple[Fraction, str], ...]) -> list[tuple[Fraction, str]]:
    """(value, text) of every formula of + - * / over `leaves`, each leaf used once."""
    if len(leaves) == 1:
        return list(leaves)
    out = []
    for mask in range(1, 2 ** len(leaves) - 1, 2):  # the first leaf always on the left
        left = tuple(x for i, x in enumerate(leaves) if mask >> i & 1)
        right = tuple(x for i, x in enumerate(leaves) if not mask >> i & 1)
        for a, at in _formulas(left):
            for b, bt in _formulas(right):
                out += [(a + b, f"({at} + {bt})"), (a - b, f"({at} - {bt})"),
                        (b - a, f"({bt} - {at})"), (a * b, f"({at} * {bt})")]
                if b:
                    out.append((a / b, f"({at} / {bt})"))
                if a:
                    out.append((b / a, f"({bt} / {at})"))
    return out


def _formula_at(formula: str, source: str, variant: str) -> Fraction | None:
    """The formula's value at the variant's numbers, each read at its source's place."""
    old = [Fraction(n.replace(",", "")) for n in RAW_NUMBER.findall(source)]
    new = [Fraction(n.replace(",", "")) for n in RAW_NUMBER.findall(variant)]
    mapping: dict[Fraction, Fraction] = {}
    if len(old) != len(new) or any(mapping.setdefault(o, n) != n
                                   for o, n in zip(old, new, strict=True)):
        return None  # not the source's text with other numbers
    return safe_eval(NUMBER.sub(lambda m: f"({format_number(mapping[Fraction(m[0])])})",
                                formula))


def _shown(value: Fraction | None) -> str:
    return "nothing (it divides by zero)" if value is None else str(format_number(value) or value)
