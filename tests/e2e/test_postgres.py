"""The local Prefect server on PostgreSQL: a cluster of ours started and stopped by PID, and
a round whose flow run the server records in it."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dyngen.server.local import LocalServer
from tests.e2e.conftest import DYNGEN, REPO, env_for, seeded

ROUND_CONFIG = ["data.datagen.path=pkg://tests.flows.gens", "data.datagen.name=UsesContext"]


@pytest.fixture
def pg_server() -> Iterator[LocalServer]:
    # Under root PostgreSQL runs as `nobody`, who must reach its folder: pytest's own
    # temporary folders are private to their owner.
    folder = Path(tempfile.mkdtemp(prefix="dyngen-pg-test-"))
    os.chmod(folder, 0o711)
    srv = LocalServer(folder / "prefect", database="postgresql")
    try:
        yield srv.start()
    finally:
        srv.stop()
        shutil.rmtree(folder, ignore_errors=True)


def test_a_round_is_recorded_by_the_server_in_postgresql(pg_server: LocalServer,
                                                         tmp_path: Path) -> None:
    import asyncpg

    store = seeded(tmp_path, "on-pg")
    done = subprocess.run([*DYNGEN, "--root", str(store.root), "round", "on-pg", *ROUND_CONFIG,
                           "--step", "3"], env=env_for(pg_server), cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = store.head("on-pg").lineage["flow_run_id"]

    async def state_of_run() -> str | None:
        assert pg_server.postgres is not None
        conn = await asyncpg.connect(pg_server.postgres.url.replace("+asyncpg", ""))
        try:
            return await conn.fetchval("SELECT state_type FROM flow_run WHERE id = $1",
                                       run_id)
        finally:
            await conn.close()

    assert asyncio.run(state_of_run()) == "COMPLETED"
    postgres = pg_server.postgres.process
    assert postgres is not None and postgres.poll() is None
    pg_server.stop()
    assert postgres.poll() is not None, "postgres outlived its server's stop()"
