"""One sandboxed process: started, fed its request, read within bounds, killed if need be."""

from __future__ import annotations

import ast
import contextlib
import json
import math
import os
import selectors
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dyngen.sandbox.bwrap import bwrap_command, interpreter

MAX_DETAIL = 500
_RUNNER = (Path(__file__).with_name("runner.py")).read_text(encoding="utf-8")
_PYTHON_ARGS = ["-S", "-s", "-B", "-c", _RUNNER]


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


def execute(program: str, function: str, literal: str, *, timeout_seconds: float,
            memory_mb: int, isolation: str, hash_seed: int = 0, max_output_bytes: int = 1 << 20,
            max_value_chars: int = 10_000) -> SandboxResult:
    """run_python's run, its input already checked and `literal` the argument's text."""
    request = {"program": program, "function": function, "argument": literal,
               "max_value_chars": max_value_chars,
               "limits": _limits(timeout_seconds, memory_mb)}
    return SandboxProcess(request, isolation, timeout_seconds, max_output_bytes,
                          hash_seed).result()


def _limits(timeout_seconds: float, memory_mb: int) -> dict[str, int]:
    """The runner's rlimits; the wall-clock timeout ends the run first, CPU is a backstop."""
    return {"RLIMIT_CPU": math.ceil(timeout_seconds) + 1, "RLIMIT_AS": memory_mb << 20,
            "RLIMIT_FSIZE": 1 << 20, "RLIMIT_NPROC": 1, "RLIMIT_NOFILE": 64,
            "RLIMIT_CORE": 0}


class SandboxProcess:
    """One sandboxed process: started, fed, read within bounds, killed if need be."""

    def __init__(self, request: dict[str, Any], isolation: str, timeout_seconds: float,
                 max_output_bytes: int, hash_seed: int) -> None:
        self.request, self.isolation = request, isolation
        self.timeout, self.max_output = timeout_seconds, max_output_bytes
        self.env = {"PYTHONHASHSEED": str(hash_seed), "PYTHONUTF8": "1", "HOME": "/tmp",
                    "LC_ALL": "C.UTF-8"}
        self.child_pid: int | None = None  # bwrap's child: the sandbox's PID 1

    def result(self) -> SandboxResult:
        start = time.monotonic()
        result_r, result_w = os.pipe()
        info_r, info_w = os.pipe()
        tmp = None
        try:
            if self.isolation == "bwrap":
                command, uid = bwrap_command(_PYTHON_ARGS, self.env, info_w, 16 << 20)
                cwd, env = "/", {}
            else:
                tmp = tempfile.TemporaryDirectory(prefix="dyngen-sandbox-")
                command, uid = [str(interpreter()), *_PYTHON_ARGS], None
                cwd, env = tmp.name, {**self.env, "HOME": tmp.name}
                os.close(info_w)
                info_w = -1
            self.request.update(result_fd=result_w, uid=uid, gid=uid)
            proc = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, cwd=cwd, env=env, start_new_session=True,
                pass_fds=tuple(fd for fd in (result_w, info_w) if fd >= 0))
        except BaseException:
            for fd in (result_r, result_w, info_r, info_w):
                if fd >= 0:
                    os.close(fd)
            if tmp is not None:
                tmp.cleanup()
            raise
        os.close(result_w)
        if info_w >= 0:
            os.close(info_w)
        try:
            outcome = self._supervise(proc, result_r, info_r, start)
        finally:
            self._end(proc)
            os.close(result_r)
            os.close(info_r)
            if tmp is not None:
                tmp.cleanup()
        return self._judge(proc, *outcome, time.monotonic() - start)

    def _supervise(self, proc: subprocess.Popen[bytes], result_r: int, info_r: int,
                   start: float) -> tuple[bytes, bytes, str | None]:
        """Feed the request; read the result, the output and bwrap's info until the
        process ends or breaks a bound: (result, output's start, the bound broken)."""
        assert proc.stdin is not None and proc.stdout is not None
        pending = repr(self.request).encode()  # a dict literal: the runner imports no json
        result, output, info, seen = b"", b"", b"", 0
        sel = selectors.DefaultSelector()
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE, "stdin")
        sel.register(proc.stdout, selectors.EVENT_READ, "output")
        sel.register(result_r, selectors.EVENT_READ, "result")
        if self.isolation == "bwrap":
            sel.register(info_r, selectors.EVENT_READ, "info")
        deadline = start + self.timeout
        try:
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    return result, output, "timeout"
                for key, _ in sel.select(left):
                    if key.data == "stdin":
                        try:
                            pending = pending[os.write(proc.stdin.fileno(), pending):]
                        except BrokenPipeError:
                            pending = b""
                        if not pending:
                            sel.unregister(proc.stdin)
                            proc.stdin.close()
                        continue
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                    elif key.data == "output":
                        seen += len(chunk)
                        output = (output + chunk)[-4096:]
                        if seen > self.max_output:
                            return result, output, "output_limit"
                    elif key.data == "result":
                        result += chunk
                        if len(result) > 4 * int(self.request["max_value_chars"]) + 4096:
                            return result, output, "output_limit"
                    else:
                        info += chunk
                        self._note_child(info)
        finally:
            sel.close()
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return result, output, "timeout"
        return result, output, None

    def _note_child(self, info: bytes) -> None:
        """bwrap's --info-fd JSON names its child, the sandbox's PID 1: killing it ends
        every process of the sandbox's PID namespace."""
        with contextlib.suppress(ValueError, KeyError, TypeError):
            self.child_pid = int(json.loads(info)["child-pid"])

    def _end(self, proc: subprocess.Popen[bytes]) -> None:
        """Kill whatever is left of the run and reap it."""
        if self.isolation == "unisolated":
            _kill(-proc.pid)  # the runner's process group, with what the program left in it
        elif proc.poll() is None:
            if self.child_pid is not None:
                # The sandbox's PID 1: its death ends every process in the sandbox, then
                # bwrap, which reaps it (killing bwrap first would orphan it to init). It is
                # not reaped while bwrap lives, so its pid is not reused meanwhile.
                _kill(self.child_pid)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(1)
            _kill(-proc.pid)  # bwrap (--die-with-parent takes the sandbox with it)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None and not stream.closed:
                stream.close()

    def _judge(self, proc: subprocess.Popen[bytes], result: bytes, output: bytes,
               broken: str | None, seconds: float) -> SandboxResult:
        """The result the runner reported, or the reason it reported none."""
        if broken == "timeout":
            return SandboxResult.failed("timeout", f"still running after {self.timeout:g} s",
                                        seconds)
        if broken == "output_limit":
            return SandboxResult.failed("output_limit", f"printed more than {self.max_output} "
                                        "bytes", seconds)
        try:
            data = ast.literal_eval(result.decode())
            ok, value = bool(data["ok"]), data["value"]
            return SandboxResult(ok, value if ok else None, None if ok else data["reason"],
                                 str(data["detail"])[:MAX_DETAIL], seconds)
        except (ValueError, KeyError, TypeError, SyntaxError, UnicodeDecodeError, MemoryError,
                RecursionError):
            pass
        code = proc.returncode
        text = output.decode("utf-8", "replace").strip()
        if code is not None and code in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
            return SandboxResult.failed("timeout", "CPU time limit", seconds)
        if "MemoryError" in text:
            return SandboxResult.failed("memory", text[-MAX_DETAIL:], seconds)
        return SandboxResult.failed("crashed", f"exit status {code}, no result; output: "
                                    f"{text[-300:]}", seconds)


def _kill(pid: int) -> None:
    """SIGKILL `pid` (a negative pid: its process group) if it is still there."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
