"""The page "Reading versions elsewhere": its commands and Python run as written, and give
what they say."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dyngen.cli import app
from dyngen.store import Store
from tests.mirror.test_delta import as_multiset
from tests.rows import verl_rows

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operations" / "elsewhere.md"


def section_blocks() -> list[tuple[str, str]]:
    """(language, code) of each fenced block of the page, in order."""
    text = PAGE.read_text(encoding="utf-8")
    return re.findall(r"```(\w*)\n(.*?)```", text, flags=re.DOTALL)


def test_the_pages_commands_and_code_run_as_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DYNGEN_STORE_ROOT", raising=False)
    store = Store("dyngen_store")
    store.create("gsm8k-dyn", verl_rows(4))
    store.append("gsm8k-dyn", verl_rows(2, start=10, source="gen"), generator="Gen")
    blocks = section_blocks()
    assert [lang for lang, _ in blocks] == ["python", "bash", "bash", "python"]
    namespace: dict = {}
    for lang, code in blocks:
        if lang == "python":
            exec(compile(code, str(PAGE), "exec"), namespace)
            continue
        for line in code.splitlines():
            if line.startswith("dyngen "):
                done = CliRunner().invoke(app, shlex.split(line)[1:])
                assert done.exit_code == 0, done.output
    rows = store.load("gsm8k-dyn").to_list()
    assert namespace["frame"].height == len(rows) == namespace["tbl"].num_rows
    assert namespace["added"].height == 2
    assert as_multiset(namespace["old"].to_pylist()) == \
        as_multiset(store.load("gsm8k-dyn", 1).to_list())
    assert as_multiset(namespace["head"].to_dicts()) == as_multiset(rows)
    assert [c["dyngen.version"] for c in namespace["commits"]] == [1, 0]
