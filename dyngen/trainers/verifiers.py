"""A dyngen dataset as a verifiers (v1) environment that prime-rl trains on and `vf eval` runs.

verifiers 0.4 is its v1 stack alone (`verifiers.v1`: a *taskset* yields typed tasks, a
*harness* plays each one; the v0 `SingleTurnEnv`/`Rubric` over a `datasets.Dataset` is
gone). verifiers finds a taskset by a top-level module's name (a dotted id is not
looked up), whose `__all__` exports one `Taskset` subclass and, optionally, one `Harness`:
a user's environment package re-exports `DyngenTaskset` and `DyngenHarness` (docs:
trainers/verifiers.md), and `load_environment` registers this module as
`dyngen_verifiers` in its own process. Each row becomes a `DyngenTask` whose
data is verl's row mapped to verifiers' fields (`prompt` as is, `reward_model.ground_truth`
→ `answer`, `extra_info` → `info`), and whose one reward is the dataset's own reward in
verl's form, chosen by `data_source` as the solve-rate stage chooses it
(dyngen.filters.solve_rate.rewards) or named by `reward`.

Following new versions: prime-rl's orchestrator loads a taskset once, at start; a finite
one is materialized (`list(taskset)`) and cycled, an `INFINITE` one is iterated lazily,
one task per dispatched rollout group (prime_rl/orchestrator/envs.py `Env.start`,
curriculum/samplers/standard.py). So with `follow` (the default) the taskset is infinite:
it streams the newest committed version (dyngen.trainers.row_stream), looking at the head
every `block_rows` tasks, rows committed meanwhile first. `follow=False` is a finite
taskset over one version (`version`, else the head when it is first iterated).

Needs `pip install 'dyngen[verifiers]'`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys
from collections.abc import Iterator, Mapping
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import verifiers.v1 as vf
from pydantic import BaseModel
from verifiers.v1.harnesses.null import NullHarness

from dyngen.difficulty.frontier import sampler_of
from dyngen.difficulty.record import DIFFICULTY_COLUMN
from dyngen.errors import ConfigError
from dyngen.filters.solve_rate.rewards import RewardChooser, score_of
from dyngen.locations import store_root as store_root_of
from dyngen.store import Store
from dyngen.trainers.row_stream import RowStream

logger = logging.getLogger(__name__)

# The id `load_environment` gives its taskset: this module, under a top-level name.
TASKSET_ID = "dyngen_verifiers"
REWARD_KEY = "env.taskset.task.reward"
TRUTH_KEY = "reward_model.ground_truth"
# load_environment passes them on
TASKSET_KEYS = ("block_rows", "seed", "system_prompt", "sampler", "sampler_group")


class RewardFunctionConfig(BaseModel):
    """A reward function in verl's form, `compute_score(data_source, solution_str,
    ground_truth, extra_info) -> float | {"score": float, ...}` (as verl's
    `custom_reward_function.path` / `.name`)."""

    path: str
    """A .py file or `pkg://module`."""
    name: str = "compute_score"
    """The function's name in it."""


class DyngenTaskConfig(vf.TaskConfig):
    """How each task is graded: the named reward, else dyngen's own by data_source."""

    reward: RewardFunctionConfig | None = None
    """The reward for every row; None: each row's data_source picks it, as the
    solve-rate stage does (dyngen-arithmetic, code tasks, reasoning_gym/, verl's own)."""


class DyngenTaskData(vf.TaskData):
    """One dataset row: verifiers' prompt, answer and info, and where the row is."""

    answer: Any = None
    """The row's `reward_model.ground_truth`, as the reward function receives it."""
    info: dict[str, Any] = {}
    """The row's `extra_info`."""
    data_source: str = ""
    """The row's `data_source`: which reward grades it."""
    dyngen_version: int | None = None
    """The version the row was read from."""
    dyngen_row: int | None = None
    """The row's index in that version (an appended version keeps every older row's)."""


