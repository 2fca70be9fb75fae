"""Generators used by the round tests: well-behaved, flaky, broken and misbehaving."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import datasets

from dyngen.filters.base import RowFilter
from dyngen.generators.base import AbstractDataGenerator, rows_of
from tests.rows import verl_row


class AddNewRows(AbstractDataGenerator):
    """`n` new rows from index `start`, plus a copy of row 0 (a duplicate to reject)."""

    def generate(self, dataset: Any) -> datasets.Dataset:
        start, n = int(self.config.get("start", 100)), int(self.config.get("n", 3))
        rows = [verl_row(i, source="gen") for i in range(start, start + n)]
        first = rows_of(dataset)[0]
        dup = {k: v for k, v in first.items() if not k.startswith("_dyngen")}
        return datasets.Dataset.from_list([*rows, dup])


class UsesContext(AbstractDataGenerator):
    """Writes one row that records the round context it was given."""

    def generate(self, dataset: Any, context: Any = None) -> datasets.Dataset:
        row = verl_row(500 + context.round, source=f"step-{context.trigger.step}")
        return datasets.Dataset.from_list([row])


class HeldOpen(UsesContext):
    """UsesContext's row, once a `release` file exists; says it started in `started`."""

    def generate(self, dataset: Any, context: Any = None) -> datasets.Dataset:
        import time

        Path(self.config.started).write_text(str(context.trigger.step))
        deadline = time.time() + 120
        while not Path(self.config.release).exists() and time.time() < deadline:
            time.sleep(0.05)
        return super().generate(dataset, context)


class ReadsRollouts(AbstractDataGenerator):
    """A row per rollout of the trigger's file (read as generators should: through the
    context), plus UsesContext's row; counts its calls in `calls` when given."""

    def generate(self, dataset: Any, context: Any = None) -> datasets.Dataset:
        if self.config.get("calls"):
            calls = Path(self.config.calls)
            calls.write_text(str(int(calls.read_text()) + 1 if calls.exists() else 1))
        rows = [verl_row(600 + r.line, source="rollout") for r in context.read_rollouts()]
        step = verl_row(500 + context.round, source=f"step-{context.trigger.step}")
        return datasets.Dataset.from_list([*rows, step])


class FlakyOnce(AbstractDataGenerator):
    """Fails on its first call (counted in a file), then behaves like AddNewRows."""

    def generate(self, dataset: Any) -> datasets.Dataset:
        marker = Path(self.config.marker)
        calls = int(marker.read_text()) if marker.exists() else 0
        marker.write_text(str(calls + 1))
        if calls == 0:
            raise ConnectionError("proposer server not ready yet")
        return datasets.Dataset.from_list([verl_row(200, source="flaky")])


class AlwaysFails(AbstractDataGenerator):
    """Raises every time."""

    def generate(self, dataset: Any) -> datasets.Dataset:
        raise RuntimeError("proposer crashed: CUDA error (simulated)")


def _bad(case: str) -> Any:
    good = verl_row(300, source="bad")
    if case == "none":
        return None
    if case == "missing_column":
        return [{k: v for k, v in good.items() if k != "reward_model"}]
    if case == "wrong_types":
        return [{**good, "data_source": 12, "ability": ["math"]}]
    if case == "plain_string_prompt":
        return [{**good, "prompt": "What is 2 + 2?"}]
    if case == "empty_messages":
        return [{**good, "prompt": []}]
    if case == "non_string_role":
        return [{**good, "prompt": [{"role": 7, "content": "hi"}]}]
    if case == "nan_ground_truth":
        return [{**good, "reward_model": {"style": "rule", "ground_truth": math.nan}}]
    if case == "huge_prompt":
        return [{**good, "prompt": [{"role": "user", "content": "token " * 100_000}]}]
    if case == "string":
        return "a new task"
    if case == "dict_of_scalars":
        return {"data_source": "x"}
    raise ValueError(case)


class BadOutput(AbstractDataGenerator):
    """Returns the malformed output named by `case`, next to one good row."""

    def generate(self, dataset: Any) -> Any:
        out = _bad(self.config.case)
        if isinstance(out, list):
            return [*out, verl_row(301, source="good")]
        return out


class BlockUntilReleased(AddNewRows):
    """Marks that it started, then waits for a release file (to hold a round open)."""

    def generate(self, dataset: Any) -> datasets.Dataset:
        import time

        Path(self.config.started).write_text(str(time.time()))
        deadline = time.time() + 120
        while not Path(self.config.release).exists() and time.time() < deadline:
            time.sleep(0.05)
        Path(self.config.finished).write_text(str(time.time()))
        return super().generate(dataset)


class AddsProvenance(AbstractDataGenerator):
    """Rows that record which seed they came from in new extra_info fields, plus one row
    with a new top-level column (only extra_info may gain fields)."""

    def generate(self, dataset: Any) -> list[dict[str, Any]]:
        rows = [verl_row(i, source="proposer") for i in (700, 701)]
        for seed, row in enumerate(rows):
            row["extra_info"] = {**row["extra_info"], "seed_index": seed, "model": "tiny"}
        return [*rows, {**verl_row(702), "surprise": 1}]


