"""What runs inside the sandbox: read a request, drop privileges, limit, call, report.

This file is handed to a bare interpreter (`python -S -s -B -c <this text>`) inside the
sandbox, so it imports nothing but the standard library and never dyngen. The request
comes on stdin as JSON: {program, function, argument (a Python literal), result_fd, uid,
limits}. The one result goes to `result_fd` as JSON: {ok, value (repr), reason, detail}.
The program's own output goes to stdout/stderr, which the parent counts and bounds.
"""

import ast
import json
import os
import resource
import sys

_DETAIL = 500  # characters of an error message kept in the result


def _drop_privileges(uid: int, gid: int) -> None:
    """Become `uid` with no groups and no capabilities (the kernel counts RLIMIT_NPROC for
    every uid but root, so a sandbox started by root must not stay root)."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def _limit(limits: dict) -> None:
    """Set each rlimit (soft and hard: the program cannot raise them again)."""
    for name, value in limits.items():
        kind = getattr(resource, name)
        resource.setrlimit(kind, (value, value))


def _report(fd: int, main_pid: int, result: dict) -> None:
    """Write the result and end at once: no atexit hook or finaliser of the program runs."""
    if os.getpid() != main_pid:  # a child the program forked: only the runner reports
        os._exit(0)
    data = json.dumps(result).encode()
    while data:
        data = data[os.write(fd, data):]
    os._exit(0)


def _failure(reason: str, error: BaseException) -> dict:
    try:
        text = f"{type(error).__name__}: {error}"
    except BaseException:  # the program's exception may not even print
        text = "an exception that cannot be printed"
    return {"ok": False, "value": None, "reason": reason, "detail": text[:_DETAIL]}


def _call(request: dict) -> dict:
    """Run the program and call its function: the result to report."""
    try:
        argument = ast.literal_eval(request["argument"])
        namespace = {"__name__": "__sandbox__"}
        exec(compile(request["program"], "<program>", "exec"), namespace)
        function = namespace.get(request["function"])
        if not callable(function):
            raise NameError(f"the program defines no function {request['function']!r}")
        value = function(argument)
        text = repr(value)
        if len(text) > int(request["max_value_chars"]):
            return {"ok": False, "value": None, "reason": "output_limit",
                    "detail": f"the value's repr has {len(text)} characters, over "
                              f"{request['max_value_chars']}"}
        return {"ok": True, "value": text, "reason": None, "detail": ""}
    except MemoryError as error:
        return _failure("memory", error)
    except BaseException as error:  # SystemExit and KeyboardInterrupt too: the program's
        return _failure("error", error)


def main() -> None:
    """Fork: the child drops privileges, limits itself and runs the program; this process
    (the sandbox's PID 1 under bwrap) stays out of its reach and waits for it."""
    request = json.loads(sys.stdin.buffer.read())
    sys.stdin.close()
    fd = int(request["result_fd"])
    child = os.fork()
    if child == 0:
        if request.get("uid") is not None:
            _drop_privileges(int(request["uid"]), int(request["gid"]))
        _limit(request["limits"])
        me = os.getpid()
        _report(fd, me, _call(request))
    os.close(fd)
    _, status = os.waitpid(child, 0)
    # The child's death by a signal (SIGXCPU, SIGSEGV, SIGKILL) is the run's exit status.
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0)


if __name__ == "__main__":
    main()
