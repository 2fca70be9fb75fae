"""A local Prefect server and helper processes, started and stopped by PID.

Used by `dyngen demo` and the end-to-end tests: `prefect server start` on 127.0.0.1
with SQLite under a folder of ours, and child processes (serve, worker) in their own
process groups so that stopping one stops everything it started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

START_TIMEOUT_SECONDS = 180.0


def free_port() -> int:
    """An unused TCP port on the loopback interface."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def prefect_env(home: Path, api_url: str | None = None,
                extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for Prefect processes: our home folder, offline, quick polling."""
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_RUNNER_POLL_FREQUENCY": "1",
           # Queued (ENQUEUE) rounds retry their slot every second, not every 30 s.
           "PREFECT_SERVER_DEPLOYMENTS_CONCURRENCY_SLOT_WAIT_SECONDS": "1",
           # Round slots' leases on disk, not in server memory: a round holding one when
           # the server restarts can still renew and release it.
           "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE":
               "prefect.server.concurrency.lease_storage.filesystem",
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}
    if api_url:
        env["PREFECT_API_URL"] = api_url
    env.update(extra or {})
    return env


def spawn(args: Sequence[str], env: Mapping[str, str], log: Path,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start a process in its own process group, output to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(list(args), env=dict(env), cwd=cwd, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def stop(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """Stop a process we started and its group: SIGINT, then SIGTERM, then SIGKILL."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)  # the group id is the PID we started
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=timeout if sig != signal.SIGKILL else 10)
        except subprocess.TimeoutExpired:
            continue
    # Children that outlived the leader (e.g. a flow run) share its group id.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def wait_healthy(api_url: str, timeout: float = START_TIMEOUT_SECONDS,
                 proc: subprocess.Popen[bytes] | None = None) -> None:
    """Wait until `<api_url>/health` answers 200, or fail saying why."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the Prefect server exited with code {proc.returncode} "
                               "before becoming healthy; see its log.")
        try:
            if httpx.get(f"{api_url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"the Prefect server at {api_url} was not healthy after {timeout:.0f} s")


def wait_for_automation(api_url: str, name: str, timeout: float = 120.0,
                        settle_seconds: float = 2.0) -> None:
    """Wait until an automation (a deployment's event trigger) exists on the server.

    Events emitted before a trigger exists match nothing; after it appears, the server's
    trigger service needs a moment to load it (`settle_seconds`).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = httpx.post(f"{api_url}/automations/filter", timeout=5,
                               json={"automations": {"name": {"any_": [name]}}}).json()
        except (httpx.HTTPError, ValueError):
            found = []
        if isinstance(found, list) and found:
            time.sleep(settle_seconds)
            return
        time.sleep(0.5)
    raise TimeoutError(f"the automation {name!r} did not appear on {api_url} within "
                       f"{timeout:.0f} s; is `dyngen serve` running? See its log.")


@dataclass
class LocalServer:
    """`prefect server start` on 127.0.0.1, SQLite under `home`."""

    home: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def api_url(self) -> str:
        """The API address clients use (PREFECT_API_URL)."""
        return f"http://127.0.0.1:{self.port}/api"

    @property
    def ui_url(self) -> str:
        """The address of the Prefect UI."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        """Where the server's output goes."""
        return self.home / "server.log"

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for processes that talk to this server."""
        return prefect_env(self.home, self.api_url, extra)

    def start(self, timeout: float = START_TIMEOUT_SECONDS) -> LocalServer:
        """Start the server and wait until it is healthy."""
        self.home.mkdir(parents=True, exist_ok=True)
        prefect = Path(sys.executable).with_name("prefect")
        # The UI must call this server's API, not the default port 4200.
        env = prefect_env(self.home, extra={"PREFECT_UI_API_URL": self.api_url})
        self.process = spawn([str(prefect), "server", "start", "--host", "127.0.0.1",
                              "--port", str(self.port)], env, self.log)
        try:
            wait_healthy(self.api_url, timeout, self.process)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the server by its PID."""
        if self.process is not None:
            stop(self.process)
            self.process = None
