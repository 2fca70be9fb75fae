"""The temporary Prefect server, kept for the next command until it has been idle a while.

Without PREFECT_API_URL, a `dyngen round` (or a trainer's inline round) needs a Prefect
server, and starting one takes from seconds to a minute. The first command starts a
*keeper* (`python -m dyngen.server.keeper`, its own session, detached from the command),
which starts the database (PostgreSQL under the Prefect home where the extra is installed)
and the same server Prefect's own temporary server is (uvicorn on Prefect's app, no UI),
and records it in a state file under `~/.cache/dyngen/servers/` (dyngen.locations.user_cache),
one per Prefect home, database and Prefect install. The next command finds it there, checks
that it is alive and ours (the keeper's PID runs the keeper with the state's token, the
server answers /health), and uses it.

Every process that uses it holds a shared lock on `<key>.lock` while it lives (released by
the kernel when it ends, whatever the way). The keeper takes that lock exclusively, without
waiting, every few seconds: once nobody has held it for DYNGEN_SERVER_IDLE_TIMEOUT seconds
(600 by default), it removes the state file while holding it (so no command can start using
the server then), stops the server and the database, and exits. The server is sent SIGTERM
if the keeper dies any other way. A stale state file (the keeper gone, its PID reused, the
server not answering) is cleared and a fresh keeper started. `DYNGEN_SERVER_IDLE_TIMEOUT=0`:
no keeper; Prefect's temporary server stops with the command, as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from dyngen.locations import user_cache
from dyngen.server.processes import seconds_setting

IDLE_ENV = "DYNGEN_SERVER_IDLE_TIMEOUT"
IDLE_SECONDS = 600.0
MODULE = "dyngen.server.keeper"  # the keeper process runs this module
_leases: dict[str, int] = {}  # key → the descriptor holding this process's shared lock


def idle_timeout() -> float:
    """Seconds a kept server stays up unused: $DYNGEN_SERVER_IDLE_TIMEOUT, else 600 (0: none
    is kept; the server stops with the command that started it)."""
    return seconds_setting(
        IDLE_ENV, IDLE_SECONDS, zero_ok=True,
        expected="a number of seconds >= 0 (0: stop the temporary Prefect server with the "
                 "command)", advice=f"Unset it for the default {IDLE_SECONDS:.0f} s.")


@dataclass(frozen=True)
class Kept:
    """A kept server as its state file records it."""

    key: str
    pid: int  # the keeper's
    server_pid: int
    port: int
    token: str
    idle: float

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"


def server_key(settings: Any, database: str) -> str:
    """Which kept server this process may use: one per Prefect home, database and install."""
    import prefect

    url = settings.server.database.connection_url
    given = url.get_secret_value() if url is not None else ""
    if not ({"connection_url", "driver"} & settings.server.database.model_fields_set):
        given = ""
    what = [str(Path(settings.home).resolve()), database, given, prefect.__version__,
            sys.executable]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]


def folder() -> Path:
    """Where kept servers are recorded (made private on first use)."""
    path = user_cache("servers")
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def state_file(key: str) -> Path:
    return folder() / f"{key}.json"


def read_state(key: str) -> Kept | None:
    """The kept server the state file records, if it holds one (alive or not)."""
    try:
        data = json.loads(state_file(key).read_text())
        return Kept(key, int(data["pid"]), int(data["server_pid"]), int(data["port"]),
                    str(data["token"]), float(data["idle"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_ours(kept: Kept) -> bool:
    """Whether the keeper and the server it records run, and the server answers."""
    if not (_alive(kept.pid) and _alive(kept.server_pid)):
        return False
    try:  # a reused PID runs something else
        cmdline = Path(f"/proc/{kept.pid}/cmdline").read_bytes().split(b"\0")
        if MODULE.encode() not in cmdline or kept.token.encode() not in cmdline:
            return False
    except OSError:
        pass  # no /proc: the health check decides
    try:
        return httpx.get(f"{kept.api_url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def use_kept(key: str) -> Kept | None:
    """The kept server for `key` if one is alive and ours, now leased by this process."""
    lease(key)
    kept = read_state(key)
    return kept if kept is not None and is_ours(kept) else None


def find_or_start(key: str, env: dict[str, str], idle: float, timeout: float,
                  on_start: Any = None) -> tuple[Kept, bool]:
    """The kept server for `key`, leased by this process, and whether this call started it.

    `on_start()` is called before a start (to say what the wait is for). Concurrent commands
    wait for one start rather than each starting a server.
    """
    with _locked(folder() / f"{key}.start"):
        found = use_kept(key)
        if found is not None:
            return found, False
        stale = read_state(key)
        if stale is not None:  # the keeper gone, its PID reused, or its server not answering
            _end_stale(stale)
            with contextlib.suppress(FileNotFoundError):
                state_file(key).unlink()
        if on_start is not None:
            on_start()
        return _start(key, env, idle, timeout), True


def lease(key: str) -> None:
    """Hold the shared lock that keeps the server for `key` up, until this process ends."""
    if key in _leases:
        return
    fd = os.open(folder() / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)  # the keeper holds it exclusively only for a moment
    _leases[key] = fd


def leased(key: str) -> bool:
    """Whether this process holds the server for `key` up already."""
    return key in _leases


def release(key: str) -> None:
    """Stop holding the server for `key` up (it stops after its idle timeout)."""
    fd = _leases.pop(key, None)
    if fd is not None:
        os.close(fd)


def _start(key: str, env: dict[str, str], idle: float, timeout: float) -> Kept:
    from dyngen.server.processes import spawn, stop

    token = uuid.uuid4().hex
    log = folder() / f"{key}.log"
    proc = spawn([sys.executable, "-m", MODULE, "--key", key, "--token", token,
                  "--idle", str(idle), "--timeout", str(timeout)], env, log)
    deadline = time.monotonic() + timeout + 30  # the keeper gives up at `timeout` itself
    try:
        while time.monotonic() < deadline:
            kept = read_state(key)
            if kept is not None and kept.token == token:
                return kept
            if proc.poll() is not None:
                raise RuntimeError(f"its keeper exited with code {proc.returncode}; see {log}")
            time.sleep(0.1)
        raise TimeoutError(f"not healthy after {timeout:.0f} s; see {log}")
    except BaseException:
        stop(proc)
        raise


def _end_stale(kept: Kept) -> None:
    """Stop a keeper of ours whose server does not answer (nothing if it is not ours)."""
    try:
        cmdline = Path(f"/proc/{kept.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return
    if MODULE.encode() in cmdline and kept.token.encode() in cmdline:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(kept.pid, signal.SIGTERM)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def unused(lock: Path) -> bool:
    """Whether no process holds the server up (takes and drops the exclusive lock)."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True
