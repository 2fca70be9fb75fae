"""Misbehaving generators for the reliability suite: every way a generator's output goes bad.

`Misbehaves(case=...)` returns the output named by `case`. When that output is a list of
rows, two good rows (indices 900 and 901) come with it, so a test can check that bad rows
are quarantined while good ones are kept. `MillionRows` returns 1,000,000 rows at once,
built column by column in Arrow (a real proposer hands over a `datasets.Dataset`).
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dyngen.generators.base import AbstractDataGenerator
from tests.rows import verl_row, verl_row_with

GOOD = (900, 901)
HUGE_CONTENT_CHARS = 20_000_000


def _row(**changes: Any) -> dict[str, Any]:
    """A bad row: row 800 with `changes` (`a.b=` sets a nested field)."""
    return verl_row_with(800, "bad", **changes)


def _hang() -> Any:
    time.sleep(3600)  # past any round.timeout_seconds a test sets
    return []


def _raise() -> Any:
    raise RuntimeError("proposer crashed: CUDA error (simulated)")


def _arrow_rows_with_defects() -> datasets.Dataset:
    """A Dataset (Arrow-typed, as generators usually return) with two bad rows among good."""
    rows = [verl_row(i, source="good") for i in GOOD]
    rows.insert(1, verl_row(800, source="bad", content="   \t "))  # blank user message
    blank_role = verl_row(801, source="bad")
    blank_role["prompt"][0]["role"] = " "
    rows.append(blank_role)
    return datasets.Dataset.from_list(rows)


# case -> the generator's return value (lists of rows get the good rows appended)
OUTPUTS: dict[str, Callable[[], Any]] = {
    "raises": _raise,
    "hangs": _hang,
    "none": lambda: None,
    "string": lambda: "What is 2 + 2?",
    "int": lambda: 42,
    "generator_object": lambda: (verl_row(i) for i in GOOD),
    "dict_of_scalars": lambda: {"data_source": "x", "ability": "math"},
    "unequal_columns": lambda: {"data_source": ["a", "b"], "ability": ["math"]},
    "missing_column": lambda: [{k: v for k, v in _row().items() if k != "reward_model"}],
    "wrong_types": lambda: [_row(data_source=12, ability=["math"])],
    "plain_string_prompt": lambda: [_row(prompt="What is 2 + 2?")],
    "empty_messages": lambda: [_row(prompt=[])],
    "non_string_role": lambda: [_row(prompt=[{"role": 7, "content": "hi"}])],
    "nan_ground_truth": lambda: [_row(**{"reward_model.ground_truth": math.nan})],
    "inf_ground_truth": lambda: [_row(**{"reward_model.ground_truth": math.inf}),
                                 _row(**{"reward_model.ground_truth": -math.inf})],
    "numpy_nan_ground_truth": lambda: [_row(**{"reward_model.ground_truth": np.float32("nan")})],
    "bytes_content": lambda: [_row(prompt=[{"role": "user", "content": b"\x00\xff\xfe\x89PNG"}])],
    "bytes_row": lambda: [b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"],
    "surrogate_content": lambda: [_row(prompt=[{"role": "user",
                                                "content": "caf\udce9 \x00 bad bytes"}])],
    "nested_wrong_types": lambda: [_row(extra_info={"index": "seven", "split": ["x", 1]})],
    "message_extra_keys": lambda: [_row(prompt=[{"role": "user", "content": "hi",
                                                 "name": "alice", "tool_calls": []}])],
    "unknown_column": lambda: [_row(surprise="boo")],
    "huge_row": lambda: [_row(prompt=[{"role": "user", "content": "x" * HUGE_CONTENT_CHARS}])],
    "huge_prompt": lambda: [_row(prompt=[{"role": "user", "content": "token " * 100_000}])],
    "arrow_rows_with_defects": _arrow_rows_with_defects,
}


class Misbehaves(AbstractDataGenerator):
    """Returns the bad output named by `config.case` (lists come with two good rows)."""

    def generate(self, dataset: Any) -> Any:
        out = OUTPUTS[self.config.case]()
        if isinstance(out, list):
            return [*out, *(verl_row(i, source="good") for i in GOOD)]
        return out


MILLION = 1_000_000
MILLION_START = 10_000


def _same(n: int, text: str) -> pa.Array:
    return pa.repeat(pa.scalar(text, pa.string()), n)


def million_rows(n: int = MILLION, start: int = MILLION_START) -> pa.Table:
    """`n` distinct verl rows (indices start..start+n-1) built in Arrow, with three defects.

    Row 0 repeats a prompt already in the dataset (verl_row(0)), row 1 has an empty user
    message, row 2 has no ground truth.
    """
    index = pa.array(np.arange(start, start + n, dtype=np.int64))
    text = pc.cast(index, pa.string())
    user = pc.binary_join_element_wise("What is ", text, " + ", text, "?", "")
    user = pc.if_else(pa.array(np.arange(n) == 1), pa.scalar("", pa.string()), user)
    user = pc.if_else(pa.array(np.arange(n) == 0), pa.scalar("What is 0 + 0?"), user)
    system = _same(n, "Solve the problem.")
    message = pa.struct([("content", pa.string()), ("role", pa.string())])
    order = np.stack([np.arange(n), np.arange(n) + n], axis=1).ravel()
    messages = pa.concat_arrays([
        pa.StructArray.from_arrays([system, _same(n, "system")],
                                   fields=list(message)),
        pa.StructArray.from_arrays([user, _same(n, "user")],
                                   fields=list(message)),
    ]).take(pa.array(order))
    prompt = pa.ListArray.from_arrays(pa.array(np.arange(0, 2 * n + 1, 2, dtype=np.int32)),
                                      messages)
    truth = pc.cast(pc.multiply(index, 2), pa.string())
    truth = pc.if_else(pa.array(np.arange(n) == 2), pa.scalar(None, pa.string()), truth)
    reward = pa.StructArray.from_arrays(
        [truth, _same(n, "rule")],
        names=["ground_truth", "style"])
    extra = pa.StructArray.from_arrays(
        [index, _same(n, "train")],
        names=["index", "split"])
    same = _same(n, "million")
    return pa.table({"data_source": same, "prompt": prompt,
                     "ability": _same(n, "math"),
                     "reward_model": reward, "extra_info": extra})


class MillionRows(AbstractDataGenerator):
    """Returns `config.n` rows (default 1,000,000) at once, as a datasets.Dataset."""

    def generate(self, dataset: Any) -> datasets.Dataset:
        table = million_rows(int(self.config.get("n", MILLION)))
        return datasets.Dataset(datasets.table.InMemoryTable(table))


class DiesOrHangs(AbstractDataGenerator):
    """By the trigger's step: kills its own process (`die_at`), sleeps for an hour
    (`hang_at`), or writes one row recording the step."""

    def generate(self, dataset: Any, context: Any = None) -> datasets.Dataset:
        step = context.trigger.step
        if step in self.config.get("die_at", []):
            os.kill(os.getpid(), signal.SIGKILL)
        if step in self.config.get("hang_at", []):
            time.sleep(3600)
        return datasets.Dataset.from_list([verl_row(700 + step, source=f"step-{step}")])
