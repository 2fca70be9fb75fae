"""A local store, or a Delta mirror, whose disk is full, for real: a small tmpfs filled to
the last block.

Mounting needs root (as CI and the development machines run); where `mount` is refused the
tests fail saying so rather than skip. The file size limit (`ulimit -f`, EFBIG) is the
same situation for any user and is tested in a child process.
"""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import datasets
import pytest
from prefect.client.orchestration import get_client
from typer.testing import CliRunner

from dyngen.cli import app
from dyngen.errors import StoreFullError
from dyngen.flows.generation_round import generation_round
from dyngen.store import Store, verify
from tests.rows import verl_rows

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs holding a store with dataset `ds` (version 0), then filled up.

    Deleting its `filler` file frees the space again."""
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:8]}"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"these tests mount a small tmpfs, which needs root: {done.stderr.strip()}")
    try:
        Store(mount / "store").create("ds", verl_rows(4))
        fill(mount)
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=True)


def fill(mount: Path) -> None:
    """Write `mount/filler` until the disk has no block left."""
    with open(mount / "filler", "wb", buffering=0) as filler, \
            pytest.raises(OSError) as raised:
        while True:
            filler.write(b"\0" * 4096)
    assert raised.value.errno == errno.ENOSPC


def test_the_cli_says_the_stores_disk_is_full_and_nothing_was_committed(
        full_disk: Path, tmp_path: Path) -> None:
    root = full_disk / "store"
    rows = tmp_path / "rows.parquet"
    datasets.Dataset.from_list(verl_rows(3, start=10)).to_parquet(rows)

    made = CliRunner().invoke(app, ["--root", str(root), "import", "new", str(rows)])
    assert made.exit_code == 2, made.output
    message = " ".join(made.output.split())
    assert "cannot access" not in message
    assert f"the disk holding store {root} is full (No space left on device)" in message
    assert "Nothing was committed: dataset 'new' was not created" in message
    assert "Free space on that disk" in message and "dyngen gc new" in message

    with pytest.raises(StoreFullError, match="Nothing was committed: dataset 'ds' is at "
                                             "version 0") as raised:
        Store(root).append("ds", verl_rows(2, start=20))
    assert isinstance(raised.value, OSError)  # code catching OSError keeps working
    assert (raised.value.errno, raised.value.strerror) == (errno.ENOSPC,
                                                          "No space left on device")
    store = Store(root)
    assert store.head_version("ds") == 0 and store.head_version("new") is None
    assert verify(store, "ds") == []

    (full_disk / "filler").unlink()  # what the message says: free space, run again
    again = CliRunner().invoke(app, ["--root", str(root), "import", "new", str(rows)])
    assert again.exit_code == 0, again.output
    assert Store(root).head_version("new") == 0


@pytest.mark.usefixtures("prefect_server")
def test_a_round_on_a_full_disk_fails_saying_so_and_lands_once_space_is_freed(
        full_disk: Path) -> None:
    root = full_disk / "store"
    config = {
        "store": {"root": str(root)},
        "data": {"filter_overlong_prompts": False,
                 "datagen": {"path": "pkg://tests.flows.gens", "name": "AddNewRows"}},
        "round": {"retries": 0, "retry_delay_seconds": 0},
    }
    trigger = {"event_id": "full-disk-1", "step": 3}
    state = generation_round("ds", config, trigger, return_state=True)
    assert state.is_failed()
    with get_client(sync_client=True) as client:
        recorded = client.read_flow_run(state.state_details.flow_run_id).state
    message = " ".join(recorded.message.split())
    assert "StoreFullError" in message
    assert f"the disk holding store {root} is full" in message
    assert "Nothing was committed: dataset 'ds' is at version 0" in message
    assert Store(root).head_version("ds") == 0

    (full_disk / "filler").unlink()
    state = generation_round("ds", config, trigger, return_state=True)
    assert state.is_completed(), state.message
    assert state.result()["version"] == 1
    assert Store(root).head_version("ds") == 1


def _limit_file_size() -> None:
    limit = 64 * 1024  # a shard of the rows below is larger
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_the_file_size_limit_is_reported_as_no_room_too(tmp_path: Path) -> None:
    rows = tmp_path / "rows.parquet"
    long = "x" * 2000
    data = [{**r, "prompt": [{"role": "user", "content": f"{long} {i}"}]}
            for i, r in enumerate(verl_rows(100))]
    datasets.Dataset.from_list(data).to_parquet(rows)
    root = tmp_path / "store"
    env = {**os.environ, "COLUMNS": "300"}
    done = subprocess.run(
        [sys.executable, "-m", "dyngen.cli", "--root", str(root), "import", "big", str(rows)],
        capture_output=True, text=True, cwd=REPO, env=env, preexec_fn=_limit_file_size)
    assert done.returncode == 2, done.stderr
    message = " ".join(done.stderr.split())
    assert f"a file of store {root} would grow past the largest file size allowed" in message
    assert "(File too large)" in message
    assert "Nothing was committed: dataset 'big' was not created" in message
    assert Store(root).head_version("big") is None


def test_a_delta_mirror_on_a_full_disk_says_so_and_goes_on_once_space_is_freed(
        full_disk: Path, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    root, dest = tmp_path / "store", full_disk / "mirror"
    store = Store(root)
    store.create("ds", verl_rows(4))
    export = ["--root", str(root), "export", "ds", str(dest), "--format", "delta"]
    (full_disk / "filler").unlink()
    assert CliRunner().invoke(app, export).exit_code == 0
    fill(full_disk)
    store.append("ds", verl_rows(3, start=10))

    failed = CliRunner().invoke(app, export)
    assert failed.exit_code == 2, failed.output
    message = " ".join(failed.output.split())
    assert "cannot access" not in message
    assert f"the disk holding mirror {dest} is full (No space left on device" in message
    assert "holds version 0 of 'ds': version 1 was not committed" in message
    assert "run `dyngen export ds` again: it goes on from version 1" in message
    assert DeltaTable(str(dest)).version() == 0

    (full_disk / "filler").unlink()
    again = CliRunner().invoke(app, export)
    assert again.exit_code == 0, again.output
    table = DeltaTable(str(dest))
    assert table.version() == 1
    assert sorted(table.to_pyarrow_table().column("extra_info").to_pylist(),
                  key=lambda e: e["index"]) == sorted(store.load("ds")["extra_info"],
                                                      key=lambda e: e["index"])
