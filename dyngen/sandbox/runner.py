"""What runs inside the sandbox: read a request, drop privileges, limit, call, report.

This file is handed to a bare interpreter (`python -S -s -B -c <this text>`) inside the
sandbox, so it imports nothing but the standard library and never dyngen. The request
comes on stdin as a Python dict literal: {program, function, argument (a literal's text),
result_fd, uid, limits}. The one result goes to `result_fd` as a dict literal: {ok, value
(repr), reason, detail}. The program's own output goes to stdout/stderr, which the parent
counts and bounds. Literals are read with the C parser (_ast) alone: importing `ast` and
`json` would double the interpreter's start-up.
"""

import _ast
import os
import resource
import sys

_DETAIL = 500  # characters of an error message kept in the result


def _literal(text: str) -> object:
    """The value of a Python literal, as ast.literal_eval reads it."""
    return _value(compile(text, "<literal>", "eval", _ast.PyCF_ONLY_AST).body)


def _value(node: object) -> object:
    """The value a literal's syntax node stands for; ValueError for anything else."""
    kind = type(node)
    if kind is _ast.Constant:
        return node.value
    if kind in (_ast.Tuple, _ast.List, _ast.Set):
        items = [_value(e) for e in node.elts]
        return tuple(items) if kind is _ast.Tuple else items if kind is _ast.List else set(items)
    if kind is _ast.Dict and None not in node.keys:
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values)}  # noqa: B905
    if kind is _ast.UnaryOp and type(node.op) in (_ast.USub, _ast.UAdd):
        operand = _value(node.operand)
        if type(operand) in (int, float, complex):
            return -operand if type(node.op) is _ast.USub else operand
    if kind is _ast.BinOp and type(node.op) in (_ast.Add, _ast.Sub):  # a complex: (1+2j)
        left, right = _value(node.left), _value(node.right)
        if type(left) in (int, float) and type(right) is complex:
            return left + right if type(node.op) is _ast.Add else left - right
    if (kind is _ast.Call and type(node.func) is _ast.Name and node.func.id == "set"
            and not node.args and not node.keywords):
        return set()
    raise ValueError(f"not a literal: {type(node).__name__}")


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
    data = repr(result).encode()
    while data:
        data = data[os.write(fd, data):]
    os._exit(0)


def _failure(reason: str, error: BaseException) -> dict:
    """A result for a run that raised `error`."""
    try:
        text = f"{type(error).__name__}: {error}"
    except BaseException:  # the program's exception may not even print
        text = "an exception that cannot be printed"
    return {"ok": False, "value": None, "reason": reason, "detail": text[:_DETAIL]}


def _call(request: dict) -> dict:
    """Run the program and call its function: the result to report."""
    try:
        argument = _literal(request["argument"])
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
    request = _literal(sys.stdin.buffer.read().decode())
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
