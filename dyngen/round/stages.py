"""How a round marks its stages: the stage an exception escaped from (the CLI names it in
its one-line failure) and each stage's seconds (the lineage's `timings`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Mark an exception escaping the block with the stage it came from."""
    try:
        yield
    except Exception as exc:
        if getattr(exc, "dyngen_stage", None) is None:
            with suppress(AttributeError):  # an exception type that takes no attributes
                exc.dyngen_stage = name  # type: ignore[attr-defined]
        raise


@contextmanager
def timed(timings: dict[str, float], name: str) -> Iterator[None]:
    """The stage `name`, its seconds added to `timings[name]` (a stage the round runs again,
    asking the generator for more or after losing its commit, counts every time)."""
    start = time.perf_counter()
    try:
        with stage(name):
            yield
    finally:
        timings[name] = round(timings.get(name, 0.0) + time.perf_counter() - start, 3)
