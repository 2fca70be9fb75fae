"""Ctrl-C stops `dyngen serve` (both isolation modes) and `dyngen follow` at once.

A terminal sends SIGINT to the foreground process group: so does each test, to the
command started in a session of its own, then checks that every process of that session
(the command, a fork server, a runner's children) is gone within 5 s.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.rows import verl_rows
from tests.support import as_a_terminal_job

REPO = Path(__file__).resolve().parents[1]
# Real `dyngen serve` and `dyngen follow` processes and their children: end to end.
pytestmark = pytest.mark.e2e
# Gone within seconds, where a process that waited for its round, a lease or a server would
# take minutes; the bound leaves room for a machine whose other core is busy (both pytest
# workers run at once), where an interpreter that imported Prefect takes seconds to end.
STOP_SECONDS = 15.0


def start(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """`dyngen ARGS` in a new session (its own process group, as a shell job has)."""
    return subprocess.Popen([sys.executable, "-m", "dyngen.cli", *args], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=as_a_terminal_job)


def wait_for_output(proc: subprocess.Popen[str], needle: str, timeout: float = 120) -> str:
    """Read the command's output until a line holds `needle` (it is ready)."""
    assert proc.stdout is not None
    seen: list[str] = []
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sel.select(timeout=1.0):
                line = proc.stdout.readline()
                if not line and proc.poll() is not None:
                    break
                seen.append(line)
                if needle.lower() in line.lower():
                    return "".join(seen)
    proc.kill()
    raise AssertionError(f"never printed {needle!r}:\n{''.join(seen)}")


def drained(proc: subprocess.Popen[str]) -> list[str]:
    """The command's further output, read on a thread as it comes: a pipe nobody reads
    fills (64 KiB) and blocks every process writing to it, a round's included."""
    lines: list[str] = []
    assert proc.stdout is not None
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")),
                     daemon=True).start()
    return lines


def session_processes(sid: int) -> list[psutil.Process]:
    """Every live process in session `sid` (children, and any that were re-parented)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return found


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those of `procs` still running (a zombie has ended; only its parent's wait is due)."""
    out = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:
            continue
    return out


def interrupt_and_wait(proc: subprocess.Popen[str]) -> float:
    """SIGINT to the process group once; seconds until none of its processes is left."""
    time.sleep(1.0)  # its polling loop is running
    # Every descendant (one may have a session of its own) and the session's processes.
    before = {p.pid: p for p in [*psutil.Process(proc.pid).children(recursive=True),
                                 *session_processes(proc.pid)]}
    started = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    deadline = started + STOP_SECONDS
    while time.monotonic() < deadline:
        proc.poll()
        if proc.returncode is not None and not alive([*before.values(),
                                                      *session_processes(proc.pid)]):
            return time.monotonic() - started
        time.sleep(0.05)
    left = alive([*before.values(), *session_processes(proc.pid)])
    described = [(p.pid, " ".join(p.cmdline())[:100]) for p in left]
    for p in left:
        p.kill()
    proc.kill()
    proc.wait(10)
    raise AssertionError(f"still running {STOP_SECONDS} s after one Ctrl-C: {described}")


@pytest.fixture
def api_url(prefect_server: None) -> str:
    from prefect.settings import PREFECT_API_URL

    return str(PREFECT_API_URL.value())


@pytest.mark.parametrize("isolation", ["fork", "process"])
def test_one_ctrl_c_stops_serve_and_all_its_processes(api_url: str, tmp_path: Path,
                                                      isolation: str) -> None:
    from dyngen.store import Store

    Store(tmp_path / "store").create("ds", verl_rows(2))
    proc = start(["--root", str(tmp_path / "store"), "serve", "--dataset", "ds",
                  "--isolation", isolation, "data.datagen.path=pkg://dyngen.generators.base",
                  "data.datagen.name=MockDataGenerator"],  # serve needs a named generator
                 {"PREFECT_API_URL": api_url})
    wait_for_output(proc, "serving" if isolation == "fork" else "being served")
    took = interrupt_and_wait(proc)
    print(f"serve --isolation {isolation}: stopped {took:.2f} s after SIGINT")
    assert proc.returncode in (0, 130)
    assert proc.stdout is not None
    assert "Traceback" not in proc.stdout.read()


@pytest.mark.parametrize("isolation", ["fork", "process"])
def test_one_ctrl_c_stops_serve_with_a_round_in_flight(api_url: str, tmp_path: Path,
                                                       isolation: str) -> None:
    from dyngen.store import Store
    from dyngen.trainers.events import emit_batch_end

    Store(tmp_path / "store").create("ds", verl_rows(2))
    marks = {k: tmp_path / k for k in ("started", "release", "finished")}
    proc = start(["--root", str(tmp_path / "store"), "serve", "--dataset", "ds",
                  "--isolation", isolation, "data.datagen.path=pkg://tests.flows.gens",
                  "data.datagen.name=BlockUntilReleased",
                  *(f"+data.datagen.{k}={v}" for k, v in marks.items())],
                 {"PREFECT_API_URL": api_url})
    wait_for_output(proc, "serving" if isolation == "fork" else "being served")
    output = drained(proc)
    assert emit_batch_end("ds", step=1, api_url=api_url) is not None
    deadline = time.monotonic() + 180
    while not marks["started"].exists():
        assert time.monotonic() < deadline and proc.poll() is None, \
            "the round never started; serve's output:\n" + "".join(output[-60:])
        time.sleep(0.2)
    took = interrupt_and_wait(proc)
    print(f"serve --isolation {isolation}, a round in flight: stopped {took:.2f} s after SIGINT")
    assert not marks["finished"].exists()  # stopped, not waited for
    assert Store(tmp_path / "store").head("ds").version == 0  # and committed nothing


def test_one_ctrl_c_stops_follow(tmp_path: Path) -> None:
    from dyngen.store import Store

    Store(tmp_path / "store").create("ds", verl_rows(2))
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("")
    proc = start(["--root", str(tmp_path / "store"), "follow", "ds", "--verl-metrics",
                  str(metrics), "--poll-seconds", "0.2"], {"PREFECT_API_URL": ""})
    wait_for_output(proc, "following")
    took = interrupt_and_wait(proc)
    print(f"follow: stopped {took:.2f} s after SIGINT")
    assert proc.returncode in (0, 130)
