"""`dyngen export NAME DEST --format delta`: the mirror from a shell, incremental; the
default format is still one verl parquet file."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from deltalake import DeltaTable
from typer.testing import CliRunner, Result

from dyngen.cli import app
from dyngen.store import Store
from tests.mirror.test_delta import as_multiset, delta_rows
from tests.rows import verl_rows


def run(root: Path, *args: str) -> Result:
    return CliRunner(env={"COLUMNS": "200"}).invoke(app, ["--root", str(root), *args])


def test_export_format_delta_mirrors_then_brings_the_mirror_up_to_the_head(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.create("ds", verl_rows(3))
    store.append("ds", verl_rows(2, start=3))
    dest = tmp_path / "mirrors" / "ds"
    first = run(store.root, "export", "ds", str(dest), "--format", "delta")
    assert first.exit_code == 0, first.output
    assert f"mirrored 'ds' versions 0..1 to {dest}" in first.output
    assert delta_rows(dest, 1) == as_multiset(store.load("ds").to_list())

    again = run(store.root, "export", "ds", str(dest), "--format", "delta")
    assert again.exit_code == 0 and "is current (version 1); nothing to do" in again.output
    store.append("ds", verl_rows(1, start=5))
    third = run(store.root, "export", "ds", str(dest), "--format", "delta")
    assert "versions 2..2" in third.output and DeltaTable(str(dest)).version() == 2


def test_export_still_writes_one_parquet_file_by_default(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.create("ds", verl_rows(3))
    out = tmp_path / "out.parquet"
    done = run(store.root, "export", "ds", str(out))
    assert done.exit_code == 0 and "exported 3 rows of 'ds' version 0" in done.output
    assert pq.read_table(out).num_rows == 3


def test_bad_export_options_are_usage_errors(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.create("ds", verl_rows(1))
    dest = str(tmp_path / "m")
    bad = run(store.root, "export", "ds", dest, "--format", "orc")
    assert bad.exit_code == 2 and "--format: expected parquet or delta, found 'orc'" in \
        bad.output
    both = run(store.root, "export", "ds", dest, "--format", "delta", "--with-provenance")
    assert both.exit_code == 2 and "always holds the _dyngen_* columns" in both.output
    assert not Path(dest).exists()
