"""Each batch end names the one its trainer sent before it, so a round can wait for that
one's run even before Prefect has created it.

Prefect's trigger service may create the runs of batch ends sent back to back in any
order, and a worker may start a later step's round before the earlier step's run exists:
a round that looked only at the runs the server has would go ahead of it. So a batch end
carries `trigger.previous`: the event id and step of the batch end sent before it for the
same dataset to the same server, and how many seconds before it (on the trainer's clock).
The round waits for that run to exist and end (dyngen.round.step_order).

The chain is kept beside the outbox (one small file per server and dataset), so events of
`dyngen emit` run once per batch are linked too, and a restarted trainer's first event
names the last one sent before it. An event that goes back in steps (a trainer resumed from
an older checkpoint) names none. Keeping the chain never delays an emit by more than the
lock's wait, and never fails one: without its lock, an event is sent unlinked.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dyngen.trainers.outbox import file_lock

CHAIN_DIR = "chain"


@dataclass(frozen=True)
class Link:
    """The previous batch end to name in an event's trigger (None: none), and where the
    event itself is recorded once it is sent or queued."""

    previous: dict[str, Any] | None
    path: Path | None  # None: the chain's lock was not had, nothing is recorded
    sent: float

    def record(self, event_id: str, step: int) -> None:
        """Make this event the one the dataset's next batch end names."""
        if self.path is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps({"event_id": event_id, "step": step, "sent": self.sent}),
                           encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:  # the event is out: only the next one goes unlinked
            tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def linked(folder: Path, dataset: str, step: int) -> Iterator[Link]:
    """Hold `dataset`'s chain in an outbox `folder` (one server's) while an event of `step`
    is built and sent; yield what it names as previous."""
    key = hashlib.sha256(dataset.encode()).hexdigest()[:16]
    path = folder / CHAIN_DIR / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(path.with_suffix(".lock")) as locked:
        now = time.time()
        if not locked:
            yield Link(None, None, now)
            return
        last = _read(path)
        previous = None
        if last is not None and last["step"] < step:
            previous = {"event_id": last["event_id"], "step": last["step"],
                        "seconds_before": round(max(0.0, now - last["sent"]), 3)}
        yield Link(previous, path, now)


def _read(path: Path) -> dict[str, Any] | None:
    """The dataset's last recorded event, or None (none yet, or a file not written here)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(value, dict):
        return None
    event_id, step, sent = value.get("event_id"), value.get("step"), value.get("sent")
    ok = isinstance(event_id, str) and 0 < len(event_id) <= 200 \
        and type(step) is int and step >= 0 \
        and type(sent) in (int, float) and math.isfinite(sent)
    return value if ok else None
