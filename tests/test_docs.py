"""Every code block of the documentation site runs, or its markup says why it does not.

The README and each page under docs/ are found by themselves (a new page is covered with no
edit here); its blocks run in order in a fresh folder of their own, as a reader would type
them there: `python` blocks in one namespace per page; `bash` blocks of plain `dyngen`
commands through the typer app in this process (as tests/test_cli.py runs the CLI), other
`bash` blocks in bash with the installed `dyngen` on PATH, both against the session's real
Prefect server; `yaml` blocks parsed, a dyngen config loaded through its checks; titled
blocks written as the files they name. The markup is described in tests/docs_blocks.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.docs_blocks import (
    DOCS,
    FIXTURES,
    JSON,
    PYTHON,
    SHELL,
    YAML,
    Block,
    blocks,
    dyngen_commands,
    page_fixtures,
    pages,
    problems,
)
from tests.rows import verl_rows

CONFIG_SECTIONS = {"store", "data", "round", "mirror"}
PAGES = pages()


def _id(page: Path) -> str:
    return page.relative_to(DOCS.parent).as_posix()


def test_every_block_says_how_it_is_tested() -> None:
    found = [p for page in PAGES for block in blocks(page) for p in problems(block)]
    found += [f"{_id(page)}: unknown fixture {name!r}; expected one of {sorted(FIXTURES)}"
              for page in PAGES for name in page_fixtures(page) - FIXTURES]
    assert not found, "\n".join(found)


def test_the_markup_check_finds_what_it_should(tmp_path: Path) -> None:
    text = ("```\nno language\n```\n\n<!-- docs-test: skip -->\n```bash\ndyngen x\n```\n\n"
            "<!-- docs-test: covered-by tests/test_docs.py::test_nothing_here -->\n"
            "```bash\ndyngen y\n```\n")
    probe = tmp_path / "probe.md"
    probe.write_text(text)
    found = [p for block in blocks(probe) for p in problems(block)]
    assert len(found) == 3, found
    assert "without a language" in found[0]
    assert "needs a reason" in found[1]
    assert "has no 'test_nothing_here'" in found[2]


def test_plain_dyngen_blocks_run_in_process_and_the_rest_in_bash() -> None:
    assert dyngen_commands("dyngen round ds a=b \\\n    --step 1  # why\ndyngen log ds\n") == [
        ["round", "ds", "a=b", "--step", "1"], ["log", "ds"]]
    assert dyngen_commands("dyngen emit --flush; ls\n") is None
    assert dyngen_commands("export X=1\ndyngen log ds\n") is None
    assert dyngen_commands("prefect server start\n") is None


@pytest.fixture(scope="session")
def gsm8k_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with ./train.parquet and ./dyngen_store holding gsm8k-dyn v0..v3."""
    import datasets

    from dyngen.store import Store
    from dyngen.trainers.verl_format import import_files

    folder = tmp_path_factory.mktemp("docs-gsm8k")
    datasets.Dataset.from_list(verl_rows(8)).to_parquet(str(folder / "train.parquet"))
    store = Store(folder / "dyngen_store")
    import_files(store, "gsm8k-dyn", [folder / "train.parquet"])
    for k in range(3):
        store.append("gsm8k-dyn", verl_rows(2, start=8 + 2 * k, source="round"),
                     idempotency_key=f"docs-fixture-{k}")
    return folder


