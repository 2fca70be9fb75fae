"""Leave a process without tearing its interpreter down, once its clean-up has run.

A process that imported Prefect spends seconds (more on a loaded machine) freeing its
modules after its last `atexit` handler: after Ctrl-C, `dyngen serve` and its fork server
would linger that long. `exit_after_cleanup` registers a last handler that, once a
long-running command asked for it (`exit_quickly`), flushes the standard streams and
logging, then ends the process with its exit code; everything registered after it
(Prefect's own clean-up, a temporary server's stop) runs first. Other commands end as
Python ends them.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys

_exit_code = 0
_quickly = False


def exit_quickly() -> None:
    """Ask that this process end right after its clean-up (see the module's docstring)."""
    global _quickly
    _quickly = True


def set_exit_code(code: object) -> None:
    """The code the process ends with (as `sys.exit(code)` would give it)."""
    global _exit_code
    _exit_code = code if isinstance(code, int) else (0 if code is None else 1)


def _exit_now() -> None:
    if not _quickly:
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    os._exit(_exit_code)


def exit_after_cleanup() -> None:
    """Register the last `atexit` handler: flush, then end the process at once."""
    atexit.register(_exit_now)
