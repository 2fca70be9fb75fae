"""dyngen.trainers.verifiers without a model: the rows as tasks, following, rewards, bad rows.

The eval against a served model is tests/llm/test_verifiers_eval.py.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from pathlib import Path

import pytest
import verifiers.v1 as vf
from verifiers.v1.trace import AgentInfo, TraceTask

from dyngen.errors import ConfigError
from dyngen.store import Store
from dyngen.trainers.verifiers import (
    DyngenHarness,
    DyngenTaskset,
    PinnedDyngenTaskset,
    load_environment,
)
from tests.rows import verl_row, verl_row_with

NAME = "sums"


def rows(start: int, n: int) -> list[dict]:
    return [verl_row(i, "dyngen-arithmetic") for i in range(start, start + n)]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "store")
    store.create(NAME, rows(0, 4))
    return store


def test_rows_become_tasks_with_verifiers_fields(store: Store) -> None:
    env = load_environment(store.root, NAME, follow=False)
    assert isinstance(env.taskset, PinnedDyngenTaskset) and not type(env.taskset).INFINITE
    harness = env.config.agent_harnesses()["agent"]  # one chat turn, no shell, by default
    assert harness.id == "dyngen_verifiers" and DyngenHarness.__mro__[1].__name__ == "NullHarness"
    tasks = list(env.taskset)
    assert [t.data.dyngen_row for t in tasks] == [0, 1, 2, 3]
    row = verl_row(2, "dyngen-arithmetic")
    data = tasks[2].data
    assert [m.model_dump(include={"role", "content"}) for m in data.prompt] == row["prompt"]
    assert data.answer == "4" and data.info == row["extra_info"]
    assert data.data_source == "dyngen-arithmetic" and data.dyngen_version == 0
    assert len({t.key for t in tasks}) == 4  # prime-rl refuses a finite taskset's duplicates


def test_a_version_committed_while_iterating_is_reached_within_a_block(store: Store) -> None:
    env = load_environment(store.root, NAME, block_rows=4)
    assert type(env.taskset).INFINITE  # prime-rl iterates it lazily, never materializes it
    stream = iter(env.taskset)  # as prime-rl's orchestrator does, once, at start
    before = [next(stream).data for _ in range(6)]  # mid-block: 2 of block 2 to come
    assert {d.dyngen_version for d in before} == {0}
    store.append(NAME, rows(100, 2))  # a round commits version 1 during the run
    after = [next(stream).data for _ in range(4)]  # block_rows draws: the documented delay
    assert [d.dyngen_version for d in after] == [0, 0, 1, 1]  # the rest of block 2, then
    assert [d.answer for d in after[2:]] == ["200", "202"]    # the new rows first
    later = [next(stream).data.dyngen_row for _ in range(12)]
    assert set(later) == set(range(6))  # then passes over all six rows


def test_one_version_read_as_it_was(store: Store) -> None:
    store.append(NAME, rows(100, 2))
    env = load_environment(store.root, NAME, version=0, follow=False)
    assert [t.data.answer for t in env.taskset] == ["0", "2", "4", "6"]
    with pytest.raises(ConfigError, match="follow = false"):
        load_environment(store.root, NAME, version=0)


def test_a_row_without_ground_truth_never_locks_the_dataset(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Whatever the store accepts, the environment loads: a row it cannot grade is skipped,
    said once with the first such row and how many, in every reader; only a dataset with
    no gradable row at all fails, saying what to set."""
    caplog.set_level(logging.WARNING, logger="dyngen")
    store = Store(tmp_path / "store")
    store.create("bad", rows(0, 2) + [verl_row_with(2, "dyngen-arithmetic",
                                                      **{"reward_model.ground_truth": None})])
    pinned = load_environment(store.root, "bad", version=0, follow=False)
    assert [t.data.answer for t in pinned.taskset] == ["0", "2"]
    assert "'bad' v0: 1 row(s) have no reward_model.ground_truth (the first: row 2)" \
        in caplog.text
    followed = load_environment(store.root, "bad")  # a restart loads it too
    stream = iter(followed.taskset)
    assert {next(stream).data.answer for _ in range(6)} == {"0", "2"}
    store.create("none", [verl_row_with(i, "dyngen-arithmetic",
                                        **{"reward_model.ground_truth": None})
                          for i in range(2)])
    with pytest.raises(ConfigError) as err:
        load_environment(store.root, "none")
    assert "'none' v0: no row has a reward_model.ground_truth" in str(err.value)
    assert "Set it on the rows" in str(err.value)


