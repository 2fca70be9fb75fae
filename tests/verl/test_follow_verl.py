"""`dyngen follow` against files written by verl 0.9.1's own code, through a served round.

The metrics file comes from `verl.utils.tracking.FileLogger` (VERL_FILE_LOGGER_PATH), the
rollout dumps from the V1 trainer's own `_dump_generations` / `_write_generations` (a
background thread, `<dir>/<step>.jsonl`), taken from the installed verl source: importing
the trainer module needs GPU-era packages, the two methods need only os, json and numpy.
Prompts are the Qwen3 tokenizer's decoding of each row's chat template, as verl dumps them.
"""

from __future__ import annotations

import ast
import json
import os
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import verl
from verl.utils.tracking import FileLogger

from dyngen.config import load_config
from dyngen.generators.proposer.seeds import seeds_from_rollouts
from dyngen.round.rollouts import RolloutsPolicy
from dyngen.server.local import LocalServer, spawn, stop
from dyngen.store import Store, verify
from tests.e2e.conftest import DYNGEN, REPO, env_for
from tests.e2e.test_triggered_rounds import finished_runs, serving
from tests.rows import verl_rows
from tests.support import server_steps

NAME = "verl-follow"
SAMPLES = 4  # rollouts per step: 2 prompts x 2 responses
DUMP_METHODS = ("_write_generations", "_dump_generations", "_init_dump_executor",
                "_shutdown_dump_executor")


def verl_dumper() -> type:
    """A class holding the V1 trainer's own rollout-dump methods, from verl's source."""
    path = Path(verl.__file__).parent / "trainer" / "ppo" / "v1" / "trainer_base.py"
    source = path.read_text()
    lines = source.splitlines()
    parts = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name in DUMP_METHODS:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            parts.append(textwrap.dedent("\n".join(lines[first - 1:node.end_lineno])))
    assert len(parts) == len(DUMP_METHODS), f"verl's dump methods moved in {path}"
    body = "\n".join(textwrap.indent(p, "    ") for p in parts)
    namespace: dict[str, Any] = {"os": os, "json": json, "np": np,
                                 "ThreadPoolExecutor": ThreadPoolExecutor}
    exec(compile(f"class VerlDumper:\n{body}\n", str(path), "exec"), namespace)  # noqa: S102
    return namespace["VerlDumper"]


