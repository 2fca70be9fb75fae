"""Real `prefect server start`s on 127.0.0.1 for the end-to-end tests (one without auth, one
with basic auth), stopped by PID."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dyngen.server.local import LocalServer
from dyngen.store import Store
from tests.rows import verl_rows

REPO = Path(__file__).resolve().parents[2]
DYNGEN = [sys.executable, "-m", "dyngen.cli"]
PREFECT = str(Path(sys.executable).with_name("prefect"))


# The session's servers stay on SQLite, the database these tests were written against;
# PostgreSQL, the default where the server extra is installed, has tests of its own
# (test_postgres.py, test_chaos.py, tests/test_demo.py, tests/test_temporary_server.py).
@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    srv = LocalServer(tmp_path_factory.mktemp("prefect-server"), database="sqlite").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    """A real server with Prefect's basic auth on: only /health answers without it."""
    srv = LocalServer(tmp_path_factory.mktemp("prefect-auth-server"), database="sqlite",
                      auth_string=f"dyngen:{secrets.token_hex(12)}").start()
    yield srv
    srv.stop()


def env_for(server: LocalServer, **extra: str) -> dict[str, str]:
    """Environment for our subprocesses: this server, this checkout."""
    return server.env(PYTHONPATH=str(REPO), **extra)


def seeded(tmp_path: Path, name: str) -> Store:
    """A store with dataset `name` at version 0 (4 verl rows)."""
    store = Store(tmp_path / "store")
    store.create(name, verl_rows(4))
    return store


def prefect_cli(env: dict[str, str], *args: str) -> str:
    """Run the `prefect` command from this checkout (as prefect.yaml expects); its output."""
    out = subprocess.run([PREFECT, *args], env={**env, "PWD": str(REPO)}, cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout
