"""The temporary Prefect server of a command run without PREFECT_API_URL (`dyngen round`, a
trainer's inline round, `run_round`): found or started by `ensure_prefect_api`.

It is the server Prefect starts as its own temporary server (uvicorn on Prefect's app, no
UI), on PostgreSQL under the Prefect home where the extra `dyngen[server]` is installed
(dyngen/server/database.py), its output in a log file, never on the user's terminal (a
server stopped while it flushes prints tracebacks of its own). By default it is kept for
the next command until unused for DYNGEN_SERVER_IDLE_TIMEOUT seconds (dyngen/server/kept.py;
its keeper, dyngen/server/keeper.py); with 0 it is this process's own, stopped (then its
database) when the process exits.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from dyngen.errors import PrefectServerError
from dyngen.server.database import default_database, sqlite_note
from dyngen.server.processes import (
    free_port,
    seconds_setting,
    spawn,
    stop,
    wait_healthy,
)

if TYPE_CHECKING:
    from dyngen.server.postgres import LocalPostgres

# Prefect's temporary server creates its SQLite database on the first start in a new
# PREFECT_HOME: ~116 migrations, 9 s on a loaded 2-core machine, past Prefect's default
# 20 s start-up budget together with the server's own import. dyngen waits this long.
TEMPORARY_SERVER_TIMEOUT_ENV = "DYNGEN_SERVER_START_TIMEOUT"
TEMPORARY_SERVER_TIMEOUT_SECONDS = 300.0
_own: dict[str, Any] = {}  # this process's own server (idle timeout 0): its process and URL


def ensure_prefect_api(out: TextIO | None = None) -> str | None:
    """The Prefect API this process will use; without PREFECT_API_URL, a temporary server:
    the one an earlier command left running (dyngen/server/kept.py), else one started now
    (on PostgreSQL under the Prefect home where the extra is installed, see
    dyngen/server/database.py) with a patient timeout, saying on `out` (stderr) what it
    waits for. It stays up for the next command until idle for DYNGEN_SERVER_IDLE_TIMEOUT
    seconds (0: this process's own, stopped when it exits).

    Points this process's Prefect at it (PREFECT_API_URL in its environment, which the
    processes it starts inherit) and returns its address; None when Prefect has no API and
    may not start one (its own error then says to set PREFECT_API_URL).
    """
    from prefect.settings import PREFECT_API_URL, get_current_settings

    from dyngen.server.kept import find_or_start, idle_timeout, leased, server_key, use_kept

    if PREFECT_API_URL.value():
        return str(PREFECT_API_URL.value())
    settings = get_current_settings()
    if not settings.server.ephemeral.enabled:
        return None
    if _own and _own["process"].poll() is None:  # this process's own, started already
        return _use(str(_own["url"]))
    idle = idle_timeout()
    postgres = _temporary_postgres(settings)
    key = server_key(settings, "postgresql" if postgres else "sqlite") if idle else None
    out = out or sys.stderr
    known = key is not None and leased(key)  # this process used it already: say nothing
    if key is not None and (found := use_kept(key)) is not None:
        if known:
            return _use(found.api_url)
        print(f"PREFECT_API_URL is not set: using the temporary Prefect server at "
              f"{found.api_url} an earlier command started (it stops after {idle:g} s "
              f"unused)", file=out, flush=True)
        return _use(found.api_url)
    timeout = max(float(settings.server.ephemeral.startup_timeout_seconds),
                  temporary_server_timeout())

    def announce() -> None:
        _say_starting(settings, postgres, timeout, out, idle)

    started = time.monotonic()
    # The throwaway server's telemetry heartbeat races its own SQLite writes at start-up and
    # prints a "database is locked" traceback into the user's first round; a user's own
    # setting still wins.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    try:
        if key is None:
            announce()
            url = _start_own(settings, timeout)
        else:
            env = {**os.environ, **settings.to_environment_variables(exclude_unset=True)}
            env.pop("PREFECT_API_URL", None)
            kept, new = find_or_start(key, env, idle, timeout, on_start=announce)
            url = kept.api_url
            if not new:  # another command started it meanwhile
                return _use(url)
    except Exception as exc:
        raise PrefectServerError(
            f"the temporary Prefect server did not start within {timeout:.0f} s "
            f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}). Start one "
            f"with `prefect server start` and set PREFECT_API_URL to it, or give it more time "
            f"with {TEMPORARY_SERVER_TIMEOUT_ENV}=<seconds>.") from exc
    kept_note = (f"; kept for the next command until unused for {idle:g} s "
                 f"(DYNGEN_SERVER_IDLE_TIMEOUT)" if key else "")
    print(f"  temporary Prefect server up at {url} after "
          f"{time.monotonic() - started:.0f} s{kept_note}", file=out, flush=True)
    return _use(url)


def _use(url: str) -> str:
    """Point this process's Prefect at `url`: its clients (the settings they read, refreshed
    from the environment) and the processes it starts."""
    from prefect import context

    os.environ["PREFECT_API_URL"] = url
    refresh = getattr(context, "refresh_global_settings_context", None)
    if refresh is not None:
        refresh()
    return url


def _say_starting(settings: Any, postgres: LocalPostgres | None, timeout: float,
                  out: TextIO, idle: float) -> None:
    """Say what the start of a temporary server waits for, before the wait."""
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


def _start_own(settings: Any, timeout: float) -> str:
    """Start this process's own temporary server, stopped (then its database) at exit."""
    proc, postgres, port = start_temporary_server(
        Path(settings.home) / "temporary-server.log", timeout)

    def stop_all() -> None:
        stop(proc)
        if postgres is not None:
            postgres.stop()

    atexit.register(stop_all)
    _own.update(process=proc, url=f"http://127.0.0.1:{port}/api")
    return str(_own["url"])


