"""verifiers' own eval (`vf eval`'s runner) over a dyngen store, against llama.cpp (SmolLM2).

The environment is built by `load_environment`; the runner loads it again from its config
(by the taskset's id, as `vf eval` and prime-rl's env servers do), runs each rollout
through verifiers' null-harness chat program (a subprocess that uv provisions, talking to
the model through verifiers' interception server) and scores it with dyngen's rubric.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from verifiers.v1.cli.eval.runner import run_eval
from verifiers.v1.configs.cli.eval import EvalConfig

from dyngen.generators.exact_match import compute_score
from dyngen.store import Store
from dyngen.trainers.verifiers import load_environment
from tests.llm.llama_server import MODEL_ALIAS, LlamaServer
from tests.llm.support import KEY_ENV
from tests.rows import verl_row

pytestmark = pytest.mark.e2e


def test_vf_eval_scores_dyngen_rows_with_the_datasets_reward(
        llama: LlamaServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # verifiers provisions its chat program with uv: this environment's (the dev extra).
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    store = Store(tmp_path / "store")
    store.create("sums", [verl_row(i, "dyngen-arithmetic") for i in (1, 2)])
    env = load_environment(store.root, "sums", follow=False)
    config = EvalConfig.model_validate({
        "env": env.config.model_dump(), "model": MODEL_ALIAS, "num_rollouts": 2,
        "client": {"type": "eval", "base_url": llama.url, "api_key_var": KEY_ENV},
        "sampling": {"max_tokens": 24, "temperature": 1.0},
        "push": False, "rich": None, "output_dir": str(tmp_path / "evals")})
    episodes = asyncio.run(run_eval(config))
    traces = [trace for episode in episodes for trace in episode.traces]
    assert len(traces) == 4 and all(trace.ok for trace in traces), [t.errors for t in traces]
    assert {t.task.data.answer for t in traces} == {"2", "4"}
    for trace in traces:  # dyngen's rubric, and only it, graded each reply
        assert trace.last_reply
        assert set(trace.rewards) == {"dyngen_reward"}
        assert trace.reward == compute_score("dyngen-arithmetic", trace.last_reply,
                                             trace.task.data.answer)
    assert list((tmp_path / "evals").glob("*/traces.jsonl"))  # the run's results, as vf writes
