"""End to end from a user's project folder holding its own `tasks.py`, `flows.py` and
`generators/` package (Invoke's, Celery's and Prefect's usual names), first on `sys.path` as
a user's script has it: every way of running a round commits, with the user's generator
named by file path (`data.datagen.path=generators/my_gen.py`). The TRL case is a real
GRPOTrainer (a tiny random model on the Qwen3 tokenizer) with DyngenCallback inline.

Before dyngen installed one top-level package, each of these failed in such a folder
(`'tasks' is not a package`, `cannot import name 'build_generator' from 'generators'`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dyngen.server.local import LocalServer, spawn, stop, wait_for_automation
from dyngen.store import Store
from dyngen.trainers.events import trigger_name
from tests.e2e.conftest import REPO
from tests.e2e.test_triggered_rounds import finished_runs, wait_for_versions
from tests.rows import verl_rows

DYNGEN = str(Path(sys.executable).with_name("dyngen"))  # the console script a user runs
GENERATOR = ["data.datagen.path=generators/my_gen.py", "data.datagen.name=MyGen"]
CONFIG = {"data": {"datagen": {"path": "generators/my_gen.py", "name": "MyGen"}},
          "round": {"retries": 0}}
DATASETS = ("cli", "script", "inline", "trl", "fork", "process")

# The user's own modules, as plausible as they come.
USER_FILES = {
    "tasks.py": '''"""The project's Invoke tasks."""


def build() -> str:
    return "built"
''',
    "flows.py": '''"""The project's own Prefect flows."""

from prefect import flow


@flow(name="nightly-report")
def nightly_report() -> str:
    return "report"
''',
    "generators/__init__.py": '''"""The project's generators."""

TAG = "my-project"
''',
    "generators/my_gen.py": '''"""One new arithmetic task per round, tagged with the project."""

import datasets

from dyngen import AbstractDataGenerator
from generators import TAG  # the user's own package, beside dyngen's


