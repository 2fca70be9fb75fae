"""CodeTaskProposer without the model: completions read into candidates, candidates checked
in the real sandbox with every drop reason, the shipped seed tasks re-executed, the settings,
the refusal where bwrap cannot run, and the warning of an unisolated round."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import datasets
import pytest

from dyngen.errors import ConfigError
from dyngen.generators.code_tasks import UNISOLATED_WARNING, CodeTaskProposer
from dyngen.generators.code_tasks.checking import check_candidates
from dyngen.generators.code_tasks.proposing import Candidate, messages_for, parse_candidate
from dyngen.generators.code_tasks.seed_tasks import PROGRAMS, SEED_FILE, seed_rows
from dyngen.generators.code_tasks.tasks import deduction_prompt, literal, normal_form, program_of
from dyngen.generators.proposer.seeds import Seed
from dyngen.sandbox import SandboxUnavailableError, probe, run_python, same_value

CFG = CodeTaskProposer({}).settings()


def candidate(program: str, argument: object = 3) -> Candidate:
    return Candidate(program, "f", repr(argument), argument)


@pytest.mark.parametrize(("text", "expected"), [
    ("```python\ndef f(x):\n    return x * 2\n```\nInput: [1, 2]", ("f", "[1, 2]")),
    ("Sure!\n```py\ndef g(s):\n    return s[::-1]\n```\n\nInput: `'ab'`\nOutput: 'ba'",
     ("g", "'ab'")),
    ("def f(n):\n    return n + 1\nInput: 4", ("f", "4")),  # no fence, cut short
    ("```python\ndef helper(v):\n    return v\ndef f(x):\n    return helper(x)\n```\nInput: "
     "(1,2)", ("f", "(1, 2)")),
])
def test_a_completion_becomes_a_candidate(text: str, expected: tuple[str, str]) -> None:
    cand = parse_candidate(text, 2000, 300)
    assert isinstance(cand, Candidate), cand
    assert (cand.function, cand.argument) == expected
    assert literal(cand.argument) == (True, cand.value)


@pytest.mark.parametrize(("text", "why"), [
    ("I would write a loop.", "unparsed"),
    ("```python\ndef f(x):\n    return (\n```\nInput: 1", "unparsed"),  # does not parse
    ("```python\ndef f(x):\n    return x\n```\nInput: os.getcwd()", "unparsed"),  # no literal
    ("```python\ndef f(x):\n    return x\n```", "unparsed"),  # no input
    ("```python\nx = 1\n```\nInput: 1", "unparsed"),  # no function
    ("```python\ndef f(x):\n    return x\n```\nInput: " + repr("y" * 400), "too_long"),
])
def test_a_completion_that_is_no_candidate_says_why(text: str, why: str) -> None:
    assert parse_candidate(text, 2000, 300) == why


def test_each_candidate_is_kept_with_its_value_or_dropped_with_its_reason() -> None:
    seen = {normal_form("def f(x):\n    return x + 1")}  # a seed's program
    cases = [
        (candidate("def f(x):\n    return [v * v for v in range(x)]"), "", "[0, 1, 4]"),
        (candidate("def f(x):\n    # a comment\n    return x + 1"), "copy", None),
        (candidate("def f(x):\n    return [v * v for v in range(x)]  # again"), "copy", None),
        (candidate("import os\ndef f(x):\n    return os.getpid()"), "forbidden", None),
        (candidate("def f(x):\n    return 1 / (x - 3)"), "error", None),
        (candidate("def f(x, y):\n    return x + y"), "error", None),  # two arguments
        (candidate("def f(x):\n    while True:\n        x += 1"), "timeout", None),
        (candidate("def f(x):\n    return bytearray(2**34 * x)"), "memory", None),
        (candidate("def f(x):\n    return 'a' * 1000 * x"), "output_limit", None),
        (candidate("import random\ndef f(x):\n    return random.random() + x"),
         "nondeterministic", None),
        (candidate("def f(x):\n    return float('nan') * x"), "not_literal", None),
        (candidate("def f(x):\n    return x"), "trivial", None),
        (candidate("def f(x):\n    return {'a': 1, 'b': 7 * 6}"), "trivial", None),  # constant
        (candidate("def f(x):\n    x += 1"), "trivial", None),  # returns None
        (candidate("def f(x):\n    return {c: x.count(c) for c in set(x)}", "abca"), "",
         "{'a': 2, 'b': 1, 'c': 1}"),
    ]
    cfg = {**CFG, "timeout_seconds": 1.0, "memory_mb": 256}
    checked = check_candidates([c for c, _, _ in cases], seen, cfg)
    for (cand, reason, output), got in zip(cases, checked, strict=True):
        assert got.candidate is cand
        assert got.reason == reason, (cand.program, got)
        if output is not None:
            assert same_value(got.output or "", output), got
    assert normal_form(cases[0][0].program) in seen


def test_the_shipped_seed_tasks_are_their_programs_labelled_by_execution() -> None:
    """The file is what running the hand-written programs gives today, and every label
    comes back from a fresh sandbox."""
    rows = [json.loads(line) for line in SEED_FILE.read_text().splitlines()]
    assert len(rows) == len(PROGRAMS) >= 30
    assert rows == seed_rows()
    for row in rows:
        info = row["extra_info"]
        assert (row["ability"], info["verification"], info["task"]) == (
            "code", "execution", "deduction")
        assert program_of(row["prompt"][-1]["content"]) == (info["program"], info["input"])
        assert row["reward_model"]["ground_truth"] == info["output"]
    data = datasets.Dataset.from_json(str(SEED_FILE))  # as `dyngen import` reads it
    assert len(data) == len(rows)


def test_the_prompt_shows_a_code_seeds_program_or_a_text_seeds_question() -> None:
    code = Seed(4, deduction_prompt("def f(x):\n    return x[::-1]", "f", "'abc'"), 0.1)
    asked = messages_for(code)[-1]["content"]
    assert asked.endswith("```python\ndef f(x):\n    return x[::-1]\n```\nInput: 'abc'")
    text = Seed(5, "A box holds 24 pencils. How many pencils are in 6 boxes?", None)
    assert messages_for(text)[-1]["content"].endswith("How many pencils are in 6 boxes?")


@pytest.mark.parametrize(("cfg", "match"), [
    ({"tasks": ["induction"]}, "tasks: expected a list of some of deduction, abduction"),
    ({"tasks": []}, "tasks: expected a list"),
    ({"sandbox": "docker"}, "sandbox: expected one of bwrap, unisolated"),
    ({"timeout_seconds": 0}, "0 < timeout_seconds <= 600"),
    ({"sandbox_timeout": 3}, "unknown keys"),
])
def test_bad_settings_are_refused_by_name(cfg: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        CodeTaskProposer(cfg).generate(datasets.Dataset.from_list([]))


def test_where_bwrap_cannot_run_a_round_refuses_before_loading_the_model(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    probe.bwrap_problem.cache_clear()
    try:
        # A model path that does not exist: refusing first means it is never looked for.
        gen = CodeTaskProposer({"model_path": str(tmp_path / "no-model")})
        with pytest.raises(SandboxUnavailableError, match="sandbox=unisolated"):
            gen.generate(datasets.Dataset.from_json(str(SEED_FILE)))
    finally:
        monkeypatch.undo()
        probe.bwrap_problem.cache_clear()


def test_an_unisolated_round_warns_every_time(caplog: pytest.LogCaptureFixture) -> None:
    gen = CodeTaskProposer({"sandbox": "unisolated"})
    empty = datasets.Dataset.from_list([])  # no seeds: no model needed
    with caplog.at_level(logging.WARNING, logger="dyngen.generators.code_tasks.generator"):
        for _ in range(2):
            assert len(gen.generate(empty)) == 0
            assert gen.stats["sandbox"] == "unisolated"
    assert [r.getMessage() for r in caplog.records] == [UNISOLATED_WARNING] * 2


def test_a_label_is_what_a_fresh_sandbox_returns() -> None:
    """The label of a kept candidate is run_python's value, whatever the isolation."""
    cand = candidate("def f(x):\n    return sorted(set(x))", [3, 1, 3])
    [checked] = check_candidates([cand], set(), {**CFG, "sandbox": "unisolated"})
    assert checked.output == run_python(cand.program, "f", [3, 1, 3]).value == "[1, 3]"
