"""Small helpers the test modules share."""

from __future__ import annotations

import os
import signal
import textwrap
import time
from pathlib import Path

# The discard port: nothing listens there, so Prefect calls to it fail at once.
UNUSED_API = "http://127.0.0.1:9/api"


def as_a_terminal_job() -> None:
    """`preexec_fn` for a command a test will Ctrl-C: SIGINT as a terminal's foreground job
    has it. A process started in the background by a non-interactive shell (CI launched with
    `... &`) ignores SIGINT, and so would every process it starts: an interpreter that
    starts with SIGINT ignored keeps it ignored, and Ctrl-C could not be tested."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def write(path: Path, source: str) -> Path:
    """Write dedented Python source to ``path``, creating its directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def queued_triggers() -> list[dict]:
    """The triggers of the batch ends waiting for the absent server (`no_server`), in order:
    events with no store to record their batch end (a batch end the store keeps sends a
    wake-up, which is never queued)."""
    import json

    from dyngen.trainers.outbox import Outbox

    return [json.loads(p.read_text())["payload"]["trigger"] for p in Outbox().pending(UNUSED_API)]


def server_triggers(api_url: str, dataset: str, count: int,
                    auth_string: str | None = None) -> list[dict]:
    """The triggers of the dataset's batch-end events the server recorded (once `count`
    are), oldest first."""
    import httpx

    from dyngen.server.auth import auth_headers
    from dyngen.trainers.events import EVENT_NAME, resource_id

    body = {"filter": {"event": {"name": [EVENT_NAME]},
                       "resource": {"id": [resource_id(dataset)]},
                       "order": "ASC"}, "limit": 50}
    deadline = time.monotonic() + 30
    while True:  # the server persists events every half second
        answer = httpx.post(f"{api_url}/events/filter", json=body, timeout=10,
                            headers=auth_headers(auth_string))
        assert answer.status_code == 200, answer.text
        found = answer.json()["events"]
        if len(found) >= count or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return [e["payload"]["trigger"] for e in found]


def server_steps(api_url: str, dataset: str, count: int,
                 auth_string: str | None = None) -> list[int]:
    """Steps of the dataset's batch-end events the server recorded (once `count` are)."""
    return [t["step"] for t in server_triggers(api_url, dataset, count, auth_string)]


def processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line or environment mentions `text` (a test's folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            blob = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if text.encode() in blob:
            found.append(int(entry.name))
    return found
