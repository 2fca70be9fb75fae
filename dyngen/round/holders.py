"""Which process holds a round: an identity that names one process of one machine, ever,
and whether that process is gone.

A round labels its flow run with it (`PROCESS_LABEL`) while it holds its dataset's slot
(dyngen.round.slot) or waits for an earlier step (dyngen.round.step_order), so a waiting
round on the same machine can tell a dead holder from a live one and free what it held.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

PROCESS_LABEL = "dyngen.round.process"
# The state a run left when its process gave its place back (dyngen.round.step_order): the
# process label names that process only while the run is still in that state.
LEFT_LABEL = "dyngen.round.left_state"
_DEAD = ("Z", "X")  # /proc states of a process that has exited (zombie, dead)


def holder_labels() -> dict[str, str]:
    """The labels by which a process says it now answers for its run."""
    return {PROCESS_LABEL: this_process(), LEFT_LABEL: ""}


def holder_of(run: Any) -> str:
    """The identity of the process answering for a flow run ("" when none can be told)."""
    labels = run.labels or {}
    left = str(labels.get(LEFT_LABEL) or "")
    if left and left != str(run.state_id):
        return ""  # it gave its place back and runs again: its new process has not said so yet
    return str(labels.get(PROCESS_LABEL) or "")


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


