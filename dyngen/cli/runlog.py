"""Where a round run from the CLI writes Prefect's log, and how its failure is told.

Without --debug, Prefect's console lines (flow run states, tracebacks) go to a log file
instead of the terminal; the command prints one line, and on failure names the stage
that failed, why, and that file. With --debug (or DYNGEN_DEBUG=1) the console is as
Prefect makes it.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dyngen.errors import DyngenError

LOG_DIR_ENV = "DYNGEN_LOG_DIR"
DEFAULT_LOG_DIR = ".dyngen/logs"


class RoundFailedError(DyngenError):
    """A round started and failed: which stage, why, and where its full log is."""

    exit_code = 1


def log_path(dataset: str) -> Path:
    """A new log file for a round of `dataset`: under $DYNGEN_LOG_DIR, else .dyngen/logs."""
    folder = Path(os.environ.get(LOG_DIR_ENV) or DEFAULT_LOG_DIR)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    safe = re.sub(r"[^\w.-]", "_", dataset)
    return folder / f"round-{safe}-{stamp}-{os.getpid()}.log"


@contextmanager
def prefect_log_to_file(path: Path, debug: bool) -> Iterator[Path | None]:
    """Prefect's console handlers replaced by one writing to `path` (kept when `debug`)."""
    if debug:
        yield None
        return
    from prefect.logging.handlers import PrefectConsoleHandler

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8", delay=True)
    except OSError:  # an unwritable folder: the terminal keeps the log
        yield None
        return
    handler.setFormatter(logging.Formatter(
        "%(asctime)s | %(levelname)-7s | %(name)s - %(message)s"))
    root = logging.getLogger()
    consoles = [h for h in root.handlers if isinstance(h, PrefectConsoleHandler)]
    for console in consoles:
        root.removeHandler(console)
    root.addHandler(handler)
    # A flow run's INFO lines (states, the round's summary) belong in its log file.
    prefect_logger = logging.getLogger("prefect")
    level = prefect_logger.level
    prefect_logger.setLevel(min(level or logging.INFO, logging.INFO))
    try:
        yield path
    finally:
        prefect_logger.setLevel(level)
        root.removeHandler(handler)
        handler.close()
        for console in consoles:
            root.addHandler(console)


def stage_of(exc: BaseException) -> str | None:
    """The round stage an exception escaped from (set by the generation round's flow)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        stage = getattr(current, "dyngen_stage", None)
        if stage:
            return str(stage)
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def round_failure(dataset: str, exc: BaseException, log: Path | None) -> RoundFailedError:
    """One line for a round that failed at run time: stage, why, and its full log."""
    stage = stage_of(exc)
    where = f"in its {stage} stage" if stage else "before it committed"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    why = text if isinstance(exc, DyngenError) else f"{type(exc).__name__}: {text}".rstrip(": ")
    full = f"; full log: {log}" if log is not None and log.exists() else ""
    failed = RoundFailedError(f"the round of {dataset!r} failed {where}: {why} (nothing was "
                              f"committed){full}. Rerun with --debug for the traceback.")
    if isinstance(exc, DyngenError):  # dyngen's own refusal: a user error, as before the run
        failed.exit_code = 2
    return failed
