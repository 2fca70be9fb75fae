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

# Points a round does not pass on its way to one version: the log's own later steps and
# store maintenance (tests/reliability/test_store_crashes.py kills at each, through the
# Store calls that reach them).
STORE_CRASH_POINTS = (
    "store.after_key_marker",  # the parent's idempotency marker written, before the link
    "store.checkpoint_before_link",  # a checkpoint's temp file written
    "store.checkpoint_after_link",  # the checkpoint named, its hint not yet updated
    "compact.after_shard_write",  # merged shards written, not committed
    "compact.after_commit",  # the compact version committed
    "vacuum.after_record",  # the vacuum version committed, nothing deleted yet
    "store.after_first_delete",  # vacuum (or gc) deleted its first file
    "store.after_sidecar_write",  # a shard's near-duplicate sidecar written, not its shard
    "index.after_derived_write",  # an old shard's derived sidecar written, not the others
)


def crash_point(name: str) -> None:
    """SIGKILL this process if `DYNGEN_CRASH_AT` equals `name`; otherwise do nothing."""
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
