"""Child processes of ours: started in their own process group, stopped by PID.

Stopping the group stops everything the child started (a flow run of a serve process,
a server's workers), and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx

from dyngen.errors import ConfigError


def free_port() -> int:
    """An unused TCP port on the loopback interface."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn(args: Sequence[str], env: Mapping[str, str], log: Path, cwd: Path | None = None,
          user: pwd.struct_passwd | None = None,
          die_with_parent: bool = False) -> subprocess.Popen[bytes]:
    """Start a process in its own process group, output to `log` (as `user`, if given);
    with `die_with_parent`, it is sent SIGTERM when this process dies, even by SIGKILL
    (Linux: PR_SET_PDEATHSIG)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    as_user = {} if user is None else {"user": user.pw_uid, "group": user.pw_gid,
                                       "extra_groups": []}
    if die_with_parent:
        as_user["preexec_fn"] = _term_when_parent_dies
    with open(log, "ab") as out:
        return subprocess.Popen(list(args), env=dict(env), cwd=cwd, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, **as_user)  # type: ignore[call-overload]


def wait_healthy(api_url: str, timeout: float = 180.0,
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



def _term_when_parent_dies() -> None:
    """In the child before exec: SIGTERM once its parent dies (nothing where not Linux)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


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


class OwnedProcess:
    """Something that starts one child process of ours (`self.process`) and stops it."""

    process: subprocess.Popen[bytes] | None = None

    def stop_process(self) -> None:
        """Stop the child and its group by PID, if it runs; then forget it."""
        if self.process is not None:
            stop(self.process)
            self.process = None

    def stop(self) -> None:
        """Stop everything this object started (override to stop more than the child)."""
        self.stop_process()

    @contextlib.contextmanager
    def stopped_on_failure(self) -> Iterator[None]:
        """Stop everything started so far if the block fails (then let the error go on)."""
        try:
            yield
        except BaseException:
            self.stop()
            raise


def seconds_setting(name: str, default: float, *, zero_ok: bool, expected: str,
                    advice: str) -> float:
    """A number of seconds from the environment variable `name` (unset or empty: `default`);
    a ConfigError saying `expected`, what was found and `advice` for anything else, or 0
    unless `zero_ok`."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0 or (value == 0 and not zero_ok):
        raise ConfigError(f"{name}: expected {expected}, found {raw!r}. {advice}")
    return value
