"""The verl follower, file by file: partial lines, truncation, restarts, late rollout dumps.

The server is away (the `no_server` fixture): every batch end is read back from the
dataset's inbox in the store, which is what a round covers. The end-to-end run against verl 0.9.1's
own writers and a served round is tests/verl/test_follow_verl.py.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from dyngen.errors import ConfigError
from dyngen.store import Store
from dyngen.trainers.rollouts import event_id_for
from dyngen.trainers.verl_files import MetricsTail
from dyngen.trainers.verl_follow import VerlFollower, trigger_metrics
from tests.rows import verl_rows

NAME = "follow-unit"


def line(step: int, **metrics: Any) -> str:
    """One line as verl's FileLogger writes it."""
    data = {"training/global_step": step, "critic/score/mean": step / 10, **metrics}
    return json.dumps({"step": step, "data": data}) + "\n"


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "store")
    store.create(NAME, verl_rows(3))
    return store


def recorded(store: Store) -> list[Any]:
    """The batch ends the follower recorded in the dataset's inbox, by step (the truth: the
    events it sends only wake rounds)."""
    return sorted(store.batch_ends(NAME), key=lambda e: e.step)


def follower(store: Store, metrics: Path, **kwargs: Any) -> VerlFollower:
    return VerlFollower(store.root, NAME, metrics, run_id="run-1", settle_seconds=0.0,
                        **kwargs)


