"""`dyngen follow --prime-rl-metrics` over files in prime-rl's format (tests/integrations/
prime_rl_files.py writes them as prime-rl's FileMonitor does: prime-rl needs GPUs).

The server is away (`no_server`), so every batch end waits in the outbox, where the test
reads exactly what would be delivered, as tests/integrations/test_follow.py does for verl.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dyngen.errors import ConfigError
from dyngen.store import Store
from dyngen.trainers.prime_rl_follow import PrimeRLFollower
from dyngen.trainers.rollouts import event_id_for
from dyngen.trainers.verifiers import task_data
from tests.integrations.prime_rl_files import PrimeRLRun, episode
from tests.integrations.test_follow import NAME, recorded  # the verl follower's, reused
from tests.rows import verl_rows
from tests.support import as_a_terminal_job


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """A store holding NAME: three verl rows."""
    store = Store(tmp_path / "store")
    store.create(NAME, verl_rows(3))
    return store


def step_episodes(store: Store, step: int) -> list[Any]:
    """Two episodes of rows 1 and 2, the second scored 0, one failed trace left out."""
    data = store.load(NAME)
    one, two = (task_data(data[i], 0, i) for i in (1, 2))
    assert one is not None and two is not None
    return [episode(one, 1.0, step), episode(two, 0.0, step), episode(two, 1.0, step, ok=False)]


def test_one_batch_end_per_step_with_metrics_and_rollouts_across_restarts(
        store: Store, tmp_path: Path, no_server: None) -> None:
    run = PrimeRLRun(tmp_path / "outputs")
    run.eval_step(0)  # an evaluation before training: no batch ended
    for step in (0, 1):
        run.train_step(step, step_episodes(store, step))
    follower = PrimeRLFollower(store.root, NAME, run.metrics, run_id="r")
    assert follower.poll() == 2
    first = recorded(store)  # the batch ends in the dataset's inbox, by step
    assert [e.step for e in first] == [0, 1] and {e.run for e in first} == {"r"}
    assert [e.event_id for e in first] == [event_id_for("r", s) for s in (0, 1)]
    assert first[0].metrics == {"train/agg/reward/mean": pytest.approx(2 / 3),
                                "progress/rollouts": 3.0, "time/step": 1.5}
    records = store.read_rollouts(first[1])  # in the store: a round on any host reads them
    rows = verl_rows(3)
    assert records == [  # the dataset's own prompts and truths, the failed trace left out
        {"prompt": rows[1]["prompt"], "score": 1.0, "ground_truth": "2"},
        {"prompt": rows[2]["prompt"], "score": 0.0, "ground_truth": "4"}]
    # The follower restarts; prime-rl resumes from its step-0 checkpoint and logs step 1
    # again (its metrics file is appended to), then step 2.
    again = PrimeRLFollower(store.root, NAME, run.metrics, run_id="r")
    assert again.poll() == 0
    run.eval_step(1)
    run.train_step(1, step_episodes(store, 1))
    run.train_step(2, step_episodes(store, 2))
    assert again.poll() == 1
    assert [e.step for e in recorded(store)] == [0, 1, 2]


def test_a_step_without_episodes_is_emitted_without_rollouts(
        store: Store, tmp_path: Path, no_server: None,
        caplog: pytest.LogCaptureFixture) -> None:
    run = PrimeRLRun(tmp_path / "outputs")
    run.log_metrics({"progress/rollouts": 0, "step": 3}, 3)  # --no-monitors.file episodes
    assert PrimeRLFollower(store.root, NAME, run.metrics, run_id="r").poll() == 1
    assert recorded(store)[0].rollouts is None and "no episodes file" in caplog.text


def test_follow_takes_one_trainer_file(tmp_path: Path, store: Store) -> None:
    run = PrimeRLRun(tmp_path / "outputs")
    base = [sys.executable, "-m", "dyngen.cli", "--root", str(store.root), "follow", NAME]
    both = subprocess.run(base + ["--prime-rl-metrics", str(run.metrics), "--verl-metrics",
                                  str(run.metrics)], capture_output=True, text=True, timeout=60)
    assert both.returncode != 0 and "expected one of --verl-metrics" in both.stderr + both.stdout
    proc = subprocess.Popen(base + ["--prime-rl-metrics", str(run.metrics)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=as_a_terminal_job)
    try:
        deadline = time.monotonic() + 60
        line = ""
        while "following" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline() if proc.stdout else ""
        assert "following" in line and proc.poll() is None  # tailing prime-rl's file
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


def test_the_follower_refuses_a_missing_dataset(tmp_path: Path) -> None:
    from dyngen.errors import DatasetNotFoundError

    with pytest.raises(DatasetNotFoundError):
        PrimeRLFollower(tmp_path / "store", "absent", tmp_path / "metrics.jsonl")
    with pytest.raises(ConfigError, match="every-n-steps"):
        Store(tmp_path / "s2").create("x", verl_rows(1))
        PrimeRLFollower(tmp_path / "s2", "x", tmp_path / "m.jsonl", every_n_steps=0)
