"""A generation round run in the calling process (`dyngen round`, a trainer's inline mode).

Prefect's synchronous flow engine ends every flow run by joining its heartbeat thread,
which sleeps in one-second steps: up to a second per round spent waiting, after the
version is committed and the run is Completed. Heartbeats let a server notice that a
run's process died; here that process is the caller's own, which sees the failure
itself. So a round run in process does without them, for that run only:
served and deployed rounds (their own processes) keep Prefect's heartbeat.

Without PREFECT_API_URL, the round reports to the temporary server `ensure_prefect_api`
found or started (dyngen/server/temporary.py; kept for the next command by default). Before
returning, the round delivers what Prefect's background workers still hold (task-run
events, logs), so nothing is left to flush at exit. (The server's own output goes to a log
file: a server stopped while it records those events prints "Error flushing 1 events"
tracebacks, which used to end successful rounds on the user's terminal.)
"""

from __future__ import annotations

from typing import Any

from prefect import tags
from prefect.settings import (
    PREFECT_API_URL,
    PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
    temporary_settings,
)

from dyngen.flows.generation_round import generation_round
from dyngen.round.run_names import round_tags
from dyngen.runtime.warm_runner import drain_prefect_workers
from dyngen.server.temporary import ensure_prefect_api

# Seconds to wait for Prefect's background workers to deliver what they hold.
DRAIN_SECONDS = 30.0


def run_round(dataset: str, config: dict[str, Any] | None = None,
              trigger: dict[str, Any] | None = None,
              overrides: list[str] | None = None) -> dict[str, Any]:
    """Run one round as a flow run in this process and return its summary."""
    # Without PREFECT_API_URL: a temporary server, found or started patiently.
    url = ensure_prefect_api()
    updates: dict[Any, Any] = {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
    if url and not PREFECT_API_URL.value():
        updates[PREFECT_API_URL] = url
    # Tagged when created, so the round need not write its tags while it runs.
    with temporary_settings(updates=updates), tags(*round_tags(dataset)):
        try:
            return generation_round(dataset, config=config, trigger=trigger,
                                    overrides=overrides)
        finally:
            drain_prefect_workers(timeout=DRAIN_SECONDS)
