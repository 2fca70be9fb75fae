"""The bubblewrap command line: what the sandbox sees, which namespaces it has, who it runs as.

The sandbox sees, read-only, the interpreter, its standard library (site-packages hidden)
and the system's shared libraries; a private /dev; an empty writable /tmp of bounded size
as its working folder; nothing else of the host (no /home, /root, /etc, /proc, store or
worker files); `/` and `/dev` are remounted read-only: as any uid only /tmp is writable.
It has its own PID, network (loopback only), IPC, UTS and cgroup namespaces, a new session
(no terminal to inject into), an environment holding only what is set here, and a seccomp
filter (dyngen.sandbox.seccomp) loaded by bwrap; unprivileged, no further user namespaces.

Who it runs as: the kernel does not count RLIMIT_NPROC for root, so a fork bomb started by
root would be unbounded. Run by root, bwrap makes no user namespace (its uid map would map
the sandbox back to root) and lets the supervisor switch each run to `SANDBOX_UID` (nobody)
with the few capabilities listed below, which the switch drops; run by another user,
bwrap's user namespace (`--unshare-all`) keeps the sandbox at that unprivileged uid.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

SANDBOX_UID = SANDBOX_GID = 65534  # nobody
_LIBRARY_DIRS = ("/lib", "/lib64", "/lib32", "/libx32", "/usr/lib", "/usr/lib64",
                 "/usr/lib32", "/usr/libx32")
# The namespaces of --unshare-all but the user one (see the module's docstring).
_ROOT_NAMESPACES = ("--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                    "--unshare-cgroup-try")
_ROOT_CAPABILITIES = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_SYS_ADMIN")


def bwrap_path() -> str | None:
    """The bwrap executable on PATH, or None."""
    return shutil.which("bwrap")


@functools.cache
def interpreter() -> Path:
    """The real interpreter under the worker's (a venv's python is a link into it)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return Path(os.path.realpath(base))


@functools.cache
def _tmpfs_size_supported(bwrap: str) -> bool:
    """Whether this bwrap bounds a tmpfs (--size, bubblewrap >= 0.8)."""
    out = subprocess.run([bwrap, "--help"], capture_output=True, text=True, check=False)
    return "--size" in out.stdout + out.stderr


def _visible_paths() -> tuple[list[Path], list[Path]]:
    """(paths bound read-only, folders hidden under an empty tmpfs): the interpreter, its
    standard library and shared library, without its site-packages."""
    # The base installation's paths: in a venv the default scheme points into the venv.
    paths = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix,
                                      "installed_base": sys.base_prefix,
                                      "installed_platbase": sys.base_exec_prefix})
    stdlib = Path(paths["stdlib"]).resolve()
    binds = [interpreter(), stdlib]
    platstdlib = Path(paths["platstdlib"]).resolve()
    if platstdlib != stdlib:
        binds.append(platstdlib)
    libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    if sysconfig.get_config_var("Py_ENABLE_SHARED") and libdir and soname:
        shared = Path(libdir, soname)
        if shared.exists():
            binds.append(shared.resolve())
    hidden = [p for p in (stdlib / "site-packages", stdlib / "dist-packages") if p.is_dir()]
    return binds, hidden


def _under(path: Path, folders: list[Path]) -> bool:
    """Whether `path` is one of `folders` or inside one."""
    return any(path == f or f in path.parents for f in folders)


def mount_arguments(tmp_bytes: int, as_root: bool) -> list[str]:
    """bwrap's arguments that build the sandbox's file system: `/` and `/dev` read-only once
    /tmp is there. As root /tmp is an empty folder the supervisor mounts a tmpfs bounded in
    bytes and inodes on; otherwise bwrap's own tmpfs, bounded in bytes only (a user
    namespace's bwrap cannot pass tmpfs options, nor let the supervisor mount)."""
    args: list[str] = []
    system = []
    for name in _LIBRARY_DIRS:
        path = Path(name)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), name]
        elif path.is_dir():
            system.append(path)
    binds, hidden = _visible_paths()
    binds = system + [p for p in binds if not _under(p, system)]
    made: set[Path] = set()
    for path in binds:
        # bwrap would copy a missing parent's mode from the host (/root is 0700): make
        # each parent readable, so the unprivileged sandbox can reach what is bound.
        for parent in reversed(path.parents):
            if parent != Path("/") and parent not in made and not _under(parent, binds):
                made.add(parent)
                args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", str(path), str(path)]
    for folder in hidden:
        args += ["--tmpfs", str(folder)]
    if as_root:
        tmp = ["--perms", "0755", "--dir", "/tmp"]
    else:
        size = ["--size", str(tmp_bytes)] if _tmpfs_size_supported(bwrap_path() or "bwrap") else []
        tmp = ["--perms", "1777", *size, "--tmpfs", "/tmp"]
    return [*args, "--dev", "/dev", *tmp, "--remount-ro", "/dev", "--remount-ro", "/",
            "--chdir", "/"]


def bwrap_command(python_args: list[str], env: dict[str, str], info_fd: int, seccomp_fd: int,
                  tmp_bytes: int) -> tuple[list[str], int | None]:
    """(the bwrap command running `python_args` in the sandbox, the uid the runner must
    switch to, or None when bwrap's user namespace already made it unprivileged)."""
    bwrap = bwrap_path()
    if bwrap is None:
        raise FileNotFoundError("bwrap")
    as_root = os.geteuid() == 0
    # As root the supervisor keeps CAP_SYS_ADMIN to mount /tmp (then drops it), CAP_KILL to
    # end a run of another uid, CAP_SETUID/SETGID for the switch each run makes.
    namespaces = (
        [*_ROOT_NAMESPACES, "--cap-drop", "ALL", *(a for cap in _ROOT_CAPABILITIES
                                                   for a in ("--cap-add", cap))]
        if as_root else ["--unshare-all", "--unshare-user", "--disable-userns"])
    setenv = [a for k, v in env.items() for a in ("--setenv", k, v)]
    command = [bwrap, *namespaces, "--die-with-parent", "--new-session", "--as-pid-1",
               "--clearenv", *setenv, *mount_arguments(tmp_bytes, as_root),
               "--info-fd", str(info_fd), "--seccomp", str(seccomp_fd),
               str(interpreter()), *python_args]
    return command, SANDBOX_UID if as_root else None