class DyngenTask(vf.Task[DyngenTaskData, vf.State, DyngenTaskConfig]):
    """A row of a dyngen dataset, graded by the dataset's reward."""

    @vf.reward
    async def dyngen_reward(self, task: DyngenTaskData, trace: vf.Trace) -> float:
        """The reward function's score of the reply (a sandboxed one runs off the loop)."""
        return await asyncio.to_thread(grade, self.config, task, trace.last_reply)


def grade(config: DyngenTaskConfig, task: DyngenTaskData, reply: str) -> float:
    """The score the row's reward function gives `reply`, called as verl calls it."""
    reward = config.reward
    choice = _chooser(reward.path if reward else None,
                      reward.name if reward else "compute_score").for_source(
        task.data_source, {"reward_model": {"ground_truth": task.answer},
                           "extra_info": task.info})
    return score_of(choice.function(data_source=task.data_source, solution_str=reply,
                                    ground_truth=task.answer, extra_info=dict(task.info)),
                    choice.label)


@cache
def _chooser(path: str | None, name: str) -> RewardChooser:
    """One chooser per reward setting and process: each function is imported once."""
    return RewardChooser(path, name, key=REWARD_KEY)


class DyngenTasksetConfig(vf.TasksetConfig):
    """Which dataset, which version, and whether to follow new ones."""

    root: str = ""
    """The store root (a folder or a URL); empty: $DYNGEN_STORE, else ./dyngen_store."""
    dataset: str = ""
    """The dataset's name in the store."""
    version: int | None = None
    """A version to read (only without `follow`); None: the head."""
    follow: bool = True
    """Follow the newest version while training runs (an infinite taskset)."""
    block_rows: int = 16
    """With `follow`, tasks drawn between two looks at the head."""
    seed: int = 0
    """Seeds the order of each pass over the rows."""
    sampler: str = "fresh_first"
    """With `follow`: fresh_first (new rows first, then seeded passes) or frontier (drawn by
    each row's difficulty record, dyngen.difficulty.frontier)."""
    sampler_group: int = 8
    """The frontier sampler's group: completions per task the trainer samples."""
    task: DyngenTaskConfig = DyngenTaskConfig()


class DyngenTaskset(vf.Taskset[DyngenTask, DyngenTasksetConfig]):
    """The rows of a dyngen dataset as tasks: the newest version's, or one version's."""

    INFINITE = True

    def __new__(cls, config: DyngenTasksetConfig | None = None) -> DyngenTaskset:
        # prime-rl reads INFINITE off the class (`type(taskset).INFINITE`), so one
        # version's finite taskset is an instance of the finite subclass.
        follow = config is None or config.follow
        target = cls if follow or cls is not DyngenTaskset else PinnedDyngenTaskset
        return super().__new__(target)

    def __init__(self, config: DyngenTasksetConfig) -> None:
        if not config.dataset:
            raise ConfigError("env.taskset.dataset: expected the name of a dyngen dataset, "
                              "found none. Set it (and env.taskset.root to the store).")
        if config.version is not None and config.follow:
            raise ConfigError(f"env.taskset.version={config.version} with follow: a followed "
                              "dataset reads the newest version. Set follow = false to read "
                              "that one version.")
        if config.block_rows < 1:
            raise ConfigError(f"env.taskset.block_rows: expected an integer >= 1, found "
                              f"{config.block_rows}.")
        super().__init__(config)

    @property
    def store(self) -> Store:
        """The store the rows come from."""
        return Store(store_root_of(self.config.root or None))

    def check(self) -> int:
        """The version read first, once some row of it has a ground truth (rows without
        one are skipped, said once); its data sources' rewards load."""
        store, name = self.store, self.config.dataset
        version = store.head(name).version if self.config.version is None \
            else self.config.version
        data = store.load(name, version)
        missing_truth(data, name, version)
        reward = self.config.task.reward
        chooser = _chooser(reward.path if reward else None,
                           reward.name if reward else "compute_score")
        if chooser.configured() is None and "data_source" in data.column_names:
            sources = data.unique("data_source")
            chooser.check({"data_source": s} for s in sources)
        return version

    def load(self) -> Iterator[DyngenTask]:
        """The followed stream: fresh rows first, then seeded passes, forever."""
        self.check()
        sampler = sampler_of(self.config.sampler)
        if sampler is not None:
            sampler = replace(sampler, group=self.config.sampler_group)
        stream = RowStream(self.store.root, self.config.dataset, self.config.seed,
                           self.config.block_rows, None, one_reader=True, sampler=sampler)
        for _, _, version, index, row in stream.positioned():
            task = self._task(row, version, index)
            if task is not None:
                yield task

    def _task(self, row: Mapping[str, Any], version: int, index: int) -> DyngenTask | None:
        data = task_data(row, version, index)
        if data is None:
            logger.warning("dyngen: %r v%d row %d has no %s; skipped (set it on the row)",
                           self.config.dataset, version, index, TRUTH_KEY)
            return None
        return DyngenTask(data, self.config.task)


class PinnedDyngenTaskset(DyngenTaskset):
    """One version's rows, in order, once: a finite taskset (`follow = false`)."""

    INFINITE = False

    def load(self) -> Iterator[DyngenTask]:
        """Every row of the version, in stored order."""
        version = self.check()
        data = self.store.load(self.config.dataset, version)
        prompt_key = self.store.record(self.config.dataset, version).prompt_key
        for index in range(len(data)):
            row = data[index]
            if prompt_key != "prompt" and prompt_key in row:
                row["prompt"] = row[prompt_key]
            task = self._task(row, version, index)
            if task is not None:
                yield task


def task_data(row: Mapping[str, Any], version: int, index: int) -> DyngenTaskData | None:
    """verl's row as verifiers' task data; None when it has no ground truth."""
    truth = (row.get("reward_model") or {}).get("ground_truth")
    if truth is None:
        return None
    prompt = [{"role": str(m["role"]), "content": str(m["content"])} for m in row["prompt"]]
    info = dict(row["extra_info"]) if isinstance(row.get("extra_info"), Mapping) else {}
    if isinstance(row.get(DIFFICULTY_COLUMN), Mapping):  # drawn by the frontier sampler
        info["dyngen_difficulty"] = dict(row[DIFFICULTY_COLUMN])
    return DyngenTaskData(prompt=prompt, answer=truth, info=info,
                          data_source=str(row.get("data_source") or ""),
                          id=f"{version}:{index}", dyngen_version=version, dyngen_row=index)


_SAID: set[tuple[str, int]] = set()  # (dataset, version)s whose skipped rows were named


def missing_truth(data: Any, dataset: str, version: int) -> None:
    """Rows without a ground truth are skipped by every reader (the stream and one version's
    taskset): say so once, naming the first and how many; a ConfigError only when no row
    has one (nothing could be graded)."""
    if "reward_model" not in data.column_names:
        raise ConfigError(f"{dataset!r} v{version} has no reward_model column; expected "
                          f"{TRUTH_KEY} on every row (the task's answer). Set it on the rows.")
    column = data.with_format("arrow")["reward_model"]
    missing, first = 0, -1
    for offset, chunk in enumerate_chunks(column):
        if chunk.type.get_field_index("ground_truth") < 0:
            valid = pc.is_valid(pa.nulls(len(chunk)))
        else:  # rows without reward_model at all are null here too
            valid = pc.and_kleene(chunk.is_valid(), chunk.field("ground_truth").is_valid())
        bad = len(chunk) - pc.sum(pc.cast(valid, "int64")).as_py() if len(chunk) else 0
        if bad and first < 0:
            first = offset + pc.index(valid, False).as_py()
        missing += bad
    if missing and missing == len(data):
        raise ConfigError(
            f"{dataset!r} v{version}: no row has a {TRUTH_KEY} (the answer the reward grades "
            f"against; the first is row {first}). Set it on the rows (a round that writes it, "
            "or `dyngen import` of a fixed file), then load the environment again.")
    if missing and (dataset, version) not in _SAID:
        _SAID.add((dataset, version))
        logger.warning("dyngen: %r v%d: %d row(s) have no %s (the first: row %d); every "
                       "reader skips them, the rest train. Set it on those rows (a round "
                       "that writes it) to use them.", dataset, version, missing, TRUTH_KEY,
                       first)