@pytest.fixture
def page_env(prefect_server: None, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The environment a page's commands see; the test's own process gets it too."""
    from prefect.settings import PREFECT_API_URL

    monkeypatch.delenv("DYNGEN_STORE_ROOT", raising=False)
    monkeypatch.setenv("DYNGEN_OUTBOX", str(tmp_path / "outbox"))
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PREFECT_API_URL"] = str(PREFECT_API_URL.value())
    env["COLUMNS"] = "200"
    yield env


RUNNABLE = [page for page in PAGES if any(
    b.kind in ("run", "defaults") and b.lang in PYTHON | SHELL | YAML | JSON
    for b in blocks(page))]


@pytest.mark.parametrize("page", RUNNABLE, ids=_id)
def test_the_pages_blocks_run(page: Path, page_env: dict[str, str], tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch,
                              gsm8k_template: Path) -> None:
    folder = tmp_path / "page"
    if "gsm8k-dyn" in page_fixtures(page):
        shutil.copytree(gsm8k_template, folder)
    folder.mkdir(exist_ok=True)
    monkeypatch.chdir(folder)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    printed = ""
    for block in blocks(page):
        if block.kind in ("skip", "covered-by"):
            continue
        if block.kind == "output":
            missing = [line for line in block.code.splitlines()
                       if line.strip() and line.strip() not in printed]
            assert not missing, (f"{block.where}: the block before it did not print "
                                 f"{missing}; it printed:\n{printed}")
            continue
        if block.title:
            target = folder / block.title
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.code)
        printed = _check(block, folder, namespace, page_env)


def _check(block: Block, folder: Path, namespace: dict[str, Any], env: dict[str, str]) -> str:
    """Run or check one block; return what it printed."""
    if block.lang in PYTHON:
        compiled = compile(block.code, block.where, "exec")
        if block.title:
            return ""  # a file for later blocks (a generator, a filter), not a script
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compiled, namespace)  # the page's own example, as a reader runs it
        return out.getvalue()
    if block.lang in SHELL:
        commands = dyngen_commands(block.code)
        if commands is not None:
            return _run_in_process(block, commands)
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], cwd=folder,
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (f"{block.where}: exit {done.returncode}\n{block.code}\n"
                                      f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}")
        return done.stdout
    if block.lang in YAML:
        _check_yaml(block, folder)
    elif block.lang in JSON:
        lines = block.lang == "jsonl" or (block.title or "").endswith(".jsonl")
        for text in block.code.splitlines() if lines else [block.code]:
            if text.strip():
                json.loads(text)
    return ""


def _run_in_process(block: Block, commands: list[list[str]]) -> str:
    """`dyngen` commands through the typer app in this process, as tests/test_cli.py runs
    them: the same code a shell would start, without paying its imports per command."""
    from typer.testing import CliRunner

    from dyngen.cli import app

    printed = ""
    for argv in commands:
        result = CliRunner(env={"DYNGEN_STORE_ROOT": None, "COLUMNS": "200"}).invoke(
            app, argv)
        assert result.exit_code == 0, (f"{block.where}: `dyngen {shlex.join(argv)}` exited "
                                       f"{result.exit_code}\n{result.output}"
                                       f"{_traceback(result.exc_info)}")
        printed += result.stdout
    return printed


def _traceback(exc_info: Any) -> str:
    return "".join(traceback.format_exception(*exc_info)) if exc_info else ""


def _check_yaml(block: Block, folder: Path) -> None:
    """Parse the block; load a dyngen config through dyngen's own checks."""
    from omegaconf import OmegaConf

    from dyngen.config import default_config, load_config

    value = yaml.safe_load(block.code)
    if block.kind == "defaults":
        found = OmegaConf.to_container(OmegaConf.create(block.code), resolve=True)
        expected = OmegaConf.to_container(default_config(), resolve=True)
        assert found == expected, (f"{block.where}: the page's defaults differ from "
                                   f"dyngen.config.default_config():\npage: {found}\n"
                                   f"code: {expected}")
    elif isinstance(value, dict) and value and set(value) <= CONFIG_SECTIONS:
        path = folder / (block.title or "_docs_block.yaml")
        path.write_text(block.code)
        load_config(path)


def test_the_readme_and_the_docs_have_one_quickstart() -> None:
    """The README's quickstart and the docs' are the same run: same rows, generator, folder,
    first round and its output (the docs page says more around them)."""
    readme, page = DOCS.parent / "README.md", DOCS / "getting-started" / "quickstart.md"

    def files(path: Path) -> dict[str, str]:
        return {b.title: b.code for b in blocks(path) if b.title}

    def lines(path: Path, start: str) -> list[str]:
        return [ln.strip() for b in blocks(path) for ln in b.code.splitlines()
                if ln.strip().startswith(start)]

    for name in ("train.jsonl", "harder_sums.py"):
        assert files(readme)[name] == files(page)[name], f"{name} differs"
    assert lines(readme, "mkdir ")[-1] in lines(page, "mkdir ")
    first_round = lines(readme, "dyngen round ")[0]
    assert first_round == lines(page, "dyngen round ")[0]
    assert lines(readme, "committed 'my-data' version 1")[0] == \
        lines(page, "committed 'my-data' version 1")[0]


def test_the_readme_is_short_and_starts_with_its_two_commands() -> None:
    """Within 200 lines; its first lines are the demo's one command and the tests' one
    (.ci/run and scripts/check-demo.sh run them as the README names them)."""
    lines = (DOCS.parent / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; keep it within 200"
    assert lines[0] == "# dyngen"
    assert lines[2].startswith("Run the demo") and lines[2].endswith("`bash scripts/demo.sh`")
    assert lines[4].startswith("Run the tests") and lines[4].endswith("`bash scripts/test.sh`")


def test_the_readmes_trainer_snippet_names_the_prefect_server() -> None:
    """The trainer's process needs PREFECT_API_URL too: without it a batch end's event is
    dropped (the store's inbox keeps the batch end), so the snippet says so."""
    snippet = [b for b in blocks(DOCS.parent / "README.md")
               if b.lang in PYTHON and "emit_batch_end(" in b.code]
    assert len(snippet) == 1
    assert "PREFECT_API_URL" in snippet[0].code
