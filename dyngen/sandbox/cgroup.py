"""A cgroup per sandbox: memory where the kernel counts it, and a bound on processes.

RLIMIT_AS bounds one process's address space, but not what the kernel holds for it: tmpfs
pages, inodes and other slab, pipe buffers. A cgroup's memory limit counts all of it. Made
under the worker's own cgroup (so its limits nest): cgroup v1's `memory` and `pids`
hierarchies where they are writable (as root), else a delegated cgroup v2 subtree (the
worker's own cgroup, or its parent, with memory and pids in its subtree_control). Where
neither can be made, the sandbox runs with rlimits alone: a warning says so once per
process, and `runs_without_cgroup()` counts those runs for the round's lineage.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from pathlib import Path

logger = logging.getLogger(__name__)
_V1 = Path("/sys/fs/cgroup")
_names = itertools.count()
_lock = threading.Lock()
_unbounded = {"warned": False, "runs": 0}
_swept: set[Path] = set()


def _own(controller: str) -> str | None:
    """This process's cgroup path in `controller`'s hierarchy ("" for cgroup v2)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, names, path = line.split(":", 2)
            if controller in names.split(","):
                return path
    return None


class Cgroup:
    """One sandbox's memory and pids cgroups (v1: two folders; v2: one)."""

    def __init__(self, folders: list[Path]) -> None:
        self.folders = folders

    @staticmethod
    def create(memory_bytes: int, pids: int) -> Cgroup | None:
        """A new cgroup with these limits, or None where none can be made here."""
        name = f"dyngen-sandbox-{os.getpid()}-{next(_names)}"
        for attempt in (_create_v1, _create_v2):
            with contextlib.suppress(OSError, ValueError):
                made = attempt(name, memory_bytes, pids)
                if made is not None:
                    return made
        return None

    def add(self, pid: int) -> None:
        """Move process `pid` into this cgroup (its later children are born there)."""
        for folder in self.folders:
            (folder / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        """Remove the cgroup (its processes are gone, or going)."""
        for folder in self.folders:
            for _ in range(50):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)


def _sweep(folder: Path) -> None:
    """Remove the empty cgroups of sandboxes whose worker is gone: a process that ends by
    os._exit (a forked child, as multiprocessing's) runs no hook that could."""
    if folder in _swept:
        return
    _swept.add(folder)
    for stale in folder.glob("dyngen-sandbox-*-*"):
        try:
            os.kill(int(stale.name.split("-")[2]), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                stale.rmdir()  # refused while any process is still in it
        except (ValueError, PermissionError):
            pass


def _create_v1(name: str, memory_bytes: int, pids: int) -> Cgroup | None:
    """cgroup v1: a folder in the memory and in the pids hierarchy."""
    memory_own, pids_own = _own("memory"), _own("pids")
    if memory_own is None or pids_own is None or not (_V1 / "memory").is_dir():
        return None
    memory = _V1 / "memory" / memory_own.lstrip("/") / name
    pid_folder = _V1 / "pids" / pids_own.lstrip("/") / name
    _sweep(memory.parent)
    _sweep(pid_folder.parent)
    memory.mkdir()
    made = Cgroup([memory])
    try:
        (memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
        with contextlib.suppress(OSError):  # swap too, where swap accounting is on
            (memory / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
        pid_folder.mkdir()
        made.folders.append(pid_folder)
        (pid_folder / "pids.max").write_text(str(pids))
    except OSError:
        made.remove()
        raise
    return made


def _create_v2(name: str, memory_bytes: int, pids: int) -> Cgroup | None:
    """cgroup v2: a folder beside or below this process's own cgroup, where memory and pids
    are delegated (a cgroup with processes cannot enable controllers for its children, so a
    delegated service usually runs in a leaf and makes siblings)."""
    own = _own("")
    if own is None or not (_V1 / "cgroup.controllers").exists():
        return None
    mine = _V1 / own.lstrip("/")
    for root in (mine, mine.parent):
        control = root / "cgroup.subtree_control"
        if not control.exists() or not {"memory", "pids"} <= set(control.read_text().split()):
            continue
        folder = root / name
        _sweep(root)
        try:
            folder.mkdir()
        except OSError:
            continue
        made = Cgroup([folder])
        try:
            (folder / "memory.max").write_text(str(memory_bytes))
            with contextlib.suppress(OSError):
                (folder / "memory.swap.max").write_text("0")
            (folder / "pids.max").write_text(str(pids))
        except OSError:
            made.remove()
            continue
        return made
    return None


def note_unbounded() -> None:
    """Count a sandbox started without a cgroup; warn the first time in this process."""
    with _lock:
        _unbounded["runs"] += 1
        if _unbounded["warned"]:
            return
        _unbounded["warned"] = True
    logger.warning("dyngen.sandbox: no cgroup could be made here (cgroup v1 memory and pids "
                   "not writable, no delegated cgroup v2 subtree): a sandbox's memory is "
                   "bounded by rlimits only, which do not count what the kernel holds for it "
                   "(tmpfs pages, inodes, pipe buffers). Run the worker as root, or delegate "
                   "a cgroup v2 subtree with memory and pids to its user.")


def runs_without_cgroup() -> int:
    """How many sandboxes this process started without a cgroup."""
    return int(_unbounded["runs"])