def enumerate_chunks(column: Any) -> Iterator[tuple[int, Any]]:
    """(offset of the chunk's first row, chunk) over a chunked Arrow column."""
    offset = 0
    for chunk in column.chunks:
        yield offset, chunk
        offset += len(chunk)


class DyngenHarness(NullHarness):
    """The default seat for a dyngen taskset: one chat turn, no tools (verifiers' null
    harness); pin another with `[env.agent.harness] id = ...`."""


def uv_on_path() -> None:
    """verifiers' subprocess runtime runs its chat program through `uv`, and without one on
    PATH tries to download it (no network: every rollout then fails and scores 0, and
    `vf eval` still exits 0). Use the one installed beside this Python (dyngen[verifiers]
    brings it) when PATH has none; with neither, a ConfigError saying what to install."""
    if shutil.which("uv"):
        return
    beside = Path(sys.executable).parent / "uv"
    if beside.is_file() and os.access(beside, os.X_OK):
        os.environ["PATH"] = os.pathsep.join([str(beside.parent), os.environ.get("PATH", "")])
        logger.info("dyngen: using %s for verifiers' harness (no uv on PATH)", beside)
        return
    raise ConfigError(
        "verifiers' subprocess runtime runs the chat program through `uv`: expected it on PATH "
        f"or beside this Python ({beside.parent}), found neither. Install it (pip install "
        "'dyngen[verifiers]' brings it, or pip install uv); without it every rollout fails "
        "and scores 0.")


def load_environment(root: str | os.PathLike[str] | None, dataset: str,
                     version: int | None = None, follow: bool = True,
                     reward: str | tuple[str, str] | None = None,
                     **env_kwargs: Any) -> vf.Env:
    """A verifiers environment over `dataset` of the store at `root`.

    `reward`: a verl-form reward function's path (`pkg://module` or a .py file), or
    (path, name); None grades each row by its data_source. `env_kwargs` are the env
    config's other keys (e.g. `agent={"runtime": {"type": "docker"}}`; `block_rows`, `seed`
    and `system_prompt` go to the taskset's); the seat runs
    one chat turn in a subprocess unless they say otherwise. `taskset_id` names a user's
    environment package exporting `DyngenTaskset` (what env servers in other processes
    import); by default this module, registered as `dyngen_verifiers` in this process.
    Fails now when the version read first has no row with a ground truth, or a data
    source nothing grades; rows without one are skipped, said once (missing_truth).
    """
    path, name = (reward, "compute_score") if isinstance(reward, str) or reward is None \
        else reward
    taskset_id = env_kwargs.pop("taskset_id", None)
    if taskset_id is None:
        taskset_id = TASKSET_ID
        sys.modules.setdefault(TASKSET_ID, sys.modules[__name__])
    taskset = {"id": taskset_id, "root": "" if root is None else os.fspath(root),
               "dataset": dataset, "version": version, "follow": follow,
               "task": {"reward": None if path is None else {"path": path, "name": name}},
               **{k: env_kwargs.pop(k) for k in TASKSET_KEYS if k in env_kwargs}}
    agent = {"runtime": {"type": "subprocess"}, **dict(env_kwargs.pop("agent", {}) or {})}
    if (agent.get("runtime") or {}).get("type") == "subprocess":
        uv_on_path()
    config = vf.SingleAgentEnvConfig.model_validate(
        {**env_kwargs, "taskset": taskset, "agent": agent})
    env = vf.SingleAgentEnv(config)
    env.taskset.check()
    return env


__all__ = ["DyngenHarness", "DyngenTask", "DyngenTaskData", "DyngenTaskset",
           "DyngenTasksetConfig", "load_environment"]