def test_a_data_source_nothing_grades_fails_at_load(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.create("mystery", [verl_row(1, "mystery-source")])
    with pytest.raises(ConfigError, match="'mystery-source'.*env.taskset.task.reward.path"):
        load_environment(store.root, "mystery")


def scored(task: vf.Task, reply: str) -> float:
    """The task's rubric run on a trace whose reply is `reply` (verifiers' Task.score)."""
    trace = vf.Trace(task=TraceTask(type=type(task).__name__, data=task.data),
                     agent=AgentInfo(config=vf.AgentConfig()), root_reply=reply)
    asyncio.run(task.score(trace))
    return trace.reward


def test_the_rubric_is_the_rows_reward_or_the_users_compute_score(
        store: Store, tmp_path: Path) -> None:
    from dyngen.generators.exact_match import compute_score

    task = next(iter(load_environment(store.root, NAME, follow=False).taskset))  # truth "0"
    for reply in ("The answer is 0.", "Answer: 7", ""):
        assert scored(task, reply) == compute_score("dyngen-arithmetic", reply, "0")
    (tmp_path / "my_reward.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': len(solution_str) / 10 + extra_info['index']}\n")
    env = load_environment(store.root, NAME, follow=False,
                           reward=str(tmp_path / "my_reward.py"))
    tasks = list(itertools.islice(env.taskset, 2))
    assert [scored(t, "abcd") for t in tasks] == [pytest.approx(0.4), pytest.approx(1.4)]


def test_the_taskset_config_names_its_mistakes(store: Store) -> None:
    with pytest.raises(ConfigError, match="env.taskset.dataset"):
        load_environment(store.root, "")
    with pytest.raises(ConfigError, match="block_rows"):
        load_environment(store.root, NAME, block_rows=0)
    assert issubclass(PinnedDyngenTaskset, DyngenTaskset)


def test_a_users_environment_module_loads_through_verifiers_own_loader(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from verifiers.v1.utils.loaders import load_environment as vf_load_environment
    from verifiers.v1.utils.loaders import resolve_env_config

    # docs/trainers/verifiers.md's module, found by its id as prime-rl's env servers find it
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2] / "examples" / "my_dyngen_env"))
    config = resolve_env_config({
        "taskset": {"id": "my_dyngen_env", "root": str(store.root), "dataset": NAME},
        "agent": {"runtime": {"type": "subprocess"}}})
    env = vf_load_environment(config)
    assert type(env.taskset) is DyngenTaskset and type(env.taskset).INFINITE
    assert config.agent_harnesses()["agent"].id == "my_dyngen_env"  # DyngenHarness
    assert next(iter(env.taskset)).data.data_source == "dyngen-arithmetic"


def test_a_missing_uv_fails_loudly_or_the_one_beside_python_is_used(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verifiers' subprocess runtime needs `uv` (without it every rollout scores 0 and
    `vf eval` still exits 0): PATH without one takes the venv's; with none, load fails."""
    import os
    import sys

    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    load_environment(store.root, NAME)  # uv beside this Python (dyngen[verifiers] has it)
    assert os.environ["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(sys, "executable", str(empty / "python"))
    with pytest.raises(ConfigError, match="runs the chat program through `uv`: expected it on "
                                          "PATH or beside this Python"):
        load_environment(store.root, NAME)
    # A runtime of the user's own (docker, Prime's sandbox) is not this machine's concern.
    load_environment(store.root, NAME, agent={"runtime": {"type": "docker"}})
