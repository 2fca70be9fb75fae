"""A generation round run in the calling process (`dyngen round`, a trainer's inline mode).

Prefect's synchronous flow engine ends every flow run by joining its heartbeat thread,
which sleeps in one-second steps: up to a second per round spent waiting, after the
version is committed and the run is Completed. Heartbeats let a server notice that a
run's process died; here that process is the caller's own, which sees the failure
itself. So a round run in process does without them, for that run only:
served and deployed rounds (their own processes) keep Prefect's heartbeat.
"""

from __future__ import annotations

from typing import Any

from prefect import tags
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

from dyngen.flows.generation_round import generation_round
from dyngen.round.run_names import round_tags
from dyngen.server.local import ensure_prefect_api


def run_round(dataset: str, config: dict[str, Any] | None = None,
              trigger: dict[str, Any] | None = None,
              overrides: list[str] | None = None) -> dict[str, Any]:
    """Run one round as a flow run in this process and return its summary."""
    ensure_prefect_api()  # without PREFECT_API_URL: a temporary server, started patiently
    # Tagged when created, so the round need not write its tags while it runs.
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}), \
            tags(*round_tags(dataset)):
        return generation_round(dataset, config=config, trigger=trigger, overrides=overrides)
