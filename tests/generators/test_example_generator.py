"""The README's example generator passes the contract and runs as a real round."""

from __future__ import annotations

from pathlib import Path

import pytest

from dyngen.generators.loader import load_generator_class
from dyngen.store import Store
from tests.generators.contract import GeneratorContract
from tests.rows import verl_rows

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "paraphrase_generator.py"


class TestParaphraseHardest(GeneratorContract):
    def make_generator(self):
        return load_generator_class(str(EXAMPLE), "ParaphraseHardest")({"k": 2})


@pytest.mark.usefixtures("prefect_server")
def test_the_example_commits_rounds_as_the_readme_says(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dyngen.cli import app

    Store(tmp_path).create("my-data", verl_rows(5))
    args = ["--root", str(tmp_path), "round", "my-data", f"data.datagen.path={EXAMPLE}",
            "data.datagen.name=ParaphraseHardest", "+data.datagen.k=4"]
    for step in (1, 2):
        out = CliRunner().invoke(app, [*args, "--step", str(step)])
        assert out.exit_code == 0, out.output
    store = Store(tmp_path)
    assert [r.lineage["counts"]["kept"] for r in store.history("my-data")[1:]] == [4, 4]
    prompts = [r["prompt"][-1]["content"] for r in store.load("my-data").to_list()[5:]]
    assert prompts[0].startswith("Please solve: ") and prompts[4].endswith("step by step.")
