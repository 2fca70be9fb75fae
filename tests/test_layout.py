"""The house stays readable: every source file under 400 lines (the sandbox's supervisor, one
file on purpose, says why on its first line), and the round's flow body is its diagram."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400
# Handed as text to a bare interpreter inside the sandbox: it cannot import a second file.
ONE_FILE_ON_PURPOSE = {"dyngen/sandbox/runner.py"}
FLOW_BODY_LINES = 30


def test_no_source_file_is_over_400_lines() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
             for p in (ROOT / "dyngen").rglob("*.py")}
    assert len(sizes) > 100
    assert {f: n for f, n in sizes.items() if n > MAX_LINES
            and f not in ONE_FILE_ON_PURPOSE} == {}


def test_the_one_file_on_purpose_says_why_on_its_first_line() -> None:
    for name in ONE_FILE_ON_PURPOSE:
        first = (ROOT / name).read_text(encoding="utf-8").splitlines()[0]
        assert first.startswith("# One file on purpose"), first


def test_the_rounds_flow_body_is_at_most_30_lines_and_names_the_five_stages() -> None:
    path = ROOT / "dyngen/flows/generation_round.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    flow = next(n for n in tree.body
                if isinstance(n, ast.FunctionDef) and n.name == "generation_round")
    body = flow.body[1:] if isinstance(flow.body[0], ast.Expr) else flow.body  # the docstring
    lines = body[-1].end_lineno - body[0].lineno + 1
    assert lines <= FLOW_BODY_LINES
    calls = sorted((n for n in ast.walk(flow) if isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Name)), key=lambda n: (n.lineno, n.col_offset))
    called = [n.func.id for n in calls]
    stages = ["load_dataset", "generate_all", "filter_generated", "concat_rows",
              "commit_version"]
    assert [c for c in called if c in stages] == stages  # in the diagram's order, once each
