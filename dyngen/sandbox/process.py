"""A warm sandbox: one bwrap (or unisolated) supervisor that serves runs one at a time.

The supervisor (runner.py) starts once; each run is a child it forks from its already started
interpreter, so a run costs a fork instead of a bwrap and an interpreter. Only the supervisor
writes the result channel; this side reads one bounded frame per run and checks its shape
strictly (anything else is "crashed"). A sandbox that fails any check (a malformed or late
reply, a /tmp left unclean, a dead supervisor) is marked broken and its owner replaces it.
"""

from __future__ import annotations

import ast
import contextlib
import json
import math
import os
import queue
import selectors
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dyngen.sandbox.bwrap import SANDBOX_GID, SANDBOX_UID, bwrap_command, interpreter
from dyngen.sandbox.cgroup import Cgroup, note_unbounded
from dyngen.sandbox.seccomp import mounts_filter, seccomp_problem, system_calls_filter

MAX_DETAIL = 500
REASONS = ("timeout", "memory", "error", "forbidden", "output_limit", "crashed",
           "nondeterministic")
TMP_BYTES, TMP_INODES = 16 << 20, 4096
_RUNNER = (Path(__file__).with_name("runner.py")).read_text(encoding="utf-8")
_PYTHON_ARGS = ["-S", "-s", "-B", "-c", _RUNNER]
_START_SECONDS = 30.0
_GRACE_SECONDS = 5.0  # the supervisor's own clean-up after a run's deadline
_MAX_RUNS = 5000  # a sandbox is replaced after this many runs, whatever its checks said


class _Spawner:
    """The one long-lived thread that starts every sandbox. bwrap's --die-with-parent is the
    kernel's parent-death signal, sent when the THREAD that forked it ends: a sandbox
    started by a short-lived worker thread would die with that thread. A daemon thread
    lives until the process ends, after its atexit hooks have closed the pool in order."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[Any, tuple[Any, ...], dict[str, Any], Future[Any]]]
        self.jobs = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="dyngen-sandbox-spawner", daemon=True).start()

    def _serve(self) -> None:
        while True:
            call, args, kwargs, future = self.jobs.get()
            try:
                future.set_result(call(*args, **kwargs))
            except BaseException as error:  # handed to the caller's thread
                future.set_exception(error)

    def submit(self, call: Any, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run `call` on the spawner's thread."""
        future: Future[Any] = Future()
        self.jobs.put((call, args, kwargs, future))
        return future


_spawner_now: list[_Spawner] = []
_spawn_lock = threading.Lock()


def _spawner() -> _Spawner:
    """The process's spawner thread, started on first use."""
    with _spawn_lock:
        if not _spawner_now:
            _spawner_now.append(_Spawner())
        return _spawner_now[0]


def _forget_spawner() -> None:
    global _spawn_lock
    _spawn_lock = threading.Lock()
    _spawner_now.clear()  # its thread is not in a forked child


os.register_at_fork(after_in_child=_forget_spawner)


class SandboxBroken(Exception):
    """A warm sandbox failed a check; it must be replaced."""


@dataclass(frozen=True)
class SandboxResult:
    """What one run gave: the return value's repr, or why there is none."""

    ok: bool
    value: str | None = None  # repr() of the return value
    reason: str | None = None  # one of REASONS when not ok
    detail: str = ""  # at most MAX_DETAIL characters: the error, the limit hit
    seconds: float = 0.0

    @staticmethod
    def failed(reason: str, detail: str, seconds: float = 0.0) -> SandboxResult:
        """A run that gave no value, for `reason`."""
        return SandboxResult(False, None, reason, detail[:MAX_DETAIL], seconds)


def limits(timeout_seconds: float, memory_mb: int) -> dict[str, int]:
    """A run's rlimits; the wall-clock timeout ends the run first, CPU is a backstop."""
    return {"RLIMIT_CPU": math.ceil(timeout_seconds) + 1, "RLIMIT_AS": memory_mb << 20,
            "RLIMIT_FSIZE": 1 << 20, "RLIMIT_NPROC": 1, "RLIMIT_NOFILE": 64,
            "RLIMIT_CORE": 0}


