"""Rounds served from a warm process (`dyngen serve`, fork isolation) that die, hang or are
cancelled: each run ends in a final state saying why (which frees the deployment's
concurrency slot), none is run again, the serve process lives on, and the next batch-end
event commits a round.

A real `prefect server start`; the generator (tests.reliability.gens.DiesOrHangs) kills
its own process at step 1 and sleeps for an hour at steps 2 and 3; `--max-round-seconds`
bounds a round at a few seconds; step 3 is cancelled as from the UI.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dyngen.server.local import LocalServer, spawn, stop, wait_for_automation
from dyngen.store import verify
from dyngen.trainers.events import emit_batch_end, trigger_name
from tests.e2e.conftest import (
    DYNGEN,
    REPO,
    env_for,
    seeded,
    server,  # noqa: F401  (a real `prefect server start`)
)
from tests.e2e.test_triggered_rounds import wait_for_versions

DATASET = "faulty"
MAX_ROUND_SECONDS = 8
ROUND = ["data.datagen.path=pkg://tests.reliability.gens", "data.datagen.name=DiesOrHangs",
         "+data.datagen.die_at=[1]", "+data.datagen.hang_at=[2,3]"]


def test_served_rounds_that_die_hang_or_are_cancelled_end_and_the_next_one_runs(
    server: LocalServer, tmp_path: Path,  # noqa: F811
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Cancelling

    store = seeded(tmp_path, DATASET)
    log = tmp_path / "serve.log"
    serve = spawn([*DYNGEN, "--root", str(store.root), "serve", "--dataset", DATASET,
                   "--max-round-seconds", str(MAX_ROUND_SECONDS), "--catch-up-seconds", "0",
                   *ROUND],
                  env_for(server), log, cwd=REPO)
    try:
        wait_for_automation(server.api_url, trigger_name(DATASET))
        with temporary_settings(updates={PREFECT_API_URL: server.api_url}), \
                get_client(sync_client=True) as client:
            def run_of(step: int, done: Callable[[Any], bool]) -> Any:
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    runs = [r for r in client.read_flow_runs()
                            if (r.parameters.get("trigger") or {}).get("step") == step]
                    if runs and runs[0].state is not None and done(runs[0].state):
                        return runs[0]
                    time.sleep(0.25)
                raise AssertionError(f"step {step}: no run got there; log:\n"
                                     f"{log.read_text()[-3000:]}")

            def final(step: int) -> Any:
                emit_batch_end(DATASET, step, {"score": 0.5}, api_url=server.api_url)
                return run_of(step, lambda s: s.is_final())

            died = final(1)
            started = time.monotonic()
            final(2)
            hung_seconds = time.monotonic() - started
            emit_batch_end(DATASET, 3, {"score": 0.5}, api_url=server.api_url)
            running = run_of(3, lambda s: s.is_running())
            client.set_flow_run_state(running.id, Cancelling(), force=True)
            run_of(3, lambda s: s.is_final())
            emit_batch_end(DATASET, 4, {"score": 0.5}, api_url=server.api_url)
            history = wait_for_versions(store, DATASET, 1, log)
            run_of(4, lambda s: s.is_final())
            # A stopped round's engine reports Crashed on SIGTERM; serve then sets the
            # state it meant once the process is gone.
            hung = run_of(2, lambda s: s.name == "TimedOut")
            cancelled = run_of(3, lambda s: s.is_cancelled())
            # None of them was run again: one run per step.
            per_step = {step: len([r for r in client.read_flow_runs()
                                   if (r.parameters.get("trigger") or {}).get("step") == step
                                   and r.parameters.get("dataset") == DATASET])
                        for step in (1, 2, 3, 4)}
        alive = serve.poll() is None
    finally:
        stop(serve)

    assert died.state.is_crashed() and "exited with code -9" in died.state.message
    assert "not run again" in died.state.message
    assert hung.state.is_failed() and hung.state.name == "TimedOut", hung.state
    assert f"over {MAX_ROUND_SECONDS} s" in hung.state.message
    assert hung_seconds < MAX_ROUND_SECONDS + 30
    assert cancelled.state.is_cancelled(), cancelled.state
    assert [r.lineage["trigger"]["step"] for r in history[1:]] == [4]
    assert per_step == {1: 1, 2: 1, 3: 1, 4: 1}
    assert alive, "the serve process died with a round"
    assert verify(store, DATASET) == []