class MyGen(AbstractDataGenerator):
    def generate(self, dataset, context=None):
        n = 700 + context.round
        return datasets.Dataset.from_list([{
            "data_source": TAG,
            "prompt": [{"role": "system", "content": "Solve the problem."},
                       {"role": "user", "content": f"What is {n} + {n}?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * n)},
            "extra_info": {"index": n, "split": "train"},
        }])
''',
}

# Scripts the user runs from the folder (`python x.py`: the folder is sys.path[0]).
USES_OWN_MODULES = f'''
import json
import tasks, flows, generators
assert tasks.build() == "built" and flows.nightly_report.name == "nightly-report"
assert generators.TAG == "my-project"
CONFIG = {CONFIG!r}
'''
SCRIPTS = {
    "round_script.py": USES_OWN_MODULES + '''
from dyngen import run_round
print(json.dumps(run_round("script", config=CONFIG, trigger={"step": 1})))
''',
    "train_inline.py": USES_OWN_MODULES + '''
from dyngen import DyngenDataset
data = DyngenDataset("dyngen_store", "inline", mode="inline", config=CONFIG)
summary = data.on_batch_end(step=1)
print(json.dumps({"summary": summary, "version": data.version, "rows": len(data)}))
''',
    # A real TRL GRPOTrainer on a tiny random model (the test is about rounds, not learning).
    "train_trl.py": USES_OWN_MODULES + '''
import sys
import torch
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
from trl import GRPOConfig, GRPOTrainer
from dyngen.trainers.trl import DyngenCallback, FollowingDataset
torch.manual_seed(0)
torch.set_num_threads(1)
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
model = Qwen2ForCausalLM(Qwen2Config(
    vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))
def reward(prompts, completions, **_):
    return [float(len(c[0]["content"]) % 3) for c in completions]
args = GRPOConfig(output_dir="out", max_steps=2, per_device_train_batch_size=2,
                  num_generations=2, max_completion_length=4, logging_steps=1, report_to=[],
                  use_cpu=True, save_strategy="no", seed=0)
trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, processing_class=tokenizer,
                      train_dataset=FollowingDataset("dyngen_store", "trl", block_rows=1))
callback = DyngenCallback("dyngen_store", "trl", trainer=trainer, mode="inline", config=CONFIG)
trainer.add_callback(callback)
trainer.train()
print(json.dumps(callback.results))
''',
}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's folder: their modules, their scripts, a store with one dataset per way."""
    folder = tmp_path_factory.mktemp("my-project")
    for name, text in {**USER_FILES, **SCRIPTS}.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    store = Store(folder / "dyngen_store")  # dyngen's default root, in the working folder
    for name in DATASETS:
        store.create(name, verl_rows(4))
    return folder


def user_env(server: LocalServer, folder: Path) -> dict[str, str]:
    """The user's environment: this server, their folder first on the path, then dyngen."""
    env = server.env(PYTHONPATH=os.pathsep.join([str(folder), str(REPO)]))
    env.pop("DYNGEN_STORE_ROOT", None)
    return env


def run(server: LocalServer, folder: Path, *args: str) -> str:
    """Run a command in the user's folder; its output (it must succeed)."""
    done = subprocess.run(list(args), cwd=folder, env=user_env(server, folder),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stdout


def last_json(output: str) -> Any:
    return json.loads(output.strip().splitlines()[-1])


def committed(folder: Path, name: str, rounds: int = 1) -> dict[str, Any]:
    """The user's generator's rows in the dataset's new head, and that head's lineage."""
    store = Store(folder / "dyngen_store")
    head = store.head(name)
    assert head.version == rounds and head.parent == rounds - 1
    new = store.load(name).to_list()[4:]
    assert [row["data_source"] for row in new] == ["my-project"] * rounds
    return head.lineage


def test_dyngen_round(server: LocalServer, project: Path) -> None:
    out = run(server, project, DYNGEN, "round", "cli", *GENERATOR, "--step", "1")
    assert "committed 'cli' version 1" in out
    assert committed(project, "cli")["trigger"]["step"] == 1


def test_run_round_in_a_script(server: LocalServer, project: Path) -> None:
    summary = last_json(run(server, project, sys.executable, "round_script.py"))
    assert (summary["version"], summary["created"]) == (1, True)
    assert committed(project, "script")["trigger"]["step"] == 1


def test_an_inline_dataset_in_a_training_script(server: LocalServer, project: Path) -> None:
    out = last_json(run(server, project, sys.executable, "train_inline.py"))
    assert (out["summary"]["version"], out["version"], out["rows"]) == (1, 1, 5)
    committed(project, "inline")


def test_the_trl_callback_in_a_grpo_trainer(server: LocalServer, project: Path,
                                            qwen_tokenizer_dir: str) -> None:
    results = last_json(run(server, project, sys.executable, "train_trl.py",
                            qwen_tokenizer_dir))
    assert [results[str(step)]["version"] for step in (1, 2)] == [1, 2]
    trigger = committed(project, "trl", rounds=2)["trigger"]
    assert trigger["step"] == 2 and "rewards/reward/mean" in trigger["metrics"]
    assert Path(trigger["rollouts"]).is_file()  # the step's completions, as rollouts


@pytest.mark.parametrize("isolation", ["fork", "process"])
def test_dyngen_serve_commits_an_emitted_batch_end(server: LocalServer, project: Path,
                                                    isolation: str, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    serve = spawn([DYNGEN, "serve", "--dataset", isolation, "--isolation", isolation,
                   *GENERATOR], user_env(server, project), log, cwd=project)
    try:
        wait_for_automation(server.api_url, trigger_name(isolation))
        run(server, project, DYNGEN, "emit", isolation, "--step", "3")
        wait_for_versions(Store(project / "dyngen_store"), isolation, 1, log, timeout=180)
        finished_runs(server, isolation, 1)  # its slot freed before the next serve
    finally:
        stop(serve)
    assert committed(project, isolation)["trigger"]["step"] == 3
    served_by = {"fork": "runs forked from a warm process",  # dyngen's warm runner
                 "process": "Your deployments are being served"}  # Prefect's runner
    assert served_by[isolation] in log.read_text()
