"""A writer killed as a crash kills it: forked, and SIGKILLed at a crash point or after a
delay, with no cleanup of any kind."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dyngen.faults import CRASH_ENV


def killed(root: Path, operation: Callable[[Path], object], *, point: str | None = None,
           delay: float | None = None, what: str = "the child") -> bool:
    """Fork a child running `operation(root)`; it dies at `point` (dyngen.faults) or is
    killed after `delay`. Whether it died (rather than finishing first)."""
    pid = os.fork()
    if pid == 0:  # the child: no cleanup of any kind, exactly as a killed process
        status = 0
        try:
            if point is not None:
                os.environ[CRASH_ENV] = point
            operation(root)
        except BaseException:
            status = 1
        os._exit(status)
    if delay is not None:
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 120  # a child that hangs is a failure, not a stuck suite
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"{what} hung")
        time.sleep(0.01)
    status = done[1]
    died = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert died or (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0), status
    return died
