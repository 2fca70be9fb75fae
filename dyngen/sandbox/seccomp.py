"""The sandbox's seccomp filters, built with libseccomp (PyPI `pyseccomp`, or libseccomp's own
`seccomp` module where that is installed instead) as BPF programs.

Every run is under both:
  SYSTEM_CALLS  loaded by bubblewrap (`--seccomp FD`) before the supervisor starts: the
                kernel interfaces a pure function never needs and that let a process reach
                past its sandbox's bounds (SysV IPC pins memory no rlimit counts, the keyring
                outlives the run, namespaces and bpf/io_uring/perf are where recent kernel
                privilege escalations start, ptrace reads another process). Each gets EPERM;
                clone3 gets ENOSYS (its flags sit behind a pointer no filter can read), so
                the C library falls back to clone, whose namespace flags the filter sees.
  MOUNTS        loaded by the supervisor itself once it has mounted its bounded /tmp (it
                needs mount(2) for that, so bubblewrap's filter cannot deny it): mount,
                umount and the new mount API get EPERM.
A system call of another architecture (i386 on x86_64) kills the process: libseccomp's
default for an architecture the filter was not built for.
"""

from __future__ import annotations

import errno
import functools
import tempfile
from typing import Any

SYSTEM_CALLS = (
    "shmget", "shmat", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop",
    "semtimedop", "semctl", "add_key", "request_key", "keyctl", "unshare", "setns", "bpf",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "ptrace", "perf_event_open",
    "userfaultfd", "process_vm_readv", "process_vm_writev", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "pivot_root", "chroot", "swapon",
    "swapoff", "reboot", "acct", "quotactl", "syslog", "name_to_handle_at",
    "open_by_handle_at", "iopl", "ioperm", "lookup_dcookie", "fanotify_init",
    "pidfd_getfd", "personality",
)
MOUNTS = ("mount", "umount2", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount",
          "fspick", "mount_setattr")
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME
CLONE_NAMESPACES = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
                    0x40000000, 0x00000080)
SECCOMP_ADVICE = ("The sandbox's seccomp filter is built with libseccomp through PyPI's "
                  "pyseccomp: pip install 'dyngen[sandbox]' (Debian: apt-get install "
                  "libseccomp2; or libseccomp's own bindings, apt-get install "
                  "python3-seccomp, for the system's python3).")


def seccomp_problem() -> str | None:
    """Why the seccomp filters cannot be built here, or None if they can."""
    try:
        system_calls_filter()
        mounts_filter()
    except (ImportError, OSError, AttributeError) as error:
        return f"no seccomp filter ({type(error).__name__}: {error}); {SECCOMP_ADVICE[:-1]}"
    return None


def _libseccomp() -> Any:
    """libseccomp's Python API: PyPI's pyseccomp, else the same API from libseccomp's own
    bindings (Debian: python3-seccomp, the module `seccomp`)."""
    try:
        import pyseccomp
    except ImportError:
        try:
            import seccomp
        except ImportError:
            raise ImportError("neither pyseccomp nor libseccomp's own seccomp module is "
                              "installed") from None
        return seccomp
    return pyseccomp


def _export(names: tuple[str, ...], clone_flags: bool) -> bytes:
    """A BPF program that fails each of `names` with EPERM (and clone with a namespace flag,
    clone3 with ENOSYS, when `clone_flags`); everything else is allowed."""
    sc = _libseccomp()

    rules = sc.SyscallFilter(sc.ALLOW)
    for name in names:
        rules.add_rule(sc.ERRNO(errno.EPERM), name)
    if clone_flags:
        for flag in CLONE_NAMESPACES:
            rules.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        rules.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as file:
        rules.export_bpf(file)
        file.seek(0)
        return file.read()


@functools.cache
def system_calls_filter() -> bytes:
    """The BPF program bubblewrap loads (see the module's docstring)."""
    return _export(SYSTEM_CALLS, clone_flags=True)


@functools.cache
def mounts_filter() -> bytes:
    """The BPF program the supervisor loads after mounting its /tmp."""
    return _export(MOUNTS, clone_flags=False)
