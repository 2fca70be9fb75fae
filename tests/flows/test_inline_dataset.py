"""The trainer-side dataset running rounds inline, as verl's synchronous mode did."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dyngen.errors import (
    ConfigError,
    DyngenError,
    DyngenImportError,
    GeneratorClassNotFoundError,
    GeneratorImportError,
    GeneratorNotFoundError,
    GeneratorTypeError,
)
from dyngen.server.processes import free_port
from dyngen.store import Store
from dyngen.trainers.dataset import DyngenDataset
from tests.rows import verl_rows

pytestmark = pytest.mark.usefixtures("prefect_server")


def test_inline_rounds_grow_the_dataset_the_trainer_reads(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", verl_rows(4))
    config = {"data": {"datagen": {"path": "pkg://tests.flows.gens", "name": "UsesContext"}}}
    data = DyngenDataset(tmp_path, "ds", mode="inline", config=config, every_n_batches=2,
                         metrics_fn=lambda batch: {"score": sum(batch) / len(batch)})
    assert (len(data), data.version) == (4, 0)
    assert data.on_batch_end([0.2, 0.4]) is None  # batch 1 of 2: no round yet
    summary = data.on_batch_end([0.6, 0.8])
    assert summary["version"] == 1 and summary["created"]
    assert (len(data), data.version) == (5, 1)  # refreshed without a restart
    assert data[4]["data_source"] == "step-2" and data[4]["_dyngen_version"] == 1
    head = store.head("ds")
    assert head.lineage["trigger"]["metrics"] == {"score": pytest.approx(0.7)}
    again = DyngenDataset(tmp_path, "ds")  # a restarted trainer sees the generated row
    assert len(again) == 5


def test_generate_on_start_runs_one_round_before_the_first_batch_once_per_dataset(
        tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", verl_rows(4))
    config = {"data": {"datagen": {"path": "pkg://tests.flows.gens", "name": "UsesContext"}}}
    data = DyngenDataset(tmp_path, "ds", mode="inline", config=config, generate_on_start=True)
    assert (len(data), data.version) == (5, 1)  # the round's row is served from the start
    assert data.start_round is not None and data.start_round["version"] == 1
    head = store.head("ds")
    assert head.lineage["trigger"]["step"] == 0 and head.lineage["round"] == 1

    restarted = DyngenDataset(tmp_path, "ds", mode="inline", config=config,
                              generate_on_start=True)  # the head already has a round
    assert restarted.start_round is None and (restarted.version, len(restarted)) == (1, 5)
    assert store.head_version("ds") == 1


# ---- what a retry cannot fix stops the trainer; what may pass is logged ----------------
GOOD_GENERATOR = '''
import datasets
from dyngen import AbstractDataGenerator

class MyGen(AbstractDataGenerator):
    def generate(self, dataset):
        prompt = [{"role": "user", "content": f"task {len(dataset)} of my own"}]
        return datasets.Dataset.from_list([dict(dataset[0], data_source="mine", prompt=prompt)])
'''
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def inline(root: Path, datagen: dict, **round_cfg: object) -> DyngenDataset:
    """An inline dataset over `root`'s dataset "ds" with this generator (no retries)."""
    config = {"data": {"datagen": datagen}, "round": {"retries": 0, **round_cfg}}
    return DyngenDataset(root, "ds", mode="inline", config=config)


