"""The documented example of a user generator asking a model (examples/model_hints_generator.py)
passes the generator contract and runs as a real round, on the session's llama.cpp server."""

from __future__ import annotations

from pathlib import Path

import pytest

from dyngen.generators.base import AbstractDataGenerator
from dyngen.generators.loader import load_generator_class
from dyngen.store import Store
from tests.generators.contract import GeneratorContract
from tests.llm.llama_server import MODEL_ALIAS, LlamaServer
from tests.llm.support import KEY_ENV
from tests.rows import verl_rows

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "model_hints_generator.py"


class TestModelHints(GeneratorContract):
    url = ""

    @pytest.fixture(autouse=True)
    def _server(self, llama: LlamaServer) -> None:
        type(self).url = llama.url

    def make_generator(self) -> AbstractDataGenerator:
        cls = load_generator_class(str(EXAMPLE), "ModelHints")
        return cls({"endpoint": self.url, "api_key_env": KEY_ENV, "k": 2, "max_tokens": 8})


@pytest.mark.usefixtures("prefect_server")
def test_the_example_commits_a_round_as_documented(llama: LlamaServer,
                                                         tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dyngen.cli import app

    Store(tmp_path).create("my-data", verl_rows(5))
    args = ["--root", str(tmp_path), "round", "my-data", f"data.datagen.path={EXAMPLE}",
            "data.datagen.name=ModelHints", f"+data.datagen.endpoint={llama.url}",
            f"+data.datagen.api_key_env={KEY_ENV}", "--step", "1"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    store = Store(tmp_path)
    lineage = store.head("my-data").lineage
    stats = lineage["generator"]["stats"]
    assert stats["asked"] == 4 and stats["kept"] == lineage["counts"]["kept"] > 0
    assert stats["model"]["backend"] == "served" and stats["model"]["model"] == MODEL_ALIAS
    old, new = store.load("my-data").to_list()[1:5], store.load("my-data").to_list()[5:]
    for row in new:  # a tip before the task's own question, whose answer still holds
        source = next(r for r in old if r["prompt"] == row["prompt"][1:])
        assert row["prompt"][0]["role"] == "system" and row["prompt"][0]["content"]
        assert row["reward_model"] == source["reward_model"]


def test_the_served_models_page_shows_the_examples_own_code() -> None:
    """The page includes the file itself (a snippet), so its code cannot drift."""
    page = EXAMPLE.parents[1] / "docs" / "generators" / "served-models.md"
    assert '--8<-- "examples/model_hints_generator.py"' in page.read_text()