def start_temporary_server(log: Path, timeout: float,
                           ) -> tuple[subprocess.Popen[bytes], LocalPostgres | None, int]:
    """The temporary server's database, then the server as Prefect starts its own temporary
    one (uvicorn on Prefect's app, no UI) on a free port, its output to `log`, sent SIGTERM
    if this process dies. Both are stopped if it fails."""
    import prefect
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    postgres = _temporary_postgres(settings)
    env = {**os.environ, **settings.to_environment_variables(exclude_unset=True),
           "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
           "PREFECT__SERVER_FINAL": "1"}
    env.pop("PREFECT_API_URL", None)
    try:
        if postgres is not None:
            env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = postgres.start().url
        for attempt in range(3):
            port = free_port()
            proc = spawn([sys.executable, "-m", "uvicorn", "--app-dir",
                          str(prefect.__module_path__.parent), "--factory",
                          "prefect.server.api.server:create_app", "--host", "127.0.0.1",
                          "--port", str(port), "--log-level", "error", "--lifespan", "on"],
                         env, log, die_with_parent=True)
            try:
                wait_healthy(f"http://127.0.0.1:{port}/api", timeout, proc)
                return proc, postgres, port
            except RuntimeError:  # it exited: its port was taken meanwhile, say
                if attempt == 2:
                    raise
            except BaseException:
                stop(proc)
                raise
        raise AssertionError("unreachable")
    except BaseException:
        if postgres is not None:
            postgres.stop()
        raise


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


def temporary_server_timeout() -> float:
    """Seconds to wait for a temporary Prefect server: $DYNGEN_SERVER_START_TIMEOUT or 300."""
    return seconds_setting(
        TEMPORARY_SERVER_TIMEOUT_ENV, TEMPORARY_SERVER_TIMEOUT_SECONDS, zero_ok=False,
        expected="a number of seconds > 0",
        advice=f"Unset it to wait the default {TEMPORARY_SERVER_TIMEOUT_SECONDS:.0f} s.")


def _sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite connection URL, else None."""
    prefix, sep, path = url.partition(":///")
    if not sep or not prefix.startswith("sqlite") or path.startswith(":memory:"):
        return None
    return Path(path.split("?", 1)[0])
