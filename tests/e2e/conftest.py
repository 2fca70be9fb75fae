"""One real `prefect server start` on 127.0.0.1 for the end-to-end tests, stopped by PID."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dyngen.local_server import LocalServer
from dyngen.store import Store
from tests.rows import verl_rows

REPO = Path(__file__).resolve().parents[2]
DYNGEN = [sys.executable, "-m", "dyngen.cli"]


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    srv = LocalServer(tmp_path_factory.mktemp("prefect-server")).start()
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
