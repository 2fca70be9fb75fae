"""CodeTaskProposer with the real SmolLM2-135M-Instruct on CPU and the real sandbox: the
generator contract, and tasks from the hardest rollouts whose every label a fresh sandbox
gives back. The model-free parts are in test_code_task_checking.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets
import pytest

from dyngen.generators.code_tasks import ABDUCTION, DEDUCTION, CodeTaskProposer
from dyngen.generators.code_tasks.reward import compute_score
from dyngen.generators.code_tasks.seed_tasks import SEED_FILE
from dyngen.generators.code_tasks.tasks import literal, normal_form
from dyngen.llm.weights import load_model
from dyngen.round import RoundContext, Trigger
from dyngen.round.rollouts import RolloutsPolicy
from dyngen.sandbox import run_python, same_value
from tests.generators.contract import GeneratorContract, assert_verl_row

REPO = Path(__file__).resolve().parents[2]
CACHE = str(REPO / ".dyngen" / "models")  # gitignored; converted once per checkout
# Small enough for CI: one seed, one sample of at most 48 tokens, up to 3 passes.
FAST = {"hard_k": 1, "proposals_per_seed": 1, "max_new_tokens": 48, "max_passes": 3,
        "min_rows": 1}
SEEDS = [json.loads(line) for line in SEED_FILE.read_text().splitlines()]


def proposer(**cfg: Any) -> CodeTaskProposer:
    return CodeTaskProposer({"cache_dir": CACHE, **cfg})


pytestmark = pytest.mark.usefixtures("offline")  # nothing from a hub


@pytest.fixture(scope="module")
def model(offline: None) -> tuple[Any, Any, str]:
    """The shipped model, converted once into the project cache, loaded once."""
    return load_model(proposer().settings())


class TestCodeTaskProposer(GeneratorContract):
    def make_generator(self) -> CodeTaskProposer:
        return proposer(**FAST)

    @pytest.fixture
    def seed_dataset(self) -> datasets.Dataset:
        """Code tasks, as a code-task dataset starts (the first three shipped seeds)."""
        return datasets.Dataset.from_list(SEEDS[:3])

    @pytest.fixture
    def generator(self, model: Any) -> CodeTaskProposer:  # the model loads once, first
        return self.make_generator()


def test_hard_seeds_yield_new_programs_whose_labels_a_fresh_sandbox_gives_back(
        model: Any, tmp_path: Path) -> None:
    seeds = SEEDS
    data = datasets.Dataset.from_list(seeds)
    # Rollouts of a batch: the first 6 tasks solved, tasks 6..9 failed (the hard ones).
    rollouts = tmp_path / "batch.jsonl"
    rollouts.write_text("".join(json.dumps({
        "prompt": row["prompt"], "score": 1.0 if i < 6 else 0.1 * (i - 6),
        "ground_truth": row["reward_model"]["ground_truth"]}) + "\n"
        for i, row in enumerate(seeds[:10])))
    context = RoundContext("code", 1, 0, Trigger(rollouts=str(rollouts)),
                           rollouts_policy=RolloutsPolicy((str(tmp_path),)))
    gen = proposer(hard_k=3, proposals_per_seed=3, max_new_tokens=96, max_passes=2,
                   min_rows=2, tasks=[DEDUCTION, ABDUCTION], seed=3)
    rows = gen.generate(data, context=context)
    stats = gen.stats
    assert stats["kept"] >= 1 and len(rows) == 2 * stats["kept"], stats
    assert stats["proposed"] == stats["kept"] + sum(stats["dropped"].values())
    assert stats["tasks"] == {DEDUCTION: stats["kept"], ABDUCTION: stats["kept"]}
    seed_forms = {normal_form(row["extra_info"]["program"]) for row in seeds}
    for i, row in enumerate(rows):
        assert_verl_row(row)
        info = row["extra_info"]
        assert (row["data_source"], row["ability"], info["verification"]) == (
            "dyngen-code-tasks", "code", "execution")
        assert info["index"] == len(data) + i and info["model"].startswith("SmolLM2")
        assert 6 <= info["seed_index"] <= 8 and info["seed_score"] < 0.5  # the hard seeds
        assert normal_form(info["program"]) not in seed_forms  # a new program
        truth = row["reward_model"]["ground_truth"]
        assert truth == info["output"]
        # The label is what the program gives in a fresh sandbox, and the reward agrees.
        rerun = run_python(info["program"], info["function"], literal(info["input"])[1])
        assert rerun.ok and same_value(rerun.value or "", truth), (info, rerun)
        answer = info["input"] if info["task"] == ABDUCTION else truth
        assert compute_score("dyngen-code-tasks", f"Answer: {answer}", truth, info) == 1.0
        question = row["prompt"][-1]["content"]
        assert info["program"] in question
        assert (truth if info["task"] == ABDUCTION else info["input"]) in question
