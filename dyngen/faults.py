"""Named crash points, so tests can kill a round at an exact place and check what survives.

`crash_point("store.before_link")` does nothing unless the environment variable
`DYNGEN_CRASH_AT` names that point; then the process is SIGKILLed on the spot, like the
OOM killer or a power cut would do it: no `finally`, no cleanup, no flushing. The points
exist only for the fault-injection tests in `tests/reliability`; outside them each call
costs one environment lookup.
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "DYNGEN_CRASH_AT"

# Every point placed in the code, in the order a round passes them.
CRASH_POINTS = (
    "round.after_load",
    "round.after_generate",
    "round.after_filter",
    "store.after_shard_write",
    "round.after_concat",
    "store.after_temp_record",
    "store.before_link",
    "store.after_link",
    "round.after_version",
    "round.after_lineage",
)


def crash_point(name: str) -> None:
    """SIGKILL this process if `DYNGEN_CRASH_AT` equals `name`; otherwise do nothing."""
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
