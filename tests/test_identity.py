"""A process's identity names one process of one machine, ever: a serve's lease and a
PostgreSQL cluster's users go by it to tell a dead holder from a live one."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from dyngen.server.identity import process_identity, process_is_gone


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_only_a_process_that_has_exited_counts_as_gone() -> None:
    child = subprocess.Popen(["sleep", "30"])
    identity = process_identity(child.pid)
    assert identity is not None
    machine, pid, started = identity.split("/")
    try:
        assert not process_is_gone(identity)  # alive: never freed
        assert process_is_gone(f"{machine}/{pid}/{int(started) + 1}")  # pid reused
        assert not process_is_gone(f"other-machine/{pid}/{started}")
        assert not process_is_gone("")  # unknown: the lease lapses on its own
        child.kill()
        deadline = time.monotonic() + 10
        while not process_is_gone(identity):  # a zombie until reaped
            assert time.monotonic() < deadline, "a killed child never counted as gone"
            time.sleep(0.01)
    finally:
        child.kill()
        child.wait()
    assert process_is_gone(identity)
