"""A local Prefect server and helper processes, started and stopped by PID.

Used by `dyngen demo`, the benchmarks and the end-to-end tests: `prefect server start` on
127.0.0.1 with PostgreSQL or SQLite (dyngen/server/database.py) under a folder of ours,
optionally with basic auth, and child processes (serve, worker, postgres) in their own
process groups so that stopping one stops everything it started. Without PREFECT_API_URL,
a temporary server, on the same database choice (`ensure_prefect_api`, re-exported from
dyngen/server/temporary.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from dyngen.errors import PrefectServerError
from dyngen.server.auth import AUTH_HINT, auth_headers
from dyngen.server.database import DATABASES, default_database, sqlite_note
from dyngen.server.processes import OwnedProcess, spawn
from dyngen.server.processes import free_port as free_port  # re-exported, as before
from dyngen.server.processes import stop as stop  # re-exported, as before
from dyngen.server.processes import wait_healthy as wait_healthy  # re-exported, as before
from dyngen.server.temporary import (  # re-exported, as before
    TEMPORARY_SERVER_TIMEOUT_ENV as TEMPORARY_SERVER_TIMEOUT_ENV,
)
from dyngen.server.temporary import _temporary_postgres as _temporary_postgres
from dyngen.server.temporary import ensure_prefect_api as ensure_prefect_api
from dyngen.server.temporary import temporary_server_timeout as temporary_server_timeout

if TYPE_CHECKING:
    from dyngen.server.postgres import LocalPostgres

START_TIMEOUT_SECONDS = 180.0


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