@pytest.mark.parametrize(("datagen", "round_cfg", "error", "message"), [
    ({"path": "generators/nowhere.py", "name": "MyGen"}, {}, GeneratorNotFoundError,
     "generator file for class 'MyGen' not found"),
    ({"path": "FILE", "name": "Missing"}, {}, GeneratorClassNotFoundError,
     "Its generator classes are: 'MyGen'"),
    ({"path": "pkg://tests.rows", "name": "verl_row"}, {}, GeneratorTypeError,
     "must be a class that inherits from dyngen.generators.base.AbstractDataGenerator"),
    ({"path": "BROKEN", "name": "MyGen"}, {}, GeneratorImportError,
     "failed to import: ModuleNotFoundError: No module named 'a_dependency_not_installed'"),
    ({"path": "pkg://generators.base", "name": "MockDataGenerator"}, {},
     GeneratorNotFoundError, "expected 'pkg://dyngen.generators.base'"),
    ({"path": "FILE", "name": "MyGen"}, {"retries": -1}, ConfigError,
     "round.retries: expected an integer >= 0, found -1"),
    ({"path": "FILE", "name": "MyGen"}, {"filters": [{"path": "pkg://no_such_filters",
                                                       "name": "Short"}]},
     GeneratorNotFoundError, "filter module 'no_such_filters' not found"),
])
def test_a_round_that_cannot_start_raises_when_the_dataset_is_built(
        tmp_path: Path, datagen: dict, round_cfg: dict, error: type, message: str) -> None:
    Store(tmp_path).create("ds", verl_rows(2))
    (tmp_path / "my_gen.py").write_text(GOOD_GENERATOR)
    (tmp_path / "broken.py").write_text("import a_dependency_not_installed\n" + GOOD_GENERATOR)
    where = {"FILE": str(tmp_path / "my_gen.py"), "BROKEN": str(tmp_path / "broken.py")}
    datagen = {**datagen, "path": where.get(datagen["path"], datagen["path"])}
    with pytest.raises(error) as raised:
        inline(tmp_path, datagen, **round_cfg)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert isinstance(raised.value, DyngenError)
    assert Store(tmp_path).head_version("ds") == 0


def test_a_prompt_key_other_than_the_datasets_raises_when_the_dataset_is_built(
        tmp_path: Path) -> None:
    Store(tmp_path).create("ds", verl_rows(2))  # prompts in column "prompt"
    config = {"data": {"prompt_key": "question"}}
    with pytest.raises(ConfigError, match="keeps its prompts in column 'prompt'"):
        DyngenDataset(tmp_path, "ds", mode="inline", config=config)


def test_a_dyngen_module_that_fails_to_import_raises_when_the_dataset_is_built(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Store(tmp_path).create("ds", verl_rows(2))
    # None in sys.modules makes `import` fail as a shadowed or half-installed module does.
    monkeypatch.setitem(sys.modules, "dyngen.runtime.in_process", None)
    with pytest.raises(DyngenImportError, match="dyngen.runtime.in_process") as raised:
        inline(tmp_path, {"path": "pkg://tests.flows.gens", "name": "UsesContext"})
    assert "cannot start" in str(raised.value) and "\n" not in str(raised.value)


def test_a_generator_gone_or_broken_by_the_first_batch_end_raises_there(
        tmp_path: Path) -> None:
    Store(tmp_path).create("ds", verl_rows(2))
    gen = tmp_path / "my_gen.py"
    gen.write_text(GOOD_GENERATOR)
    data = inline(tmp_path, {"path": str(gen), "name": "MyGen"})
    gen.write_text("import a_dependency_not_installed\n" + GOOD_GENERATOR)  # edited meanwhile
    with pytest.raises(GeneratorImportError, match="a_dependency_not_installed"):
        data.on_batch_end()
    gen.unlink()
    with pytest.raises(GeneratorNotFoundError, match="my_gen.py"):
        data.on_batch_end()
    assert Store(tmp_path).head_version("ds") == 0  # nothing partial was committed
    gen.write_text(GOOD_GENERATOR)  # fixed: the same dataset goes on
    assert data.on_batch_end()["version"] == 1 and len(data) == 3


def test_a_round_that_fails_while_running_is_logged_and_training_continues(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    Store(tmp_path).create("ds", verl_rows(2))
    crashing = inline(tmp_path, {"path": "pkg://tests.flows.gens", "name": "AlwaysFails"})
    assert crashing.on_batch_end() is None
    assert "proposer crashed" in caplog.text and "training continues on version 0" in caplog.text
    # A model server down: the documented model generator at a port where nothing listens.
    monkeypatch.setenv("DYNGEN_TEST_LLM_KEY", "sk-test")
    down = f"http://127.0.0.1:{free_port()}/v1"
    served = inline(tmp_path, {"path": str(EXAMPLES / "model_hints_generator.py"),
                               "name": "ModelHints", "endpoint": down,
                               "api_key_env": "DYNGEN_TEST_LLM_KEY"})
    caplog.clear()
    assert served.on_batch_end() is None
    assert down in caplog.text and "training continues on version 0" in caplog.text
    assert Store(tmp_path).head_version("ds") == 0
