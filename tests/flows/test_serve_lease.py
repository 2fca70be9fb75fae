"""One `dyngen serve` per dataset: the lease in the store (dyngen.runtime.serve_lease).

A real store in tmp_path (and on S3, moto's server); holders are this process, a process
that has exited, or a process of another machine as its lease file records it. The
processes' side (a second `dyngen serve` refused, a killed one's lease taken over) is in
tests/flows/test_serve_once.py.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from dyngen.runtime.serve_lease import (
    LEASE_DIR,
    STALE_SECONDS,
    Holder,
    LeaseLostError,
    ServeBusyError,
    ServeLease,
    store_lease,
)
from dyngen.server.identity import process_identity, process_is_gone
from dyngen.store import Store

ANOTHER_MACHINE = "0c0ffee0-boot:pid:[4026531836]/4242/99"


def lease(root: Path, dataset: str | None = "ds") -> ServeLease:
    return store_lease({"root": str(root)}, dataset)


def plant(root: Path, key: str, generation: int, holder: Holder) -> None:
    """A lease file as another serve left it."""
    Store(root).backend.write_new(f"{LEASE_DIR}/{key}/{generation:020d}.json",
                                  holder.to_bytes())


def holder_of(process: str, pid: int = 4242, host: str = "gpu-7", age: float = 0.0,
              dataset: str | None = "ds") -> Holder:
    at = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() - age))
    return Holder(process, host, pid, dataset, at, at)


def dead_identity() -> tuple[str, int]:
    child = subprocess.Popen(["sleep", "30"])
    identity = process_identity(child.pid)
    child.kill()
    child.wait()
    assert identity is not None and process_is_gone(identity)
    return identity, child.pid


def test_a_second_serve_of_a_dataset_is_refused_in_one_line_naming_the_holder(
        tmp_path: Path) -> None:
    first = lease(tmp_path)
    assert first.acquire() is None
    with pytest.raises(ServeBusyError) as refused:
        lease(tmp_path).acquire()
    message = str(refused.value)
    assert "\n" not in message
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in message
    assert "serving since" in message and "stop that serve first" in message
    assert f"store {tmp_path}" in message
    # Another dataset of the store is another lease.
    assert lease(tmp_path, "other").acquire() is None


def test_a_lease_whose_process_is_gone_is_taken_over_at_once_saying_so(
        tmp_path: Path) -> None:
    identity, pid = dead_identity()
    plant(tmp_path, "ds", 3, holder_of(identity, pid=pid, host=socket.gethostname()))
    taker = lease(tmp_path)
    note = taker.acquire()
    assert note is not None and f"its process (pid {pid} on" in note and "is gone" in note
    assert taker.generation == 4
    # Only the newest generation is kept.
    assert Store(tmp_path).backend.list(f"{LEASE_DIR}/ds") == [f"{4:020d}.json"]


def test_another_machines_lease_holds_while_renewed_and_lapses_after_30_s(
        tmp_path: Path) -> None:
    plant(tmp_path, "ds", 0, holder_of(ANOTHER_MACHINE, age=5))
    with pytest.raises(ServeBusyError) as refused:
        lease(tmp_path).acquire()
    assert "pid 4242 on host gpu-7" in str(refused.value)
    assert re.search(r"renewed [56] s ago", str(refused.value))

    plant(tmp_path, "ds", 1, holder_of(ANOTHER_MACHINE, age=STALE_SECONDS + 5))
    note = lease(tmp_path).acquire()
    assert note is not None and re.search(r"not renewed for 3[56] s \(pid 4242 on gpu-7\)", note)


def test_a_released_lease_is_taken_at_once_without_a_word(tmp_path: Path) -> None:
    first = lease(tmp_path)
    first.acquire()
    first.release()
    second = lease(tmp_path)
    assert second.acquire() is None
    assert second.generation == 1  # generations never repeat


def test_serving_every_dataset_and_serving_one_refuse_each_other(tmp_path: Path) -> None:
    one = lease(tmp_path, "ds")
    one.acquire()
    with pytest.raises(ServeBusyError) as refused:
        lease(tmp_path, None).acquire()
    assert "cannot serve every dataset" in str(refused.value)
    assert "a `dyngen serve` of dataset 'ds'" in str(refused.value)
    one.release()

    every = lease(tmp_path, None)
    every.acquire()
    with pytest.raises(ServeBusyError) as refused:
        lease(tmp_path, "other").acquire()
    assert "a `dyngen serve` of every dataset" in str(refused.value)
    # The refused serve left nothing behind: once the store's serve ends, it can start.
    every.release()
    assert lease(tmp_path, "other").acquire() is None


def test_a_serve_whose_lease_was_taken_over_learns_it_at_its_next_renewal(
        tmp_path: Path) -> None:
    stalled = lease(tmp_path)
    stalled.acquire()
    stalled.renew()  # still its own
    # It stalled past STALE_SECONDS (as its file says); another serve took the lease over.
    plant(tmp_path, "ds", 1, holder_of(ANOTHER_MACHINE, host="gpu-9"))
    with pytest.raises(LeaseLostError) as lost:
        stalled.renew()
    assert "taken over by a `dyngen serve` of dataset 'ds' (pid 4242 on host gpu-9" \
        in str(lost.value)
    stalled.release()  # leaves the taker's lease alone
    with pytest.raises(ServeBusyError):
        lease(tmp_path).acquire()


def test_the_lease_lives_in_the_store_so_an_s3_root_works_too(
        s3_endpoint: str) -> None:
    from tests.store.conftest import new_bucket, s3_options

    store = {"root": f"s3://{new_bucket(s3_endpoint)}/stores/main",
             "storage_options": s3_options(s3_endpoint)}
    first = store_lease(store, "ds")
    assert first.acquire() is None
    with pytest.raises(ServeBusyError) as refused:
        store_lease(store, "ds").acquire()
    assert f"pid {os.getpid()}" in str(refused.value)
    first.release()
    assert store_lease(store, "ds").acquire() is None
