"""Progress bars for long commands: drawn on a terminal (stderr), silent when it is not.

Core functions take a `Bar` and report to it; they never decide whether anything is
drawn. The command line opens one with `progress_bar(...)`:

    with progress_bar("verifying gsm8k-dyn", total=len(versions), unit="versions") as bar:
        for version in versions:
            ...
            bar.advance()

`bar.stage(description, total)` starts the next stage of the same command (reading, then
hashing). A library caller passes nothing and gets `QUIET`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class Bar:
    """Where long work reports how far it got; this base class draws nothing."""

    def stage(self, description: str, total: float | None = None, unit: str = "") -> None:
        """Begin a stage of the work: `total` units to go (None: unknown)."""

    def advance(self, amount: float = 1) -> None:
        """Count `amount` more units of the current stage as done."""


QUIET = Bar()


class _CountColumn(ProgressColumn):
    """`1,234/5,000 rows`, or `1,234 rows` while the total is unknown; nothing for a
    stage that counts no units."""

    def render(self, task: Task) -> Text:
        """The count of the task, in its unit."""
        unit = task.fields.get("unit", "")
        if not unit:
            return Text("")
        done = f"{int(task.completed):,}"
        text = done if task.total is None else f"{done}/{int(task.total):,}"
        return Text(f"{text} {unit}".rstrip(), style="progress.download")


class _RichBar(Bar):
    """A `Bar` drawn by rich: one line per stage, the finished ones marked done."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._task: int | None = None

    def stage(self, description: str, total: float | None = None, unit: str = "") -> None:
        """Finish the current stage's line and start a new one."""
        self._finish()
        self._task = self._progress.add_task(description, total=total, unit=unit)

    def advance(self, amount: float = 1) -> None:
        """Move the current stage's bar."""
        if self._task is None:
            self.stage("working")
        assert self._task is not None
        self._progress.advance(self._task, amount)

    def _finish(self) -> None:
        if self._task is None:
            return
        task = next(t for t in self._progress.tasks if t.id == self._task)
        done = (task.completed if task.total is None else task.total) or 1  # a full bar
        self._progress.update(self._task, total=done, completed=done)


@contextmanager
def progress_bar(description: str | None = None, total: float | None = None, unit: str = "",
                 *, console: Console | None = None) -> Iterator[Bar]:
    """A progress bar on stderr for the duration of the block; `QUIET` if stderr is not
    a terminal (piped, redirected to a file, or a CI log)."""
    console = console or Console(file=sys.stderr)
    if not console.is_terminal or console.is_dumb_terminal:
        yield QUIET
        return
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                        _CountColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                        console=console, transient=True)
    bar = _RichBar(progress)
    with progress:
        if description is not None:
            bar.stage(description, total, unit)
        yield bar
