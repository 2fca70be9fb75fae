"""A local Prefect server and helper processes, started and stopped by PID.

Used by `dyngen demo`, the benchmarks and the end-to-end tests: `prefect server start` on
127.0.0.1 with PostgreSQL or SQLite (dyngen/server/database.py) under a folder of ours,
optionally with basic auth, and child processes (serve, worker, postgres) in their own
process groups so that stopping one stops everything it started. Without PREFECT_API_URL,
Prefect's temporary server, on the same database choice (`ensure_prefect_api`).
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import httpx

from dyngen.errors import ConfigError, PrefectServerError
from dyngen.server.auth import AUTH_HINT, auth_headers
from dyngen.server.database import DATABASES, default_database, sqlite_note
from dyngen.server.processes import OwnedProcess, spawn
from dyngen.server.processes import free_port as free_port  # re-exported, as before
from dyngen.server.processes import stop as stop  # re-exported, as before

if TYPE_CHECKING:
    from dyngen.server.postgres import LocalPostgres

START_TIMEOUT_SECONDS = 180.0
# Prefect's temporary server creates its SQLite database on the first start in a new
# PREFECT_HOME: ~116 migrations, 9 s on a loaded 2-core machine, past Prefect's default
# 20 s start-up budget together with the server's own import. dyngen waits this long.
TEMPORARY_SERVER_TIMEOUT_ENV = "DYNGEN_SERVER_START_TIMEOUT"
TEMPORARY_SERVER_TIMEOUT_SECONDS = 300.0


# The server's own writes, batched: SQLite lets one transaction write at a time, and a
# request that reads before it writes and meets another writer is answered 503 "database
# is locked", which Prefect's client retries after 2 s or more. The task-run recorder
# otherwise writes each task-run event on its own (about 20 per round), the event
# persister every 20 events. Task runs and events then reach the UI within a second or
# two. Values already in the environment win.
SERVER_BATCHING = {
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "100",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_BATCH_SIZE": "200",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL": "2",
}


def prefect_env(home: Path, api_url: str | None = None,
                extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for Prefect processes: our home folder, offline, quick polling."""
    env = {**SERVER_BATCHING, **os.environ,
           "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_RUNNER_POLL_FREQUENCY": "1",
           # Queued (ENQUEUE) rounds retry their slot every second, not every 30 s.
           "PREFECT_SERVER_DEPLOYMENTS_CONCURRENCY_SLOT_WAIT_SECONDS": "1",
           # Round slots' leases on disk, not in server memory: a round holding one when
           # the server restarts can still renew and release it.
           "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE":
               "prefect.server.concurrency.lease_storage.filesystem",
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
           # SQLite waits up to this long for a lock. At the default 10 s a loaded machine
           # gets "database is locked", a 503 inside the trigger's run-deployment action,
           # and Prefect does not retry it: that batch end's round never runs.
           "PREFECT_SERVER_DATABASE_TIMEOUT": "60"}
    if api_url:
        env["PREFECT_API_URL"] = api_url
    env.update(extra or {})
    return env


