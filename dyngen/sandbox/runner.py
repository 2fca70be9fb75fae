# One file on purpose, over 400 lines for this alone: it is handed as text to a bare
# interpreter inside the sandbox, where nothing else of dyngen can be imported.
"""The sandbox's supervisor: set up once, then fork one child per run from a started interpreter.

This file is handed to a bare interpreter (`python -S -s -B -c <this text>`) inside the
sandbox, so it imports nothing but the standard library and never dyngen. Frames (a 4-byte
length, then a Python dict literal) come on stdin: first the setup {tmp_bytes, tmp_inodes,
mount_tmp, seccomp (BPF programs to load), uid, gid, result_fd}, then per run a request
{timeout, max_value_chars, max_output_bytes, size} followed by `size` bytes of its body, a
dict literal {program, function, argument (a literal's text), limits, env} that only the
run's child reads. Only this process writes to `result_fd`: {ready} once, then per run
{ok, value (repr), reason, detail, clean}.

Per run the child closes every descriptor it inherited (the result channel included),
keeping only its own output pipe and a report pipe to this process; drops to `uid`; sets its
rlimits; runs in /tmp; and reports. This process checks the report is one frame, kills
whatever the run left, empties /tmp and says whether it is clean (a sandbox that is not is
replaced). It reads a run's bytes into buffers it wipes, never into objects: each run is a
fork of this process, so anything of a run left on its heap would reach the next.
Literals are read with the C parser (_ast) alone: importing `ast` would double start-up.
"""

import _ast
import contextlib
import os
import resource
import select
import signal
import sys
import time

_DETAIL = 500  # characters of an error message kept in the result
# The builtins a run's own reporting uses, taken before any program can patch them.
_len, _repr, _type, _int, _str, _callable = len, repr, type, int, str, callable
_SCRATCH = bytearray(65536)  # a run's output lands here, counted, then wiped
_USED = [0]  # how much of _SCRATCH a run wrote
# Imported once here, so a run that imports them starts at once (a fork shares them), and
# so an unisolated run as nobody has them where the interpreter sits in a folder only root
# can read (/root/.pyenv).
_WARM = ("collections", "itertools", "functools", "math", "cmath", "re", "string", "heapq",
         "bisect", "operator", "json", "fractions", "decimal", "statistics", "random", "copy",
         "hashlib", "datetime", "calendar", "textwrap", "unicodedata", "typing", "dataclasses",
         "enum", "array", "struct", "base64", "binascii", "zlib", "difflib", "numbers",
         "collections.abc", "keyword", "pprint", "graphlib", "abc", "types", "contextlib")


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


def _write_frame(fd: int, message: dict) -> None:
    """One frame: the literal's length, then the literal."""
    data = _repr(message).encode()
    data = _len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data):]


def _read_exactly(fd: int, size: int) -> bytes:
    """`size` bytes from `fd`, or fewer at its end."""
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _read_into(fd: int, buffer: bytearray) -> int:
    """Fill `buffer` from `fd` (no bytes object made on the way); how much was read."""
    view, got = memoryview(buffer), 0
    while got < len(buffer):
        n = os.readv(fd, [view[got:]])
        if not n:
            break
        got += n
    return got


def _read_frame(fd: int) -> dict | None:
    """The next frame from the worker, or None at the end of its requests."""
    head = _read_exactly(fd, 4)
    if len(head) < 4:
        return None
    return _literal(_read_exactly(fd, int.from_bytes(head, "big")).decode())


# ---- set-up, once per sandbox ----------------------------------------------------------

def _libc():  # noqa: ANN202 - ctypes is imported only where it is needed
    import ctypes

    return ctypes, ctypes.CDLL(None, use_errno=True)


def _mount_tmp(size: int, inodes: int) -> None:
    """A tmpfs on /tmp bounded in bytes AND inodes (bubblewrap's --size bounds bytes only)."""
    ctypes, libc = _libc()
    options = f"size={size},nr_inodes={inodes},mode=1777".encode()
    nosuid_nodev_noexec = 0x2 | 0x4 | 0x8
    if libc.mount(b"tmpfs", b"/tmp", b"tmpfs", nosuid_nodev_noexec, options) != 0:
        raise OSError(ctypes.get_errno(), "mount /tmp")


