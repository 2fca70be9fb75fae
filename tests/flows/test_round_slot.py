"""A dataset's round slot is freed from a holder that is over, whatever became of its run.

Issue 49: on one pytest worker's session server, `dyngen serve` stopped with a round in
flight (tests/test_cli_signals.py) left the round slot of dataset "ds" held by a run whose
process was gone; a later module's fixture deleted every run of the shared deployment
(tests/reliability/test_lost_runs.py), that run with it; the test server runs no lease
sweep, so the lease never lapsed, and the next round of "ds" waited for the slot until
the hour's timeout. A Prefect runner that marks such a run Crashed did the same to a run
left in place. Here a real round process takes a slot and is killed, its run is deleted or
Crashed, and a round of the dataset must still get the slot within seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dyngen.round import slot
from dyngen.store import Store
from tests.rows import verl_rows

pytestmark = pytest.mark.usefixtures("prefect_server")

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_ENV = "DYNGEN_ROUND_SLOT_TIMEOUT_SECONDS"  # how long a round waits for its slot
# A round's process taking its dataset's slot: it writes its flow run's id to argv[3],
# then kills itself (argv[2] "die", as the OOM killer or a stopped serve would) or holds
# the slot until the file argv[4] exists ("hold").
_HOLDER = """
import os, signal, sys, time
from pathlib import Path
from prefect import flow
from prefect.runtime import flow_run
from dyngen.round.slot import dataset_slot

@flow(name="slot-holder")
def hold(dataset: str, mode: str, marker: str, release: str) -> None:
    with dataset_slot(dataset):
        Path(marker).write_text(str(flow_run.id))
        if mode == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        deadline = time.monotonic() + 120
        while not Path(release).exists() and time.monotonic() < deadline:
            time.sleep(0.05)

hold(*sys.argv[1:5])
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Any]:
    """Start a process that takes `dataset`'s slot; returns its flow run's id once it holds."""
    from prefect.settings import PREFECT_API_URL

    procs: list[subprocess.Popen[str]] = []
    release = tmp_path / "release"

    def start(dataset: str, mode: str) -> tuple[str, subprocess.Popen[str]]:
        marker = tmp_path / f"{dataset}.run"
        env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()),
               "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen([sys.executable, "-c", _HOLDER, dataset, mode, str(marker),
                                 str(release)], env=env, cwd=REPO, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        procs.append(proc)
        deadline = time.monotonic() + 120
        while not marker.exists() or not marker.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"the holder never took the slot:\n{proc.communicate()[0]}")
            time.sleep(0.05)
        return marker.read_text(), proc

    yield start
    release.write_text("go")
    for proc in procs:
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def active_slots(dataset: str) -> int:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_global_concurrency_limit_by_name(f"dyngen-round-{dataset}").active_slots


def round_config(store: Store) -> dict[str, Any]:
    return {"store": {"root": str(store.root)},
            "data": {"filter_overlong_prompts": False,
                     "datagen": {"path": "pkg://tests.flows.gens", "name": "AddNewRows"}},
            "round": {"retries": 0, "retry_delay_seconds": 0}}


@pytest.mark.parametrize("then", ["deleted", "crashed"])
def test_a_round_gets_the_slot_of_a_killed_round_whose_run_was_deleted_or_ended(
        then: str, holder: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    from dyngen.flows.generation_round import generation_round

    dataset = f"slot-{then}"
    run_id, proc = holder(dataset, "die")
    assert proc.wait(timeout=60) == -9
    assert active_slots(dataset) == 1  # the killed round could not release its slot
    with get_client(sync_client=True) as client:
        if then == "deleted":  # a test's fixture deleting every run of the deployment
            client.delete_flow_run(run_id)
        else:  # Prefect's runner, seeing its process exit -9
            client.set_flow_run_state(run_id, Crashed(message="exited -9"), force=True)
    # Without the fix the round waits for the slot until this timeout, then fails.
    monkeypatch.setenv(TIMEOUT_ENV, "30")
    store = Store(tmp_path / "store")
    store.create(dataset, verl_rows(4))
    started = time.monotonic()
    state = generation_round(dataset, round_config(store), {"step": 1}, return_state=True)
    waited = time.monotonic() - started
    assert state.is_completed(), state.message
    assert waited < 20, f"the round waited {waited:.0f} s for the slot"
    assert store.head_version(dataset) == 1
    assert active_slots(dataset) == 0  # and released it


def test_a_round_that_cannot_get_its_slot_says_who_holds_it_and_what_to_do(
        holder: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect import flow

    dataset = "slot-busy"
    run_id, _ = holder(dataset, "hold")  # alive, renewing: never freed by a waiter

    @flow(name="slot-waiter")
    def wait_for_slot() -> None:
        with slot.dataset_slot(dataset):
            pass

    monkeypatch.setenv(TIMEOUT_ENV, "1.5")
    started = time.monotonic()
    with pytest.raises(TimeoutError) as caught:
        wait_for_slot()
    assert time.monotonic() - started < 15
    message = str(caught.value)
    assert "no round slot after 1.5 s" in message  # waited as long as the variable says
    assert "Expected the round holding the Prefect global concurrency limit " \
           f"'dyngen-round-{dataset}' to end or its lease to lapse" in message
    assert "found it held by flow run " in message and run_id in message
    assert "Running" in message  # the holder's state
    assert TIMEOUT_ENV in message  # what to do: wait longer, or free it
    assert f"prefect gcl update dyngen-round-{dataset} --active-slots 0" in message
    assert active_slots(dataset) == 1  # a live holder's slot is left alone


@pytest.mark.parametrize("value", ["soon", "0", "-5", "nan", "inf"])
def test_a_slot_timeout_that_is_not_a_number_of_seconds_is_refused(
        value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TIMEOUT_ENV, value)
    with pytest.raises(ValueError, match=f"{TIMEOUT_ENV}: expected a number of "
                                         f"seconds > 0; found '{value}'"):
        slot.slot_timeout()
    monkeypatch.setenv(TIMEOUT_ENV, " 90 ")
    assert slot.slot_timeout() == 90.0
    monkeypatch.delenv(TIMEOUT_ENV)
    assert slot.slot_timeout() == slot.GUARD_TIMEOUT_SECONDS