def checked_header(header: Any, limit: int) -> tuple[str | None, str, bool, int]:
    """(reason, detail, clean, report bytes that follow) from the supervisor's reply header,
    whose shape must be exact; SandboxBroken for anything else."""
    if type(header) is not dict or set(header) != {"reason", "detail", "report", "clean"}:
        raise SandboxBroken(f"a reply of the wrong shape: {str(header)[:200]}")
    reason, detail, report, clean = (header[k] for k in ("reason", "detail", "report", "clean"))
    if (type(detail) is not str or len(detail) > MAX_DETAIL or type(clean) is not bool
            or type(report) is not int or not 0 <= report <= limit
            or (reason is None) != (report > 0)
            or (reason is not None and reason not in REASONS)):
        raise SandboxBroken(f"a reply of the wrong shape: {str(header)[:200]}")
    return reason, detail, clean, report


def checked_report(report: Any, max_value_chars: int) -> tuple[bool, str | None, str | None,
                                                                str]:
    """(ok, value, reason, detail) from the run's own report, whose shape must be exact: `ok`
    a bool, `value` a str within `max_value_chars` (None when not ok), `reason` one of the
    reasons (None when ok), `detail` a str of at most MAX_DETAIL; SandboxBroken otherwise."""
    if type(report) is not dict or set(report) != {"ok", "value", "reason", "detail"}:
        raise SandboxBroken(f"a report of the wrong shape: {str(report)[:200]}")
    ok, value, reason, detail = (report[k] for k in ("ok", "value", "reason", "detail"))
    if type(detail) is not str or len(detail) > MAX_DETAIL:
        raise SandboxBroken("a report whose detail has the wrong shape")
    if ok is True and type(value) is str and len(value) <= max_value_chars and reason is None:
        return ok, value, reason, detail
    if ok is False and value is None and reason in REASONS:
        return ok, value, reason, detail
    raise SandboxBroken(f"a report of the wrong shape: ok={ok!r}, reason={reason!r}")


def _literal(data: bytes) -> Any:
    """The Python literal `data` holds; SandboxBroken if it holds none."""
    try:
        return ast.literal_eval(data.decode())
    except (ValueError, SyntaxError, TypeError, UnicodeDecodeError, MemoryError,
            RecursionError) as error:
        raise SandboxBroken(f"an unreadable reply ({type(error).__name__})") from error


