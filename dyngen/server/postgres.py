"""A PostgreSQL cluster for a local Prefect server, started and stopped by PID.

Debian's `postgresql` package provides the binaries (`/usr/lib/postgresql/<version>/bin`,
or on PATH). The cluster lives in `<folder>/data`, listens on 127.0.0.1 only (no Unix
socket) and trusts local connections: it is a private database for one Prefect server,
like the SQLite file it replaces. PostgreSQL refuses to run as root; under root, dyngen
runs `initdb` and `postgres` as the user `nobody`, who owns the data folder and must be
able to reach it (every folder above it searchable by others).
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from dyngen.errors import PrefectServerError
from dyngen.server.processes import OwnedProcess, free_port, spawn

UNPRIVILEGED_USER = "nobody"
SUPERUSER = "dyngen"  # the cluster's own superuser role, not a system account
START_TIMEOUT_SECONDS = 60.0
INSTALL_HINT = "install PostgreSQL (Debian: apt-get install postgresql) or put its bin on PATH"


def postgres_bin(program: str) -> Path:
    """The path of a PostgreSQL program (`postgres`, `initdb`, `pg_isready`)."""
    found = shutil.which(program)
    if found:
        return Path(found)
    versions = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{program}"),
                      key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    if versions:
        return versions[-1]
    raise PrefectServerError(f"PostgreSQL's {program!r} was not found on PATH nor under "
                      f"/usr/lib/postgresql/*/bin; {INSTALL_HINT}.")


@dataclass
class LocalPostgres(OwnedProcess):
    """`initdb` once, then `postgres` on 127.0.0.1:`port` with its data under `folder`."""

    folder: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

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
        """Create the cluster if it does not exist, start it, wait until it accepts clients."""
        user = _run_as()
        self.folder.mkdir(parents=True, exist_ok=True)
        if user is not None:
            _check_reachable(self.folder, user)
            os.chown(self.folder, user.pw_uid, user.pw_gid)
        if not (self.data / "PG_VERSION").is_file():
            self._initdb(user)
        args = [str(postgres_bin("postgres")), "-D", str(self.data), "-p", str(self.port),
                "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="]
        self.process = spawn(args, os.environ, self.log, cwd=self.folder, user=user)
        with self.stopped_on_failure():
            self._wait_ready(timeout)
        return self

    def _initdb(self, user: pwd.struct_passwd | None) -> None:
        args = [str(postgres_bin("initdb")), "-D", str(self.data), "-U", SUPERUSER,
                "--auth=trust", "--encoding=UTF8", "--no-instructions"]
        returncode = spawn(args, os.environ, self.log, cwd=self.folder, user=user).wait()
        if returncode != 0:
            raise PrefectServerError(f"initdb failed with exit code {returncode} for {self.data}; "
                              f"see {self.log}.")

    def _wait_ready(self, timeout: float) -> None:
        isready = [str(postgres_bin("pg_isready")), "-q", "-h", "127.0.0.1",
                   "-p", str(self.port), "-U", SUPERUSER, "-d", "postgres"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise PrefectServerError(f"postgres exited with code {self.process.returncode} "
                                  f"before accepting connections; see {self.log}.")
            if subprocess.run(isready, check=False).returncode == 0:
                return
            time.sleep(0.2)
        raise PrefectServerError(f"postgres on port {self.port} did not accept connections within "
                          f"{timeout:.0f} s; see {self.log}.")


def _run_as() -> pwd.struct_passwd | None:
    """The unprivileged user to run PostgreSQL as, or None when we are not root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(UNPRIVILEGED_USER)
    except KeyError:
        raise PrefectServerError(f"PostgreSQL refuses to run as root and there is no user "
                          f"{UNPRIVILEGED_USER!r} to run it as; run as another user.") from None


def _check_reachable(folder: Path, user: pwd.struct_passwd) -> None:
    """Fail with what to do when `user` cannot search every folder above `folder`."""
    for parent in folder.resolve().parents:
        mode = parent.stat()
        if mode.st_uid != user.pw_uid and not mode.st_mode & stat.S_IXOTH:
            raise PrefectServerError(
                f"PostgreSQL refuses to run as root, so dyngen runs it as {user.pw_name!r}, "
                f"who cannot reach {folder} ({parent} is not searchable by others): "
                f"`chmod o+x {parent}`, or keep the server's folder under one that is.")