def _keep_capabilities(keep: tuple[int, ...]) -> None:
    """Drop every capability but `keep` (CAP_SYS_ADMIN, needed only to mount /tmp, goes)."""
    ctypes, libc = _libc()

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    mask = sum(1 << cap for cap in keep)
    data = (Data * 2)(Data(mask, mask, 0), Data(0, 0, 0))
    if libc.capset(ctypes.byref(Header(0x20080522, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _load_seccomp(program: bytes) -> None:
    """Load one BPF filter on this process (and so on every child it forks)."""
    ctypes, libc = _libc()

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "no_new_privs")
    prog = Program(len(program) // 8, program)
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, MODE_FILTER
        raise OSError(ctypes.get_errno(), "seccomp")


def _set_up(setup: dict) -> None:
    """Mount /tmp (as root), keep only the capabilities a run's switch needs, load filters."""
    if setup["mount_tmp"]:
        _mount_tmp(int(setup["tmp_bytes"]), int(setup["tmp_inodes"]))
        _keep_capabilities((5, 6, 7))  # CAP_KILL (end a run), CAP_SETGID, CAP_SETUID
    if not setup["own_pid_namespace"]:
        _, libc = _libc()
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: a double fork stays below
    for program in setup["seccomp"]:
        _load_seccomp(program)
    for name in _WARM:
        __import__(name)
    import gc

    gc.freeze()  # a run's collections skip what every run shares: fewer pages copied


# ---- one run ---------------------------------------------------------------------------

def _failure(reason: str, error: BaseException) -> dict:
    """A result for a run that raised `error`."""
    try:
        text = f"{_type(error).__name__}: {error}"
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
        if not _callable(function):
            raise NameError(f"the program defines no function {request['function']!r}")
        value = function(argument)
        text = _repr(value)
        if _type(text) is not _str:
            raise TypeError("the value's __repr__ returned no str")
        if _len(text) > _int(request["max_value_chars"]):
            return {"ok": False, "value": None, "reason": "output_limit",
                    "detail": f"the value's repr has {_len(text)} characters, over "
                              f"{request['max_value_chars']}"}
        return {"ok": True, "value": text, "reason": None, "detail": ""}
    except MemoryError as error:
        return _failure("memory", error)
    except BaseException as error:  # SystemExit and KeyboardInterrupt too: the program's
        return _failure("error", error)


def _child(setup: dict, request: dict, body: bytearray, report: int, output: int) -> None:
    """The run's process: only its output and report pipes, unprivileged, limited. It reads
    the request's body (program, argument, limits, env) itself, on its own heap. A failure
    of its own (setting up, reporting) is reported as "crashed" with its error, never an
    exit without a report (CI once saw one, exit status 0, cause unknown)."""
    where = report  # the report's fd: 3 once it is moved there
    try:
        request = {**request, **_literal(bytes(body).decode())}
        os.setsid()
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.dup2(report, 3)
        where = 3
        os.closerange(4, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        os.chdir(setup["tmp"])
        os.environ.clear()
        os.environ.update(request["env"])
        if setup.get("uid") is not None:
            os.setgroups([])
            os.setresgid(setup["gid"], setup["gid"], setup["gid"])
            os.setresuid(setup["uid"], setup["uid"], setup["uid"])
        for name, value in request["limits"].items():
            # CPU: the soft limit's SIGXCPU first (reported as a timeout), a second later
            # the hard one's SIGKILL; every other limit soft = hard.
            hard = value + 1 if name == "RLIMIT_CPU" else value
            resource.setrlimit(getattr(resource, name), (value, hard))
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        result = _call(request)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):  # the program's stream may be broken
                stream.flush()
        _write_frame(3, result)
    except BaseException as error:
        with contextlib.suppress(BaseException):
            _write_frame(where, _failure("crashed", error))
    finally:
        os._exit(0)


def _supervise(report: int, output: int, request: dict,
               buffer: bytearray) -> tuple[int, str | None]:
    """Read the child's report into `buffer` and count its output until both end or a bound
    breaks: (bytes of report, the bound broken). A run's bytes never become objects on this
    process's heap: the next run is a fork of this process and could read what is left."""
    deadline = time.monotonic() + float(request["timeout"])
    view, got, seen, open_fds = memoryview(buffer), 0, 0, {report, output}
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            return got, "timeout"
        for fd in select.select(list(open_fds), [], [], left)[0]:
            if fd == output:
                n = os.readv(fd, [_SCRATCH])
                _USED[0] = max(_USED[0], n)
                seen += n
                if seen > int(request["max_output_bytes"]):
                    return got, "output_limit"
            elif got >= len(buffer) - 1:
                return got, "output_limit"
            else:
                n = os.readv(fd, [view[got:]])
                got += n
            if not n:
                open_fds.discard(fd)
    return got, None


def _judge(got: int, buffer: bytearray, broken: str | None, status: int,
           request: dict) -> tuple[dict, int]:
    """(the reply's header, how many bytes of the child's report follow it): the report is
    forwarded as it came if it is exactly one frame; the worker checks its shape."""
    def failed(reason: str, detail: str) -> tuple[dict, int]:
        return {"reason": reason, "detail": detail[:_DETAIL], "report": 0}, 0

    if broken == "timeout":
        return failed("timeout", f"still running after {float(request['timeout']):g} s")
    if broken == "output_limit":
        return failed("output_limit", f"printed more than {request['max_output_bytes']} bytes "
                      f"or a report over {len(buffer) - 1}")
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU:
            return failed("timeout", "CPU time limit")
        if sig == signal.SIGKILL:
            return failed("memory", "killed: over the sandbox's memory bound")
    if got < 4 or got != 4 + int.from_bytes(buffer[0:4], "big"):
        return failed("crashed", f"no result from the run (not exactly one report; exit "
                      f"status {status})")
    return {"reason": None, "detail": "", "report": got}, got


def _empty_tmp(setup: dict) -> bool:
    """Remove everything the run left in /tmp (as the run's uid, which owns it all), and say
    whether /tmp is empty again."""
    try:
        if not os.listdir(setup["tmp"]):
            return True  # most runs write nothing: no cleaner to fork
    except OSError:
        return False
    cleaner = os.fork()
    if cleaner == 0:
        try:
            if setup.get("uid") is not None:
                os.setgroups([])
                os.setresgid(setup["gid"], setup["gid"], setup["gid"])
                os.setresuid(setup["uid"], setup["uid"], setup["uid"])
            _remove_inside(setup["tmp"])
        finally:
            os._exit(0)
    os.waitpid(cleaner, 0)
    try:
        return not os.listdir(setup["tmp"])
    except OSError:
        return False


def _remove_inside(folder: str) -> None:
    """Delete the contents of `folder`, making each folder writable first."""
    for entry in os.scandir(folder):
        try:
            if entry.is_dir(follow_symlinks=False):
                os.chmod(entry.path, 0o700)
                _remove_inside(entry.path)
                os.rmdir(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            pass


def _end_leftovers(setup: dict, child: int) -> None:
    """Kill what the run left running and reap it: in the sandbox's own PID namespace, every
    process but this one; unisolated, the run's process group and, as this process is a
    subreaper, every descendant reparented to it."""
    if setup["own_pid_namespace"]:
        with contextlib.suppress(OSError):
            os.kill(-1, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while True:  # all were killed: each ends at once
                os.waitpid(-1, 0)
        return
    with contextlib.suppress(OSError):
        os.killpg(child, signal.SIGKILL)
    for _ in range(100):
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        try:  # no child at all: nothing of the run is left (a subreaper inherits orphans)
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        for pid in _orphans():  # the host's /proc: only when something is left
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(OSError):
                    kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _orphans() -> list[int]:
    """Processes whose parent is this one (unisolated: the host's /proc is there)."""
    found, me = [], os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as file:
                    fields = file.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me:
                found.append(int(entry))
    return found


def _run(setup: dict, request: dict, body: bytearray, out: int) -> None:
    """One request (its numbers, and its body unread): fork the run, supervise it, clean up
    after it, reply on `out`, wipe what it read."""
    buffer = bytearray(4 * int(request["max_value_chars"]) + 4096 + 1)
    report_r, report_w = os.pipe()
    output_r, output_w = os.pipe()
    child = os.fork()
    if child == 0:
        _child(setup, request, body, report_w, output_w)
    os.close(report_w)
    os.close(output_w)
    try:
        got, broken = _supervise(report_r, output_r, request, buffer)
    finally:
        os.close(report_r)
        os.close(output_r)
    if broken:
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGKILL)
    _, status = os.waitpid(child, 0)
    header, forward = _judge(got, buffer, broken, status, request)
    _end_leftovers(setup, child)
    header["clean"] = _empty_tmp(setup)
    _write_frame(out, header)
    view = memoryview(buffer)[:forward]
    while view:
        view = view[os.write(out, view):]
    for wiped, used in ((buffer, got), (body, len(body)), (_SCRATCH, _USED[0])):
        wiped[0:used] = bytes(used)  # nothing of this run stays behind
    _USED[0] = 0


def main() -> None:
    """Set up, say ready, then serve requests until the worker closes stdin."""
    setup = _read_frame(0)
    fd = int(setup["result_fd"])
    try:
        _set_up(setup)
    except BaseException as error:
        _write_frame(fd, {"ready": False, "detail": f"{type(error).__name__}: {error}"})
        os._exit(1)
    # The supervisor is its namespace's PID 1: as one uid with its runs (a user namespace),
    # a run can signal it, and only signals it handles arrive: it handles none.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _write_frame(fd, {"ready": True})
    while (request := _read_frame(0)) is not None:
        body = bytearray(int(request["size"]))
        if _read_into(0, body) < len(body):
            break
        _run(setup, request, body, fd)
    os._exit(0)


if __name__ == "__main__":
    main()