class Partitioned(AbstractDataGenerator):
    """`n` rows for its partition, numbered by it; each call leaves a file in `calls`
    (partition, process, start and end time). Partition `fail` raises on its first call,
    or on every call with `fail_always`; `sleep` seconds stand in for a slow model. Its
    stats say which Prefect API its process reports to, any Prefect server it runs, and
    whether the API's credentials are in its environment."""

    def generate(self, dataset: Any, context: Any = None) -> datasets.Dataset:
        import os
        import time

        part, count = context.partition, context.partitions
        calls = Path(self.config.calls)
        calls.mkdir(parents=True, exist_ok=True)
        earlier = len(list(calls.glob(f"p{part}-*")))
        start = time.time()
        time.sleep(float(self.config.get("sleep", 0)))
        (calls / f"p{part}-{earlier}").write_text(f"{os.getpid()} {start} {time.time()}")
        if part == self.config.get("fail") and (earlier == 0 or self.config.get("fail_always")):
            raise ConnectionError(f"partition {part}: inference server not ready (simulated)")
        n = int(self.config.get("n", 2))
        self.state = {"partition": part, "seen": (context.previous_state or {}).get("seen", 0) + 1}
        self.stats = {"prefect_api_url": _api_url(), "servers": _prefect_servers(),
                      "auth_string_in_environ": "PREFECT_API_AUTH_STRING" in os.environ}
        return datasets.Dataset.from_list(
            [verl_row(1000 + 100 * part + i, source=f"part-{part}-of-{count}") for i in range(n)])


class LogsItsSpan(AbstractDataGenerator):
    """One new row per round after `sleep` seconds; appends the dataset, round, start and
    end time and the parent process (the worker that launched the run) to `log`."""

    def generate(self, dataset: Any, context: Any = None) -> datasets.Dataset:
        import os
        import time

        start = time.time()
        time.sleep(float(self.config.sleep))
        with open(self.config.log, "a") as fh:  # one short append: whole lines from many
            fh.write(f"{context.dataset} {context.round} {start} {time.time()} "
                     f"{os.getppid()}\n")
        return datasets.Dataset.from_list([verl_row(600 + context.round,
                                                    source=context.dataset)])


class MapsLate(AbstractDataGenerator):
    """Partition 0 returns at once; the others `dataset.map` after `delay` seconds, while
    partition 0's call has ended (the map would cache beside the store's shards)."""

    def generate(self, dataset: Any, context: Any = None) -> datasets.Dataset:
        import time

        if context.partition:
            time.sleep(float(self.config.delay))
            dataset.map(lambda row: {"n": len(row["data_source"])})
        return datasets.Dataset.from_list([verl_row(900 + context.partition, source="late")])


def _api_url() -> str | None:
    """The Prefect API this process's clients use."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def _prefect_servers() -> list[str]:
    """Command lines of the Prefect servers this process started (its uvicorn children)."""
    import os

    import psutil

    return [" ".join(c.cmdline()) for c in psutil.Process(os.getpid()).children(recursive=True)
            if "uvicorn" in " ".join(c.cmdline())]


class WritesPrompts(AbstractDataGenerator):
    """One row per prompt of `prompts` (the semantic-duplicate round's paraphrases), with
    the reference answer of `answers` where given."""

    def generate(self, dataset: Any) -> datasets.Dataset:
        start = int(self.config.get("start", 100))
        answers = list(self.config.get("answers") or [])
        rows = [verl_row(start + i, source="gen", content=str(p))
                for i, p in enumerate(self.config.prompts)]
        for row, answer in zip(rows, answers, strict=False):
            row["reward_model"] = {**row["reward_model"], "ground_truth": str(answer)}
        return datasets.Dataset.from_list(rows)


class FewKeptPerCall(AbstractDataGenerator):
    """`n` new rows per call, seeded by the round and the attempt (context.round_seed); the
    first `keep` of them marked `extra_info.keep` for KeepMarked to keep."""

    def generate(self, dataset: Any, context: Any = None) -> datasets.Dataset:
        n, keep = int(self.config.get("n", 3)), int(self.config.get("keep", 1))
        start = 1000 + 100 * context.attempt + 10 * context.round
        rows = [verl_row(i, source=f"call-{context.attempt}") for i in range(start, start + n)]
        for j, row in enumerate(rows):
            row["extra_info"] = {**row["extra_info"], "keep": j < keep}
        return datasets.Dataset.from_list(rows)


class KeepMarked(RowFilter):
    """Keeps the rows marked `extra_info.keep`; the others go as `unmarked`."""

    reason = "unmarked"

    def check(self, rows: Any) -> list[str | None]:
        return [None if (row.get("extra_info") or {}).get("keep") else "not marked to keep"
                for row in rows]