class Trainer:
    """The parts of a verl V1 run that write files: its file logger and its rollout dump."""

    def __init__(self, metrics: Path, rollout_dir: Path, tokenizer: Any, rows: list[dict]):
        os.environ["VERL_FILE_LOGGER_PATH"] = str(metrics)
        self.logger = FileLogger("dyngen", "follow")  # mode "wb": a restart truncates
        self.dumper = verl_dumper()()
        self.dumper._init_dump_executor()
        self.rollout_dir, self.tokenizer, self.rows = rollout_dir, tokenizer, rows

    def step(self, step: int, dump_late: bool = False) -> None:
        """One training step: dump its rollouts (in a thread), log its metrics."""
        if not dump_late:
            self._dump(step)
        self.logger.log(data=metrics_of(step), step=step)
        if dump_late:  # the dump thread finishes well after the metrics line
            time.sleep(2.0)
            self._dump(step)

    def validate(self, step: int) -> None:
        """verl's validation before training (or at resume): a line of val-* metrics only."""
        self.logger.log(data={"val-core/math/acc/mean@1": 0.25}, step=step)

    def stop(self) -> None:
        self.dumper._shutdown_dump_executor()
        self.logger.finish()

    def _dump(self, step: int) -> None:
        rows = [self.rows[(2 * step + i // 2) % len(self.rows)] for i in range(SAMPLES)]
        inputs = [self.tokenizer.decode(self.tokenizer.apply_chat_template(
            r["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False),
            skip_special_tokens=True) for r in rows]
        self.dumper.global_steps = step
        self.dumper._dump_generations(
            inputs=inputs, outputs=[f"answer {i}" for i in range(SAMPLES)],
            gts=[r["reward_model"]["ground_truth"] for r in rows],
            scores=[float(i % 2) for i in range(SAMPLES)],
            reward_extra_infos_dict={"uid": [f"u{step}_{i}" for i in range(SAMPLES)]},
            dump_path=str(self.rollout_dir))


def metrics_of(step: int) -> dict[str, Any]:
    """A V1 step's metrics: numpy and Python numbers, as verl logs them."""
    return {"training/global_step": step, "training/epoch": 0,
            "critic/score/mean": np.float32(step / 100), "actor/entropy": 1.5,
            "timing_s/step": 0.1}


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[LocalServer]:
    srv = LocalServer(tmp_path / "prefect").start()
    yield srv
    srv.stop()


def wait_for_state(folder: Path, step: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    path = folder / "follow.json"
    while time.monotonic() < deadline:
        if path.is_file() and json.loads(path.read_text())["last_step"] >= step:
            return
        time.sleep(0.2)
    raise AssertionError(f"follow did not reach step {step}")


def wait_for_covered(store: Store, count: int, log: Path, timeout: float = 900.0) -> None:
    """Until the inbox holds `count` batch ends and versions cover them all."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fresh = Store(store.root)
        if len(fresh.batch_ends(NAME)) >= count and not fresh.pending(NAME):
            return
        time.sleep(0.5)
    raise AssertionError(f"the rounds did not cover {count} batch ends; serve's log:\n"
                         f"{log.read_text()[-3000:]}")


def test_follow_emits_one_batch_end_per_verl_step_with_metrics_and_rollouts(
        own_server: LocalServer, tmp_path: Path, qwen_tokenizer: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYNGEN_OUTBOX", str(tmp_path / "outbox"))
    rows = verl_rows(6)
    store = Store(tmp_path / "store")
    store.create(NAME, rows)
    metrics, rollout_dir = tmp_path / "verl" / "metrics.jsonl", tmp_path / "verl" / "rollouts"
    metrics.parent.mkdir()
    follow_cmd = [*DYNGEN, "--root", str(store.root), "follow", NAME, "--verl-metrics",
                  str(metrics), "--rollout-dir", str(rollout_dir), "--poll-seconds", "0.2",
                  "--run-id", "exp1"]
    env = env_for(own_server, DYNGEN_OUTBOX=str(tmp_path / "outbox"))
    run_folder = store.root / "rollouts" / NAME / "exp1"
    log = tmp_path / "serve.log"
    with serving(own_server, store, NAME, log):
        follow = spawn(follow_cmd, env, tmp_path / "follow.log", cwd=REPO)
        try:
            trainer = Trainer(metrics, rollout_dir, qwen_tokenizer, rows)
            trainer.validate(0)
            for step in range(1, 7):
                trainer.step(step)
            wait_for_state(run_folder, 6)
            stop(follow)  # the follower restarts mid-run: nothing is emitted twice
            for step in range(7, 13):
                trainer.step(step, dump_late=step == 9)
            follow = spawn(follow_cmd, env, tmp_path / "follow.log", cwd=REPO)
            wait_for_state(run_folder, 12)
            trainer.stop()
            # verl restarts from its step-10 checkpoint: the metrics file is truncated, the
            # resumed run validates at step 10, then logs 11 and 12 again, and goes on.
            trainer = Trainer(metrics, rollout_dir, qwen_tokenizer, rows)
            assert metrics.stat().st_size == 0
            trainer.validate(10)
            for step in range(11, 21):
                trainer.step(step, dump_late=step == 16)
            wait_for_state(run_folder, 20)
            trainer.stop()
            wait_for_covered(store, 20, log)
            finished_runs(own_server, NAME, 20, timeout=300)
        finally:
            stop(follow)

    # One batch end per step reached the server and the store's inbox, and the rounds
    # covered each exactly once (a round covers every batch end pending when it starts).
    assert sorted(server_steps(own_server.api_url, NAME, 20)) == list(range(1, 21))
    assert verify(store, NAME) == []
    entries = {e.step: e for e in Store(store.root).batch_ends(NAME)}
    assert sorted(entries) == list(range(1, 21)) and {e.run for e in entries.values()} == \
        {"exp1"}
    covered = [key for rec in store.history(NAME)[1:] for key in rec.covers]
    assert sorted(covered) == [("exp1", s) for s in range(1, 21)]
    questions = {r["prompt"][-1]["content"]: r for r in rows}
    default_rollouts = RolloutsPolicy.from_config(load_config(
        overrides=[f"store.root={store.root}"]))
    for step, entry in entries.items():
        assert entry.metrics["critic/score/mean"] == pytest.approx(step / 100)
        assert entry.metrics["training/global_step"] == step
        assert not any(k.startswith("val-") for k in entry.metrics)
        records = store.read_rollouts(entry)  # from the store: a worker on any host reads it
        assert len(records) == SAMPLES
        for rec in records:  # the dataset's own prompt messages, not verl's decoded text
            row = questions[rec["prompt"][-1]["content"]]
            assert rec["prompt"] == row["prompt"]
            assert rec["ground_truth"] == row["reward_model"]["ground_truth"]
        # The proposer's hard-seed selection reads the step's file, confined to the
        # default folder.
        path = run_folder / f"step-{step:08d}.jsonl"
        assert [json.loads(x) for x in path.read_text().splitlines()] == records
        seeds = seeds_from_rollouts(default_rollouts.read(str(path)), 1)
        assert seeds and seeds[0].question in questions
    follow_log = (tmp_path / "follow.log").read_text()
    assert "truncated or rewritten" in follow_log
