"""Which process is which: an identity that names one process of one machine, ever, and
whether that process is gone. A PostgreSQL cluster's users (dyngen.server.postgres) and a
dataset's serve (dyngen.runtime.serve_lease) record it, so a later process on the same
machine can tell a dead holder from a live one at once.
"""

from __future__ import annotations

import os
from pathlib import Path

_DEAD = ("Z", "X")  # /proc states of a process that has exited (zombie, dead)


def this_process() -> str:
    """This process's identity (empty where /proc cannot tell)."""
    return process_identity(os.getpid()) or ""


def process_identity(pid: int) -> str | None:
    """`<boot id>:<pid namespace>/<pid>/<start time>`: one process of one machine, ever.

    None where /proc cannot tell (not Linux, or no such live process).
    """
    machine, stat = _machine(), _proc_stat(pid)
    if machine is None or stat is None or stat[0] in _DEAD:
        return None
    return f"{machine}/{pid}/{stat[1]}"


def process_is_gone(identity: str) -> bool:
    """True only if `identity` names a process of this machine that no longer runs."""
    machine, _, rest = identity.partition("/")
    pid, _, started = rest.partition("/")
    if not pid.isdigit() or machine != _machine():
        return False  # another machine (or unknown): its lease lapses on its own
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, owned by another user
    stat = _proc_stat(int(pid))
    # A zombie has died; a different start time means the pid now names another process.
    return stat is not None and (stat[0] in _DEAD or stat[1] != started)


def _machine() -> str | None:
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}:{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks after boot) of a process, from /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()  # the command name may hold spaces and ')'
    return fields[0], fields[19]


