"""A round's stages called as plain functions, with no Prefect task run: a dry run.

`dyngen round --dry-run` runs the round's own load, generate and filter stages, without a
Prefect server (no flow run, no task runs, no events). Inside `direct_calls()`, the stages
that call a task of their own (the generate task of each partition, the solve-rate grade of
each share) call its function in this thread, partition after partition: no retries, no
timeout, no task runner.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from prefect import Task

_DIRECT: ContextVar[bool] = ContextVar("dyngen_direct_calls", default=False)


@contextmanager
def direct_calls() -> Iterator[None]:
    """Within the block, the round's tasks run as plain functions (see the docstring)."""
    token = _DIRECT.set(True)
    try:
        yield
    finally:
        _DIRECT.reset(token)


def direct() -> bool:
    """Whether the round's tasks run as plain functions here (`direct_calls`)."""
    return _DIRECT.get()


def call(task: Task, *args: Any, **kwargs: Any) -> Any:
    """`task(...)`, or its function alone inside `direct_calls()`."""
    return task.fn(*args, **kwargs) if direct() else task(*args, **kwargs)
