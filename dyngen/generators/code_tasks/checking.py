"""Checking candidates: each program is run twice in the sandbox, and its label is the value.

In order, a candidate is dropped as
  copy              its program (comments, spacing and docstrings aside) is a seed's, an
                    example's, an earlier candidate's or one already in the dataset;
  forbidden         the AST filter refuses it (nothing runs);
  trivial           its function never reads its argument (any input gives the same value);
  timeout, memory, error, output_limit, crashed
                    the sandbox's reason on either run;
  nondeterministic  the two runs (two hash seeds) gave different values;
  not_literal       the value's repr does not read back as a Python literal, so no answer
                    can be compared with it by value;
  trivial           it returns its input unchanged, or None.
The rest are kept, labelled with the first run's value.
"""

from __future__ import annotations

import ast
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from dyngen.generators.code_tasks.proposing import Candidate
from dyngen.generators.code_tasks.tasks import literal, normal_form
from dyngen.sandbox import SandboxResult, run_deterministic, same_value, screen


@dataclass(frozen=True)
class Checked:
    """A candidate and its label, or the reason it is dropped."""

    candidate: Candidate
    output: str | None = None  # the label: repr of the value the function returns
    reason: str = ""
    seconds: float = 0.0  # spent in the sandbox

    @property
    def ok(self) -> bool:
        """Whether the candidate is kept."""
        return not self.reason


def label_of(result: SandboxResult, candidate: Candidate) -> tuple[str | None, str]:
    """(the label, "") from a run's result, or (None, why the candidate is dropped)."""
    if not result.ok or result.value is None:
        return None, result.reason or "crashed"
    readable, value = literal(result.value)
    if not readable:
        return None, "not_literal"
    if value is None or same_value(result.value, candidate.argument):
        return None, "trivial"
    return result.value, ""


def ignores_its_argument(program: str, function: str) -> bool:
    """Whether `function`'s body never reads any of its parameters (a constant task)."""
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            args = node.args
            names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs,
                                     *filter(None, (args.vararg, args.kwarg))]}
            return not any(isinstance(n, ast.Name) and n.id in names
                           for stmt in node.body for n in ast.walk(stmt))
    return False


def check_candidates(candidates: list[Candidate], seen: set[str],
                     cfg: dict[str, Any]) -> list[Checked]:
    """Each candidate checked (see the module's docstring), in order; `seen` (normal forms of
    programs already known) gains every candidate's program."""
    out: list[Checked | None] = [None] * len(candidates)
    to_run: list[int] = []
    for i, cand in enumerate(candidates):
        form = normal_form(cand.program)
        if form in seen:
            out[i] = Checked(cand, reason="copy")
            continue
        seen.add(form)
        if screen(cand.program):
            out[i] = Checked(cand, reason="forbidden")
            continue
        if ignores_its_argument(cand.program, cand.function):
            out[i] = Checked(cand, reason="trivial")
            continue
        to_run.append(i)

    def run(i: int) -> Checked:
        cand = candidates[i]
        result = run_deterministic(
            cand.program, cand.function, cand.value, isolation=str(cfg["sandbox"]),
            timeout_seconds=float(cfg["timeout_seconds"]), memory_mb=int(cfg["memory_mb"]),
            max_value_chars=int(cfg["max_value_chars"]))
        output, reason = label_of(result, cand)
        return Checked(cand, output, reason, result.seconds)

    with ThreadPoolExecutor(max(1, int(cfg["sandbox_workers"]))) as pool:
        for i, checked in zip(to_run, pool.map(run, to_run), strict=True):
            out[i] = checked
    return [c for c in out if c is not None]