def test_tail_waits_for_a_partial_line_and_rereads_a_rewritten_file(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    tail = MetricsTail(path)
    assert tail.read() == []  # not there yet
    path.write_text(line(1) + line(2)[:10])
    assert [r["step"] for r in tail.read()] == [1]
    with open(path, "a") as fh:
        fh.write(line(2)[10:])
    assert [r["step"] for r in tail.read()] == [2]
    path.write_text(line(5, extra=1.0) + line(6) + line(7))  # restarted: longer than before
    assert [r["step"] for r in tail.read()] == [5, 6, 7] and tail.restarts == 1
    path.write_text(line(8))  # shorter than before
    assert [r["step"] for r in tail.read()] == [8] and tail.restarts == 2


def test_one_batch_end_per_training_step_across_restarts(
        store: Store, tmp_path: Path, no_server: None) -> None:
    metrics = tmp_path / "m.jsonl"
    metrics.write_text(json.dumps({"step": 0, "data": {"val-core/acc": 0.1}}) + "\n"
                       + line(1) + line(2) + "not json\n" + line(3))
    first = follower(store, metrics)
    assert first.poll() == 3
    assert [e.step for e in recorded(store)] == [1, 2, 3]
    assert [e.event_id for e in recorded(store)] == [event_id_for("run-1", s) for s in (1, 2, 3)]
    assert recorded(store)[0].metrics == {"training/global_step": 1.0, "critic/score/mean": 0.1}
    assert {e.run for e in recorded(store)} == {"run-1"}
    # The follower restarts, then the trainer restarts from step 2 (the file is truncated).
    again = follower(store, metrics)
    assert again.poll() == 0
    metrics.write_text(json.dumps({"step": 2, "data": {"val-core/acc": 0.2}}) + "\n"
                       + line(3) + line(4))
    assert again.poll() == 1
    assert [e.step for e in recorded(store)] == [1, 2, 3, 4]


def test_every_n_steps_and_a_bad_setting(store: Store, tmp_path: Path, no_server: None) -> None:
    metrics = tmp_path / "m.jsonl"
    metrics.write_text("".join(line(s) for s in range(1, 7)))
    assert follower(store, metrics, every_n_steps=3).poll() == 2
    assert [e.step for e in recorded(store)] == [3, 6]
    with pytest.raises(ConfigError, match="every-n-steps"):
        follower(store, metrics, every_n_steps=0)


def test_rollouts_are_awaited_then_converted_or_skipped(
        store: Store, tmp_path: Path, no_server: None,
        caplog: pytest.LogCaptureFixture) -> None:
    metrics, dumps = tmp_path / "m.jsonl", tmp_path / "dumps"
    dumps.mkdir()
    metrics.write_text(line(1) + line(2))
    f = follower(store, metrics, rollout_dir=dumps, rollout_wait_seconds=1.0)
    assert f.poll() == 0  # step 1's dump is not there: step 2 waits behind it
    decoded = "system\nSolve the problem.\nuser\nWhat is 1 + 1?\nassistant\n"
    (dumps / "2.jsonl").write_text(
        json.dumps({"input": decoded, "output": "2", "gts": "2", "score": 1.0, "step": 2})
        + "\n" + json.dumps({"input": "user\nan unknown task\nassistant\n", "output": "?",
                             "gts": None, "score": 0.0, "step": 2}) + "\n")
    caplog.set_level(logging.WARNING)
    time.sleep(1.1)
    assert f.poll() == 2
    one, two = recorded(store)
    assert one.step == 1 and one.rollouts is None
    assert "step 1's rollouts" in caplog.text and "without rollouts" in caplog.text
    records = store.read_rollouts(two)  # in the store: a round on any host reads them
    assert records[0] == {"prompt": verl_rows(3)[1]["prompt"], "score": 1.0,
                          "ground_truth": "2"}
    assert records[1]["prompt"] == "user\nan unknown task\nassistant\n"  # kept, and said
    assert "1 of 2 rollouts of step 2 match no prompt" in caplog.text


def write_dump(dumps: Path, step: int, groups: list[list[float]]) -> None:
    """A step's rollout dump: one prompt per group, one line per sample, as verl dumps it."""
    with open(dumps / f"{step}.jsonl", "w") as fh:
        for i, scores in enumerate(groups):
            for score in scores:
                fh.write(json.dumps({"input": f"user\ntask {i}\nassistant\n", "output": "x",
                                     "gts": "1", "score": score, "step": step}) + "\n")


def test_each_batch_end_carries_the_dumps_reward_spread_and_daposs_evicted_groups(
        store: Store, tmp_path: Path, no_server: None) -> None:
    metrics, dumps = tmp_path / "m.jsonl", tmp_path / "dumps"
    dumps.mkdir()
    many = {f"timing_s/t{i:03d}": 1.0 for i in range(300)}
    metrics.write_text(line(1) + line(2, **{"training/filter_groups/evicted_samples": 2.0,
                                            "training/filter_groups/discarded_surplus_samples":
                                            1.0}) + line(3, **many))
    write_dump(dumps, 1, [[1, 1, 1, 1], [0, 1, 0, 1], [0, 0, 0, 0], [1, 0, 0, 0]])
    write_dump(dumps, 2, [[1, 0], [1, 1]])  # DAPO left 2 groups without and 1 with a spread out
    write_dump(dumps, 3, [[1, 0]])
    assert follower(store, metrics, rollout_dir=dumps).poll() == 3
    one, two, three = (e.metrics for e in recorded(store))
    assert one["dyngen/zero_spread_share"] == 0.5  # all 1s, all 0s: 2 of 4
    assert one["dyngen/reward_spread"] == pytest.approx((0.57735 + 0.5) / 4, abs=1e-5)
    assert two["dyngen/zero_spread_share"] == pytest.approx(3 / 5)
    assert two["dyngen/reward_spread"] == pytest.approx(0.70711 / 2, abs=1e-5)
    assert len(three) == 256 and three["dyngen/zero_spread_share"] == 0.0
    # What verl drew for the step, the next round's minimum: DAPO's left-out groups count.
    assert (one["dyngen/rows_wanted"], two["dyngen/rows_wanted"]) == (4.0, 5.0)
    assert three["dyngen/rows_wanted"] == 1.0
    assert three["critic/score/mean"] == 0.3  # the reward-like metrics still first


def test_rows_wanted_is_the_steps_prompts_times_the_steps_to_the_next_round(
        store: Store, tmp_path: Path, no_server: None) -> None:
    metrics, dumps = tmp_path / "m.jsonl", tmp_path / "dumps"
    dumps.mkdir()
    metrics.write_text("".join(line(s) for s in range(1, 5)))
    for step in (2, 4):
        write_dump(dumps, step, [[1, 0]] * 3)
    with open(dumps / "4.jsonl", "a") as fh:  # task 0 again, in a second group: one row
        fh.write(json.dumps({"input": "user\ntask 0\nassistant\n", "score": 1}) + "\n")
    assert follower(store, metrics, rollout_dir=dumps, every_n_steps=2).poll() == 2
    assert [e.metrics["dyngen/rows_wanted"] for e in recorded(store)] == [6.0, 6.0]
    # Without a dump there is nothing to count: the round falls back to its own minimum.
    metrics.write_text(metrics.read_text() + line(5))
    (dumps / "5.jsonl").unlink(missing_ok=True)
    assert follower(store, metrics).poll() == 1
    assert "dyngen/rows_wanted" not in recorded(store)[-1].metrics


def test_a_step_with_many_metrics_keeps_the_reward_like_ones() -> None:
    data = {f"timing_s/t{i:03d}": 1.0 for i in range(300)}
    data.update({"critic/score/mean": 0.5, "critic/rewards/mean": 0.4, "flag": True,
                 "name": "x", "nan": float("nan")})
    kept = trigger_metrics(data)
    assert len(kept) == 256
    assert kept["critic/score/mean"] == 0.5 and kept["critic/rewards/mean"] == 0.4
    assert not {"flag", "name", "nan"} & set(kept)


def test_follow_needs_an_existing_dataset(tmp_path: Path) -> None:
    from dyngen.errors import DatasetNotFoundError

    with pytest.raises(DatasetNotFoundError):
        VerlFollower(tmp_path / "store", "absent", tmp_path / "m.jsonl")


@pytest.mark.parametrize("decoded", [
    "system\nSolve the problem.\nuser\nWhat is 2 + 2?\nassistant\n",  # Qwen, SmolLM
    "system\n\nSolve the problem.user\n\nWhat is 2 + 2?assistant\n\n",  # Llama 3
    "[INST] Solve the problem.\n\nWhat is 2 + 2? [/INST]",  # Mistral
])
def test_decoded_prompts_of_common_templates_map_back_to_the_row(
        store: Store, decoded: str) -> None:
    from dyngen.trainers.rollouts import PromptIndex

    index = PromptIndex(store, NAME)
    index.refresh()
    assert index.lookup(decoded) == (verl_rows(3)[2]["prompt"], "4")
    assert index.lookup("user\nWhat is 22 + 2?\nassistant") is None  # a prefix is no match


def test_dyngen_follow_prints_one_line_per_step(store: Store, tmp_path: Path,
                                                 no_server: None) -> None:
    import os
    import signal
    import subprocess
    import sys

    metrics = tmp_path / "m.jsonl"
    metrics.write_text(line(1) + line(2))
    proc = subprocess.Popen(
        [sys.executable, "-m", "dyngen.cli", "--root", str(store.root), "follow", NAME,
         "--verl-metrics", str(metrics), "--run", "r", "--poll-seconds", "0.05"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": ""}, start_new_session=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        while not any(x.startswith("step 2:") for x in lines):  # as each step is emitted
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            lines.append(proc.stdout.readline())
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    steps = [x.strip() for x in lines if x.startswith("step ")]
    assert steps == [f"step {s}: batch end recorded in the store, no rollouts; event not sent"
                     for s in (1, 2)], lines
    assert [e.step for e in recorded(store)] == [1, 2]
