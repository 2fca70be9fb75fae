"""The security review's findings, each with its safe outcome, as whichever user runs the
suite (CI runs it as root and as an unprivileged user): a forged result, kernel interfaces a
seccomp filter denies, host memory past the bound, writable folders outside /tmp."""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path

import pytest

from dyngen.sandbox import REASONS, run_deterministic, run_python
from dyngen.sandbox.process import TMP_INODES

AS_ROOT = os.geteuid() == 0
# Reaches os through a name the filter cannot see, so these run with the filter on too.
OS = "import operator, random\nos = operator.attrgetter('_' + 'os')(random)\n"


def assert_well_formed(result: object, max_value_chars: int = 10_000) -> None:
    """The shape every result has, whatever the program wrote."""
    assert isinstance(result.ok, bool)
    if result.ok:
        assert type(result.value) is str and len(result.value) <= max_value_chars
        assert result.reason is None
    else:
        assert result.value is None and result.reason in REASONS
    assert type(result.detail) is str and len(result.detail) <= 500


@pytest.mark.parametrize("forged", [
    {"ok": True, "value": 7, "reason": None, "detail": ""},
    {"ok": True, "value": "x" * 40_000, "reason": None, "detail": ""},
    {"ok": False, "value": None, "reason": "anything", "detail": "y" * 5000},
    {"ok": True, "value": "7", "reason": None, "detail": ""},
])
def test_a_program_cannot_forge_its_result(forged: dict) -> None:
    """It writes a forged result, bare and framed, to every descriptor it can find, then
    returns 'honest': the result is never the forged one."""
    text = repr(forged).encode()
    program = (OS + "def f(x):\n    data = " + repr(text) + "\n"
               "    for frame in (data, len(data).to_bytes(4, 'big') + data):\n"
               "        for fd in range(1024):\n"
               "            try:\n"
               "                os.write(fd, frame)\n"
               "            except OSError:\n"
               "                pass\n"
               "    return 'honest'\n")
    for result in (run_python(program, "f", 0), run_deterministic(program, "f", 0)):
        assert_well_formed(result)
        assert result.value in (None, "'honest'"), result
    # The same, ending the run at once (no honest report after the forged one).
    ended = program.replace("    return 'honest'\n", "    os._exit(0)\n")
    result = run_python(ended, "f", 0)
    assert_well_formed(result)
    assert not (result.ok and forged["value"] == 7), result


def test_the_programs_process_holds_no_inherited_descriptor() -> None:
    program = (OS + "def f(x):\n    open_fds = []\n    for fd in range(1024):\n"
               "        try:\n            os.fstat(fd)\n            open_fds.append(fd)\n"
               "        except OSError:\n            pass\n    return open_fds\n")
    result = run_python(program, "f", 0)
    assert result.value == "[0, 1, 2, 3]", result  # /dev/null, output, output, its report


SYSCALLS = {  # x86_64 numbers, and arguments that would succeed without the filter
    "shmget": "libc.syscall(29, 0, 1 << 30, 0o1000 | 0o600)",  # IPC_PRIVATE|IPC_CREAT
    "msgget": "libc.syscall(68, 0, 0o1000 | 0o600)",
    "semget": "libc.syscall(64, 0, 1, 0o1000 | 0o600)",
    "add_key": "libc.syscall(248, b'user', b'run-a', b'secret', 6, -4)",  # the user keyring
    "request_key": "libc.syscall(249, b'user', b'run-a', None, -4)",
    "keyctl": "libc.syscall(250, 0, -4, 0)",  # KEYCTL_GET_KEYRING_ID
    "unshare": "libc.syscall(272, 0x10000000 | 0x40000000 | 0x20000)",
    "setns": "libc.syscall(308, 0, 0)",
    "mount": "libc.syscall(165, b'none', b'/tmp', b'tmpfs', 0, None)",
    "clone": "libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)",  # CLONE_NEWUSER|SIGCHLD
    "bpf": "libc.syscall(321, 0, 0, 0)",
    "io_uring_setup": "libc.syscall(425, 8, ctypes.create_string_buffer(120))",
    "ptrace": "libc.syscall(101, 16, 1, 0, 0)",  # PTRACE_ATTACH to the supervisor
    "perf_event_open": "libc.syscall(298, ctypes.create_string_buffer(128), 0, -1, -1, 0)",
    "userfaultfd": "libc.syscall(323, 0)",
}


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86_64 system call numbers")
@pytest.mark.parametrize("name", sorted(SYSCALLS))
def test_denied_system_calls_fail_with_eperm(name: str) -> None:
    program = ("import ctypes\ndef f(x):\n    libc = ctypes.CDLL(None, use_errno=True)\n"
               f"    libc.syscall.restype = ctypes.c_long\n    r = {SYSCALLS[name]}\n"
               "    return (r, ctypes.get_errno())\n")
    result = run_python(program, "f", 0, screened=False)
    assert result.value == "(-1, 1)", (name, result)  # EPERM


def test_nothing_outside_tmp_is_writable() -> None:
    """As any uid: bwrap's own tmpfs mounts (/, /dev, /dev/shm) are remounted read-only."""
    program = (OS + "def f(x):\n    out = []\n    for path in ('/x', '/dev/x', '/dev/shm/x', "
               "'/tmp/x'):\n        try:\n            fd = os.open(path, os.O_CREAT | os.O_WRONLY)"
               "\n            os.write(fd, b'1')\n            out.append('wrote')\n"
               "        except OSError as e:\n            out.append(e.errno)\n    return out\n")
    result = run_python(program, "f", 0)
    assert result.ok, result
    *outside, tmp = eval(result.value)
    assert tmp == "wrote" and "wrote" not in outside, result