def wait_healthy(api_url: str, timeout: float = START_TIMEOUT_SECONDS,
                 proc: subprocess.Popen[bytes] | None = None) -> None:
    """Wait until `<api_url>/health` answers 200, or fail saying why."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the Prefect server exited with code {proc.returncode} "
                               "before becoming healthy; see its log.")
        try:
            if httpx.get(f"{api_url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"the Prefect server at {api_url} was not healthy after {timeout:.0f} s")


def wait_for_automation(api_url: str, name: str, timeout: float = 120.0,
                        settle_seconds: float = 2.0, auth_string: str | None = None) -> None:
    """Wait until an automation (a deployment's event trigger) exists on the server.

    Events emitted before a trigger exists match nothing; after it appears, the server's
    trigger service needs a moment to load it (`settle_seconds`). `auth_string` defaults to
    PREFECT_API_AUTH_STRING.
    """
    headers = auth_headers(auth_string)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            response = httpx.post(f"{api_url}/automations/filter", timeout=5, headers=headers,
                                  json={"automations": {"name": {"any_": [name]}}})
            if response.status_code in (401, 403):
                raise PermissionError(f"the Prefect server at {api_url} refused the request "
                                      f"(HTTP {response.status_code}); {AUTH_HINT}")
            found = response.json()
        except (httpx.HTTPError, ValueError):
            found = []
        if isinstance(found, list) and found:
            time.sleep(settle_seconds)
            return
        time.sleep(0.5)
    raise TimeoutError(f"the automation {name!r} did not appear on {api_url} within "
                       f"{timeout:.0f} s; is `dyngen serve` running? See its log.")


def ensure_prefect_api(out: TextIO | None = None) -> str | None:
    """The Prefect API this process will use; without PREFECT_API_URL, start Prefect's
    temporary server now (on PostgreSQL under the Prefect home where the extra is installed,
    see dyngen/server/database.py), with a patient timeout, saying on `out` (stderr) what it
    waits for.

    Returns the API address, or None when Prefect has no API and may not start one (its
    own error then says to set PREFECT_API_URL).
    """
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, get_current_settings

    if PREFECT_API_URL.value():
        return str(PREFECT_API_URL.value())
    settings = get_current_settings()
    if not settings.server.ephemeral.enabled:
        return None
    # The instance Prefect's own clients use for the run (one per process).
    server = SubprocessASGIServer()
    if server.running:
        return server.api_url
    timeout = max(float(settings.server.ephemeral.startup_timeout_seconds),
                  temporary_server_timeout())
    out = out or sys.stderr
    postgres = _temporary_postgres(settings)
    if postgres is not None:
        database: Path | None = postgres.data
        first = not (postgres.data / "PG_VERSION").is_file()
        what, note = f"its PostgreSQL database {database}", None
    else:
        url = settings.server.database.connection_url
        database = _sqlite_file(url.get_secret_value() if url is not None else "")
        first = database is not None and not database.exists()
        what = f"its database {database}"
        note = sqlite_note("sqlite") if database is not None and not _database_chosen(
            settings) else None
    why = (f"the first start in this PREFECT_HOME creates {what}, which can take a minute "
           "on a slow machine" if first else "this takes a few seconds")
    print(f"PREFECT_API_URL is not set: starting a temporary Prefect server for this run"
          f"{' on PostgreSQL' if postgres else ''}; {why} (waiting up to {timeout:.0f} s)…",
          file=out, flush=True)
    if note:
        print(f"  {note}", file=out, flush=True)
    started = time.monotonic()
    # The throwaway server's telemetry heartbeat races its own SQLite writes at start-up and
    # prints a "database is locked" traceback into the user's first round; a user's own
    # setting still wins.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    try:
        _start_temporary(server, postgres, int(timeout))
    except Exception as exc:
        raise PrefectServerError(
            f"the temporary Prefect server did not start within {timeout:.0f} s "
            f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}). Start one "
            f"with `prefect server start` and set PREFECT_API_URL to it, or give it more time "
            f"with {TEMPORARY_SERVER_TIMEOUT_ENV}=<seconds>.") from exc
    print(f"  temporary Prefect server up at {server.api_url} after "
          f"{time.monotonic() - started:.0f} s", file=out, flush=True)
    return server.api_url


def _database_chosen(settings: Any) -> bool:
    """Whether the user set the server's database (a URL, or a driver and its parts)."""
    return bool({"connection_url", "driver"} & settings.server.database.model_fields_set)


def _temporary_postgres(settings: Any) -> LocalPostgres | None:
    """The cluster for the temporary server (`<PREFECT_HOME>/postgres`), or None for the
    database Prefect would use anyway (SQLite, or the one the user configured)."""
    if _database_chosen(settings) or default_database() != "postgresql":
        return None
    from dyngen.server.postgres import LocalPostgres

    return LocalPostgres(Path(settings.home) / "postgres")


def _start_temporary(server: Any, postgres: LocalPostgres | None, timeout: int) -> None:
    """Start the temporary server, on `postgres` if given, which stops after it at exit."""
    if postgres is None:
        server.start(timeout=timeout)
        return
    from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL, temporary_settings

    postgres.start()
    # Registered before the server's own stop (at its start): exit handlers run last
    # first, so the database stops after the server.
    atexit.register(postgres.stop)
    try:
        # The server process takes its settings from this one's at its start.
        with temporary_settings(updates={PREFECT_SERVER_DATABASE_CONNECTION_URL: postgres.url}):
            server.start(timeout=timeout)
    except BaseException:
        atexit.unregister(postgres.stop)
        postgres.stop()
        raise


def temporary_server_timeout() -> float:
    """Seconds to wait for a temporary Prefect server: $DYNGEN_SERVER_START_TIMEOUT or 300."""
    raw = os.environ.get(TEMPORARY_SERVER_TIMEOUT_ENV, "").strip()
    if not raw:
        return TEMPORARY_SERVER_TIMEOUT_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ConfigError(f"{TEMPORARY_SERVER_TIMEOUT_ENV}: expected a number of seconds > 0, "
                          f"found {raw!r}. Unset it to wait the default "
                          f"{TEMPORARY_SERVER_TIMEOUT_SECONDS:.0f} s.")
    return value


def _sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite connection URL, else None."""
    prefix, sep, path = url.partition(":///")
    if not sep or not prefix.startswith("sqlite") or path.startswith(":memory:"):
        return None
    return Path(path.split("?", 1)[0])


@dataclass
class LocalServer(OwnedProcess):
    """`prefect server start` on 127.0.0.1, its database under `home`: PostgreSQL (a local
    cluster in `home/postgres`, see dyngen/server/postgres.py) where the extra is installed,
    else SQLite (a file), unless `database` says; basic auth if `auth_string`."""

    home: Path
    port: int = field(default_factory=free_port)
    database: str = field(default_factory=default_database)  # "sqlite" or "postgresql"
    process: subprocess.Popen[bytes] | None = None
    auth_string: str | None = None  # "user:password"; only /health answers without it
    postgres: LocalPostgres | None = None
    die_with_parent: bool = False  # the server ends when the process that started it dies

    def __post_init__(self) -> None:
        if self.database not in DATABASES:
            raise PrefectServerError(f"database must be one of {', '.join(DATABASES)}, "
                                     f"found {self.database!r}.")

    @property
    def note(self) -> str | None:
        """A one-line note when the server is on SQLite for want of the extra (else None)."""
        return sqlite_note(self.database)

    @property
    def ui_url(self) -> str:
        """The address of the Prefect UI."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        """The API address clients use (PREFECT_API_URL): the UI's address + /api."""
        return self.ui_url + "/api"

    @property
    def log(self) -> Path:
        """Where the server's output goes."""
        return self.home / "server.log"

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for processes that talk to this server (with its credentials)."""
        auth = {"PREFECT_API_AUTH_STRING": self.auth_string} if self.auth_string else {}
        return prefect_env(self.home, self.api_url, {**auth, **extra})

    def client_settings(self) -> AbstractContextManager[Any]:
        """Prefect settings for talking to this server from this process (`with ...:`)."""
        from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

        return temporary_settings(updates={PREFECT_API_URL: self.api_url,
                                           PREFECT_API_AUTH_STRING: self.auth_string})

    def start(self, timeout: float = START_TIMEOUT_SECONDS) -> LocalServer:
        """Start the database (PostgreSQL) and the server; wait until it is healthy."""
        self.home.mkdir(parents=True, exist_ok=True)
        prefect = Path(sys.executable).with_name("prefect")
        # The UI must call this server's API, not the default port 4200.
        extra = {"PREFECT_UI_API_URL": self.api_url}
        with self.stopped_on_failure():
            if self.database == "postgresql":
                if self.postgres is None:  # the same cluster (and port) across restarts
                    from dyngen.server.postgres import LocalPostgres

                    self.postgres = LocalPostgres(self.home / "postgres")
                extra["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = self.postgres.start().url
            env = prefect_env(self.home, extra=extra)
            # Auth is exactly what this object says, whatever the caller's environment holds.
            env.pop("PREFECT_SERVER_API_AUTH_STRING", None)
            if self.auth_string:
                env["PREFECT_SERVER_API_AUTH_STRING"] = self.auth_string
            self.process = spawn([str(prefect), "server", "start", "--host", "127.0.0.1",
                                  "--port", str(self.port)], env, self.log,
                                 die_with_parent=self.die_with_parent)
            wait_healthy(self.api_url, timeout, self.process)
        return self

    def stop(self) -> None:
        """Stop the server, then its database, by their PIDs."""
        self.stop_process()
        if self.postgres is not None:
            self.postgres.stop()