class WarmSandbox:
    """One supervisor serving runs of one (isolation, hash seed, memory) one at a time."""

    def __init__(self, isolation: str, hash_seed: int, memory_mb: int) -> None:
        self.isolation, self.hash_seed, self.memory_mb = isolation, hash_seed, memory_mb
        self.broken, self.runs = False, 0
        self.cgroup: Cgroup | None = None
        self.sandbox_pid: int | None = None  # bwrap's child: the sandbox's PID 1
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in forget()
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        env = {"PYTHONHASHSEED": str(self.hash_seed), "PYTHONUTF8": "1", "HOME": "/tmp",
               "LC_ALL": "C.UTF-8"}
        as_root = os.geteuid() == 0
        uid = SANDBOX_UID if as_root else None
        result_r, result_w = os.pipe()
        ours, theirs = [result_r], [result_w]
        try:
            if self.isolation == "bwrap":
                seccomp_r, seccomp_w = os.pipe()
                info_r, info_w = os.pipe()
                ours += [info_r]
                theirs += [seccomp_r, info_w]
                os.write(seccomp_w, system_calls_filter())  # < 1 KiB: a pipe holds it
                os.close(seccomp_w)
                command, uid = bwrap_command(_PYTHON_ARGS, env, info_w, seccomp_r, TMP_BYTES)
                cwd, popen_env = "/", {}
                setup = {"mount_tmp": as_root, "tmp": "/tmp", "own_pid_namespace": True,
                         "seccomp": [mounts_filter()]}
            else:
                self._tmp = tempfile.TemporaryDirectory(prefix="dyngen-sandbox-")
                os.chmod(self._tmp.name, 0o777)  # the run's uid (nobody, as root) writes there
                command, cwd = [str(interpreter()), *_PYTHON_ARGS], self._tmp.name
                popen_env = {**env, "HOME": self._tmp.name}
                filters = [] if seccomp_problem() else [system_calls_filter(), mounts_filter()]
                setup = {"mount_tmp": False, "tmp": self._tmp.name, "own_pid_namespace": False,
                         "seccomp": filters}
            setup.update(result_fd=result_w, uid=uid, gid=SANDBOX_GID if uid else None,
                         tmp_bytes=TMP_BYTES, tmp_inodes=TMP_INODES)
            self.cgroup = Cgroup.create((self.memory_mb + 96) << 20, 64)
            self.proc = _spawner().submit(
                subprocess.Popen, command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                stderr=self._log, cwd=cwd, env=popen_env, start_new_session=True,
                pass_fds=tuple(theirs)).result()
        finally:
            for fd in theirs:
                os.close(fd)
        self._result, self._info = result_r, (ours[1] if len(ours) > 1 else None)
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                self.cgroup.add(self.proc.pid)  # before bwrap forks the sandbox, mostly
        self._send(setup)
        ready = self._receive(time.monotonic() + _START_SECONDS, 4096)
        if not isinstance(ready, dict) or ready.get("ready") is not True:
            raise SandboxBroken(f"the sandbox did not start: {ready!r}; {self.log()}")
        if self._info is not None:
            self._note_child()
        if self.cgroup is not None and self.sandbox_pid is not None:
            with contextlib.suppress(OSError):
                self.cgroup.add(self.sandbox_pid)

    def alive(self) -> bool:
        """Whether the supervisor is still there to serve a run."""
        return not self.broken and self.proc.poll() is None

    def log(self) -> str:
        """The end of what the supervisor (or bwrap) wrote to stderr."""
        with contextlib.suppress(OSError, ValueError):
            self._log.seek(0)
            return self._log.read().decode("utf-8", "replace")[-600:].strip()
        return ""

    def _note_child(self) -> None:
        """bwrap's --info-fd JSON names its child, the sandbox's PID 1."""
        assert self._info is not None
        os.set_blocking(self._info, False)
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            self.sandbox_pid = int(json.loads(os.read(self._info, 4096))["child-pid"])

    def _send(self, message: dict[str, Any], body: bytes = b"") -> None:
        """One frame to the supervisor's stdin, and `body` after it."""
        assert self.proc.stdin is not None
        data = repr(message).encode()
        try:
            self.proc.stdin.write(len(data).to_bytes(4, "big") + data + body)
            self.proc.stdin.flush()
        except (OSError, ValueError) as error:
            raise SandboxBroken(f"the supervisor is gone ({error}); {self.log()}") from error

    def _receive_bytes(self, size: int, deadline: float) -> bytes:
        """Exactly `size` bytes from the result channel, read by `deadline`."""
        data = b""
        with selectors.DefaultSelector() as sel:
            sel.register(self._result, selectors.EVENT_READ)
            while len(data) < size:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise TimeoutError
                chunk = os.read(self._result, size - len(data))
                if not chunk:
                    raise SandboxBroken(f"the supervisor ended; {self.log()}")
                data += chunk
        return data

    def _receive(self, deadline: float, limit: int) -> Any:
        """One frame (length, literal) from the result channel, at most `limit` bytes."""
        size = int.from_bytes(self._receive_bytes(4, deadline), "big")
        if size > limit:
            raise SandboxBroken(f"a reply of {size} bytes, over {limit}")
        return _literal(self._receive_bytes(size, deadline))

    def run(self, program: str, function: str, literal: str, *, timeout_seconds: float,
            max_output_bytes: int, max_value_chars: int) -> SandboxResult:
        """One run; a sandbox that fails a check on the way is marked broken."""
        start = time.monotonic()
        if self.cgroup is None:
            note_unbounded()
        self.runs += 1
        home = "/tmp" if self._tmp is None else self._tmp.name
        # The body only the run's child reads (the supervisor's heap is every later run's).
        body = repr({"program": program, "function": function, "argument": literal,
                     "limits": limits(timeout_seconds, self.memory_mb),
                     "env": {"PYTHONHASHSEED": str(self.hash_seed), "PYTHONUTF8": "1",
                             "HOME": home, "PWD": home, "LC_ALL": "C.UTF-8"}}).encode()
        request = {"max_value_chars": max_value_chars, "max_output_bytes": max_output_bytes,
                   "timeout": timeout_seconds, "size": len(body)}
        deadline = start + timeout_seconds + _GRACE_SECONDS
        try:
            self._send(request, body)
            reason, detail, clean, size = checked_header(self._receive(deadline, 8192),
                                                         4 * max_value_chars + 4096)
            ok, value = False, None
            if size:  # the run's own report, forwarded unread by the supervisor
                report = self._receive_bytes(size, deadline)
                if int.from_bytes(report[:4], "big") != size - 4:
                    raise SandboxBroken("a report that is not one frame")
                ok, value, reason, detail = checked_report(_literal(report[4:]),
                                                           max_value_chars)
        except TimeoutError:
            self.broken = True
            return SandboxResult.failed("timeout", f"still running after {timeout_seconds:g} s",
                                        time.monotonic() - start)
        except SandboxBroken as error:
            self.broken = True
            return SandboxResult.failed("crashed", str(error), time.monotonic() - start)
        if not clean or reason == "crashed" or self.runs >= _MAX_RUNS:
            self.broken = True
        return SandboxResult(ok, value, reason, detail, time.monotonic() - start)

    def close(self) -> None:
        """End the supervisor, every process of the sandbox and its cgroup."""
        proc = getattr(self, "proc", None)
        if proc is not None:
            if proc.poll() is None and self.sandbox_pid is not None:
                # The sandbox's PID 1: its death ends its PID namespace, then bwrap reaps it
                # and exits (killing bwrap first would leave it a zombie of init's, holding
                # its cgroup). It is not reaped while bwrap lives: its pid is not reused.
                _kill(self.sandbox_pid)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(1)
            if proc.poll() is None:
                _kill(-proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        self.forget()
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                self._tmp.cleanup()
            self._tmp = None

    def forget(self) -> None:
        """Close this side's descriptors without touching the processes (after a fork, the
        child's copies must not keep the parent's sandbox open)."""
        for name in ("_result", "_info"):
            fd = getattr(self, name, None)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, None)
        with contextlib.suppress(OSError, ValueError):
            self._log.close()


def execute(program: str, function: str, literal: str, *, timeout_seconds: float,
            memory_mb: int, isolation: str, hash_seed: int = 0, max_output_bytes: int = 1 << 20,
            max_value_chars: int = 10_000) -> SandboxResult:
    """The cold path: one run in a sandbox started for it and ended after it."""
    start = time.monotonic()
    try:
        box = WarmSandbox(isolation, hash_seed, memory_mb)
    except (SandboxBroken, TimeoutError) as error:
        return SandboxResult.failed("crashed", f"the sandbox did not start: {error}",
                                    time.monotonic() - start)
    try:
        result = box.run(program, function, literal, timeout_seconds=timeout_seconds,
                         max_output_bytes=max_output_bytes, max_value_chars=max_value_chars)
    finally:
        box.close()
    return SandboxResult(result.ok, result.value, result.reason, result.detail,
                         time.monotonic() - start)


def _kill(pid: int) -> None:
    """SIGKILL `pid` (a negative pid: its process group) if it is still there."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