@pytest.mark.skipif(not AS_ROOT, reason="as another user bwrap's tmpfs takes no inode bound")
def test_tmp_is_bounded_in_inodes() -> None:
    program = (OS + "def f(x):\n    n = 0\n    try:\n        while True:\n"
               "            os.close(os.open(str(n), os.O_CREAT | os.O_WRONLY))\n"
               "            n += 1\n    except OSError as e:\n        return (n, e.errno)\n")
    result = run_python(program, "f", 0, timeout_seconds=20)
    assert result.ok, result
    made, errno = eval(result.value)
    assert made < TMP_INODES and errno == 28, result  # ENOSPC
    # ... and the next run's /tmp is empty again
    assert run_python(OS + "def f(x):\n    return os.listdir('.')\n", "f", 0).value == "[]"


@pytest.mark.skipif(not AS_ROOT, reason="cgroup v1 memory and pids are writable as root")
def test_a_sandbox_runs_in_a_memory_and_pids_cgroup() -> None:
    from dyngen.sandbox.pool import pool

    assert run_python("def f(x):\n    return x\n", "f", 1, memory_mb=256).ok
    box = next(b for b in pool()._idle[("bwrap", 0, 256)])
    assert box.cgroup is not None
    texts = {f.name: [p.read_text() for p in f.iterdir() if p.name.endswith(("limit_in_bytes",
                                                                               "max"))]
             for f in box.cgroup.folders}
    assert len(texts) >= 1 and box.sandbox_pid is not None
    procs = {int(p) for f in box.cgroup.folders for p in (f / "cgroup.procs").read_text().split()}
    assert box.sandbox_pid in procs


def test_memory_the_kernel_holds_is_bounded() -> None:
    """Pages of /tmp count against the sandbox (16 MiB of tmpfs), never the host's RAM."""
    program = (OS + "def f(x):\n    block = b'x' * (2**20 - 1)\n    n = 0\n    try:\n"
               "        while n < 200:\n            fd = os.open(str(n), os.O_CREAT | os.O_WRONLY)"
               "\n            os.write(fd, block)\n            os.close(fd)\n"
               "            n += 1\n    except OSError as e:\n        return (n, e.errno)\n"
               "    return (n, 0)\n")
    result = run_python(program, "f", 0, timeout_seconds=20)
    assert result.ok, result
    written, errno = eval(result.value)  # 1 MiB files, each under RLIMIT_FSIZE
    assert written <= 16 and errno == 28, result  # ENOSPC


def test_without_a_cgroup_it_says_so_once_and_counts_the_runs(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from dyngen.sandbox import cgroup
    from dyngen.sandbox.pool import close_pool

    monkeypatch.setattr(cgroup.Cgroup, "create", staticmethod(lambda *args: None))
    monkeypatch.setitem(cgroup._unbounded, "warned", False)
    close_pool()
    before = cgroup.runs_without_cgroup()
    with caplog.at_level("WARNING", logger="dyngen.sandbox.cgroup"):
        for i in range(3):
            assert run_python("def f(x):\n    return x\n", "f", i).ok
    close_pool()
    assert cgroup.runs_without_cgroup() - before == 3
    assert sum("no cgroup could be made" in r.message for r in caplog.records) == 1


def _comms() -> set[str]:
    """The names of the machine's processes."""
    names = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                names.add(Path(f"/proc/{entry}/comm").read_text().strip())
    return names


def test_unisolated_runs_unprivileged_and_leave_nothing_running() -> None:
    uid = run_python(OS + "def f(x):\n    return os.getuid()\n", "f", 0, isolation="unisolated")
    assert uid.ok and (uid.value != "0" if AS_ROOT else uid.value == str(os.geteuid())), uid
    # A double fork into a new session, named so it can be found, then a sleep past the
    # timeout: the run ends at the timeout (or its fork fails) and nothing of it is left.
    program = ("import ctypes, time\n" + OS + "def f(x):\n    libc = ctypes.CDLL(None)\n"
               "    if os.fork() == 0:\n        os.setsid()\n        if os.fork() == 0:\n"
               "            libc.prctl(15, b'dyngen-left', 0, 0, 0)\n            time.sleep(30)\n"
               "        os._exit(0)\n    time.sleep(30)\n")
    result = run_python(program, "f", 0, isolation="unisolated", timeout_seconds=1,
                        screened=False)
    assert not result.ok and result.reason in ("timeout", "error"), result
    assert "dyngen-left" not in _comms()


@pytest.mark.skipif(not AS_ROOT, reason="cgroup v1 memory and pids are writable as root")
def test_the_cgroup_of_a_worker_that_ended_without_closing_is_removed_later() -> None:
    """A forked child that ends by os._exit closes nothing; the next worker's first cgroup
    sweeps the empty cgroups of workers that are gone."""
    from dyngen.sandbox import cgroup

    gone = os.fork()
    if gone == 0:
        os._exit(0)
    os.waitpid(gone, 0)
    made = cgroup.Cgroup.create(256 << 20, 16)
    assert made is not None
    stale = [folder.parent / f"dyngen-sandbox-{gone}-0" for folder in made.folders]
    for folder in stale:
        folder.mkdir()
    cgroup._swept.clear()
    again = cgroup.Cgroup.create(256 << 20, 16)
    assert again is not None
    assert not any(folder.exists() for folder in stale)
    made.remove()
    again.remove()
