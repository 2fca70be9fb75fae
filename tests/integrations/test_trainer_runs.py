"""Every trainer path records its batch ends in the store under its training run's identity:
the dataset's on_batch_end (emit and inline), TRL's callback, `dyngen follow` for verl and
prime-rl. The server is away (`no_server`): the event only wakes a round, so the tests read
the store's inbox, which is what a round covers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import dyngen.trainers.inbox_write as inbox_write
from dyngen.store import Store
from dyngen.trainers.dataset import DyngenDataset
from dyngen.trainers.prime_rl_follow import PrimeRLFollower
from dyngen.trainers.rollouts import event_id_for
from dyngen.trainers.verl_follow import VerlFollower
from tests.integrations.prime_rl_files import PrimeRLRun
from tests.integrations.test_follow import line
from tests.rows import verl_rows

NAME = "runs"


@pytest.fixture(autouse=True)
def no_run_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(inbox_write.RUN_ENV, raising=False)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "store")
    store.create(NAME, verl_rows(3))
    return store


def keys(store: Store) -> list[tuple[str, int]]:
    """(run, step) of the dataset's inbox entries, read by another Store."""
    return [e.key for e in Store(store.root).batch_ends(NAME)]


def test_the_dataset_records_its_run_then_emits(store: Store, no_server: None) -> None:
    ds = DyngenDataset(store.root, NAME, run="job-1")
    rollouts = [{"prompt": "What is 1 + 1?", "score": 1.0, "ground_truth": "2"}]
    first = ds.on_batch_end(step=4, metrics={"score/mean": 0.5}, rollouts=rollouts)
    assert keys(store) == [("job-1", 4)]
    entry = Store(store.root).batch_end(NAME, "job-1", 4)
    assert entry is not None and entry.event_id == first  # the id the trainer was given
    assert dict(entry.metrics) == {"score/mean": 0.5}
    assert Store(store.root).read_rollouts(entry) == rollouts  # rows travel in the store
    ds.on_batch_end(step=5, run="job-2")  # a run given per batch wins
    assert keys(store) == [("job-1", 4), ("job-2", 5)]


def test_an_inline_round_runs_for_the_batch_end_recorded_first(
        store: Store, no_server: None) -> None:
    seen: list[dict[str, Any]] = []

    def round_runner(dataset: str, *, config: Any, trigger: dict[str, Any]) -> dict[str, Any]:
        seen.append({"trigger": trigger, "entry": Store(store.root).batch_end(
            dataset, trigger["run"], trigger["step"])})
        return {"version": 0}

    config = {"data": {"datagen": {"path": "pkg://tests.flows.gens", "name": "UsesContext"}}}
    ds = DyngenDataset(store.root, NAME, mode="inline", config=config,
                       round_runner=round_runner, run="job-1")
    ds.on_batch_end(step=1, metrics={"score": 0.5})
    ds.on_batch_end(step=1, metrics={"score": 0.7})  # resumed: step 1 again
    first, again = seen
    assert first["entry"] is not None and first["trigger"]["run"] == "job-1"
    assert first["entry"].event_id == first["trigger"]["event_id"]
    # The re-sent step's round is the first one's (same event id: its idempotency key).
    assert again["trigger"]["event_id"] == first["trigger"]["event_id"]
    assert again["trigger"]["metrics"] == {"score": 0.5}
    assert keys(store) == [("job-1", 1)]


def test_the_trl_callback_records_under_its_run(store: Store, tmp_path: Path,
                                                no_server: None) -> None:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from dyngen.trainers.trl import DyngenCallback

    args = TrainingArguments(output_dir=str(tmp_path / "grpo-out"), report_to=[],
                             run_name="grpo-7")
    state = TrainerState()
    callback = DyngenCallback(store.root, NAME)
    callback.on_train_begin(args, state, TrainerControl())
    run = json.loads((tmp_path / "grpo-out" / "dyngen-run.json").read_text())["run_id"]
    assert run.startswith("grpo-7-")  # TRL's run name, and a suffix this fresh run drew
    for step in (1, 2):
        state.global_step = step
        callback.on_log(args, state, TrainerControl(), logs={"loss": 0.5})
    # Resumed from its step-1 checkpoint: the same run, step 2 logged again, then 3.
    resumed = DyngenCallback(store.root, NAME)
    state.global_step = 1
    resumed.on_train_begin(args, state, TrainerControl())
    assert resumed.run_id == run
    for step in (2, 3):
        state.global_step = step
        resumed.on_log(args, state, TrainerControl(), logs={"loss": 0.4})
    assert keys(store) == [(run, 1), (run, 2), (run, 3)]
    assert [e.event_id for e in Store(store.root).batch_ends(NAME)] == \
        [event_id_for(run, s) for s in (1, 2, 3)]
    # The resumed run's step 2 was asked for again: the first batch end's id, nothing new.
    assert resumed.results == {2: event_id_for(run, 2), 3: event_id_for(run, 3)}
    # The first one's metrics are kept (with the rows a plain Trainer draws before its next
    # round: per-device batch 8 x 1 step).
    assert dict(store.batch_end(NAME, run, 2).metrics) == {"loss": 0.5,
                                                           "dyngen/rows_wanted": 8.0}


def test_the_verl_follower_records_under_its_run(store: Store, tmp_path: Path,
                                                 no_server: None) -> None:
    metrics = tmp_path / "my_project" / "exp-9.jsonl"  # verl: <project>/<experiment>.jsonl
    metrics.parent.mkdir()
    metrics.write_text(line(1) + line(2))
    follower = VerlFollower(store.root, NAME, metrics, settle_seconds=0.0, store=store)
    assert follower.poll() == 2
    run = str(follower.run_id)
    assert run.startswith(f"{NAME}-exp-9-")  # the experiment's name, and its file's path
    assert keys(store) == [(run, 1), (run, 2)]
    assert store.batch_end(NAME, run, 2).metrics["critic/score/mean"] == 0.2
    named = VerlFollower(store.root, NAME, metrics, settle_seconds=0.0, run_id="given")
    assert named.poll() == 2
    assert sorted(keys(store)) == sorted([(run, 1), (run, 2), ("given", 1), ("given", 2)])


def test_the_prime_rl_follower_records_under_its_output_dirs_run(
        store: Store, tmp_path: Path, no_server: None) -> None:
    run_files = PrimeRLRun(tmp_path / "rl-run-3")
    for step in (0, 1):
        run_files.log_metrics({"progress/rollouts": 0, "step": step}, step)
    follower = PrimeRLFollower(store.root, NAME, run_files.metrics, with_rollouts=False)
    assert follower.poll() == 2
    assert str(follower.run_id).startswith(f"{NAME}-rl-run-3-")
    assert keys(store) == [(str(follower.run_id), 0), (str(follower.run_id), 1)]
