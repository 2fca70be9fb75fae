"""The `dyngen` command on real files: every command, its output and its exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner, Result

import dyngen.cli
from dyngen.cli import app
from dyngen.store import PROVENANCE_COLUMNS, Store
from tests.rows import verl_row, verl_rows

REPO = Path(__file__).resolve().parents[1]
COMMANDS = ("import", "log", "show", "export", "verify", "restore", "gc", "datasets")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def seed_file(tmp_path: Path) -> Path:
    path = tmp_path / "seed.parquet"
    pq.write_table(pa.Table.from_pylist(verl_rows(5)), path)
    return path


def run(root: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner(env=env).invoke(app, ["--root", str(root), *args])


@pytest.fixture
def seeded(root: Path, seed_file: Path) -> Store:
    """Dataset `ds`: v0 imported from seed_file, v1 a round with lineage and a rejected row."""
    assert run(root, "import", "ds", str(seed_file)).exit_code == 0
    store = Store(root)
    rejected = [{"reason": "overlong_prompt", "detail": "2000 tokens > 1024",
                 "row": json.dumps(verl_row(99, content="a very long prompt"))}]
    store.append("ds", verl_rows(2, start=5, source="gen"), rejected=rejected,
                 generator="MockDataGenerator", round_id="round-abcdef123456", lineage={
                     "generator": {"class": "dyngen.generators.base.MockDataGenerator",
                                   "path": "pkg://dyngen.generators.base", "config_hash": "f00"},
                     "trigger": {"event_id": "evt-0123456789", "step": 12, "metrics": {}},
                     "counts": {"generated": 4, "kept": 2,
                                "rejected": {"overlong_prompt": 1, "duplicate": 1}},
                     "flow_run_id": "run-9876543210",
                 })
    return store


def test_help_lists_every_command(root: Path) -> None:
    result = run(root, "--help")
    assert result.exit_code == 0
    for command in COMMANDS:
        assert command in result.stdout


def test_import_log_show_export_restore_verify(root: Path, seed_file: Path,
                                               tmp_path: Path) -> None:
    result = run(root, "import", "ds", str(seed_file))
    assert result.exit_code == 0, result.output
    assert "5 rows" in result.stdout and "version 0" in result.stdout

    result = run(root, "log", "ds")
    assert result.exit_code == 0, result.output
    assert "import (1 file)" in result.stdout

    result = run(root, "show", "ds", "--limit", "2", "--offset", "1")
    assert result.exit_code == 0, result.output
    assert "What is 1 + 1?" in result.stdout and "What is 2 + 2?" in result.stdout
    assert "What is 0 + 0?" not in result.stdout and "What is 3 + 3?" not in result.stdout
    assert "Solve the problem." not in result.stdout  # the last user message, not the system

    out = tmp_path / "out" / "train.parquet"
    result = run(root, "export", "ds", str(out))
    assert result.exit_code == 0, result.output
    assert pq.read_table(out).to_pylist() == pq.read_table(seed_file).to_pylist()

    result = run(root, "restore", "ds", "0")
    assert result.exit_code == 0, result.output
    assert "as version 1" in result.stdout

    result = run(root, "verify", "ds")
    assert result.exit_code == 0, result.output
    assert "ok: ds: 2 versions, head v1 with 5 rows" in result.stdout


def test_log_shows_lineage_and_row_delta(root: Path, seeded: Store) -> None:
    result = run(root, "log", "ds", env={"COLUMNS": "200"})  # one table line per version
    assert result.exit_code == 0, result.output
    line = next(ln for ln in result.stdout.splitlines() if "append" in ln)
    for expected in ("7 (+2)", "MockDataGenerator", "step 12", "evt-0123", "kept 2/4",
                     "duplicate 1", "overlong_prompt 1", "run-9876"):
        assert expected in line
    assert "dyngen.generators.base" not in line and "run-98765" not in line


def test_log_json_prints_one_record_per_line(root: Path, seeded: Store) -> None:
    result = run(root, "log", "ds", "--json")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["version"], r["operation"], r["rows"]) for r in records] == [
        (0, "create", 5), (1, "append", 7)]
    assert records[1]["lineage"]["trigger"]["step"] == 12


def test_show_provenance_and_time_travel(root: Path, seeded: Store) -> None:
    result = run(root, "show", "ds", "--offset", "5")
    assert result.exit_code == 0, result.output
    assert "rows 5..6 of 7" in result.stdout
    assert "MockDataGenerator" in result.stdout and "round-ab" in result.stdout
    assert "v1" in result.stdout and "What is 5 + 5?" in result.stdout

    result = run(root, "show", "ds", "--version", "0", "--offset", "5")
    assert result.exit_code == 0
    assert "no rows at offset 5 (there are 5)" in result.stdout

    rows = [json.loads(ln) for ln in run(root, "show", "ds", "--json").stdout.splitlines()]
    assert len(rows) == 7
    assert [r["_dyngen_version"] for r in rows] == [0] * 5 + [1] * 2
    assert rows[6]["_dyngen_generator"] == "MockDataGenerator"


def test_show_rejected_rows_with_reason(root: Path, seeded: Store) -> None:
    result = run(root, "show", "ds", "--rejected")
    assert result.exit_code == 0, result.output
    assert "overlong_prompt" in result.stdout and "2000 tokens > 1024" in result.stdout
    assert "a very long prompt" in result.stdout

    line = run(root, "show", "ds", "--rejected", "--json").stdout.strip()
    row = json.loads(line)
    assert row["reason"] == "overlong_prompt"
    assert row["row"]["extra_info"]["index"] == 99


def test_export_version_with_provenance(root: Path, seeded: Store, tmp_path: Path) -> None:
    out = tmp_path / "v0.parquet"
    result = run(root, "export", "ds", str(out), "--version", "0", "--with-provenance")
    assert result.exit_code == 0, result.output
    assert "5 rows" in result.stdout and "version 0" in result.stdout
    table = pq.read_table(out)
    assert set(PROVENANCE_COLUMNS) <= set(table.column_names)
    assert table.num_rows == 5


def test_damaged_shard_verify_lists_it_and_show_fails_cleanly(root: Path, seeded: Store) -> None:
    shard = next(s.path for s in seeded.record("ds", 0).shards)
    (root / "ds" / shard).unlink()

    result = run(root, "verify", "ds")
    assert result.exit_code == 1
    assert shard in result.stdout
    assert "ok:" not in result.stdout

    result = run(root, "show", "ds")
    assert result.exit_code == 2
    assert "error:" in result.stderr and "cannot load version 1" in result.stderr
    assert "Traceback" not in result.output


def test_verify_all_and_argument_checks(root: Path, seeded: Store, seed_file: Path) -> None:
    assert run(root, "import", "other", str(seed_file)).exit_code == 0
    result = run(root, "verify", "--all")
    assert result.exit_code == 0, result.output
    assert "ok: ds:" in result.stdout and "ok: other:" in result.stdout

    assert run(root, "verify").exit_code == 2
    assert run(root, "verify", "ds", "--all").exit_code == 2
    result = run(root, "verify", "nope")
    assert result.exit_code == 2  # a typo is a user error, not damage
    assert "'nope' does not exist" in result.stderr


def test_bad_dataset_name_is_a_user_error(root: Path, seed_file: Path) -> None:
    result = run(root, "import", "../x", str(seed_file))
    assert result.exit_code == 2
    assert "error: invalid dataset name '../x'" in result.stderr
    assert "Traceback" not in result.output
    assert not (root.parent / "x").exists()


def test_missing_input_file_is_a_user_error(root: Path, tmp_path: Path) -> None:
    missing = tmp_path / "missing.parquet"
    result = run(root, "import", "ds", str(missing))
    assert result.exit_code == 2
    assert "error:" in result.stderr and str(missing) in result.stderr


def test_unknown_dataset_names_the_store_root(root: Path) -> None:
    result = run(root, "log", "nope")
    assert result.exit_code == 2
    assert "'nope' has no committed version" in result.stderr
    assert str(root) in result.stderr


def test_debug_shows_the_traceback(root: Path, seed_file: Path) -> None:
    result = CliRunner().invoke(app, ["--root", str(root), "--debug", "import", "../x",
                                      str(seed_file)])
    assert result.exit_code == 2
    assert "Traceback" in result.stderr and "DatasetNameError" in result.stderr
    assert "error: invalid dataset name" in result.stderr


def test_unexpected_exception_exits_3_with_a_hint(root: Path, seeded: Store,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> list[str]:
        raise RuntimeError("boom")

    monkeypatch.setattr(dyngen.cli, "gc", broken)
    result = run(root, "gc", "ds")
    assert result.exit_code == 3
    assert "unexpected RuntimeError: boom" in result.stderr and "--debug" in result.stderr
    assert "Traceback" not in result.output


def test_gc_dry_run_lists_an_orphan_then_removes_it(root: Path, seeded: Store) -> None:
    old = root / "ds" / "data" / "deadbeef.arrow"
    old.write_bytes(b"left by a crashed round")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    young = root / "ds" / "data" / "cafebabe.arrow"
    young.write_bytes(b"a round in flight")

    result = run(root, "gc", "ds", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "would remove data/deadbeef.arrow" in result.stdout
    assert "cafebabe" not in result.stdout
    assert old.exists()

    result = run(root, "gc", "ds")
    assert result.exit_code == 0, result.output
    assert "removed data/deadbeef.arrow" in result.stdout
    assert not old.exists() and young.exists()
    assert run(root, "verify", "ds").exit_code == 0
    assert "nothing to remove" in run(root, "gc", "ds").stdout


def test_datasets_lists_head_and_rows(root: Path, seeded: Store) -> None:
    result = run(root, "datasets")
    assert result.exit_code == 0, result.output
    line = next(ln for ln in result.stdout.splitlines() if " ds " in ln)
    assert "v1" in line and "7" in line


def test_root_from_env_and_from_config(root: Path, seeded: Store, tmp_path: Path) -> None:
    env = {"DYNGEN_STORE_ROOT": str(root)}
    result = CliRunner(env=env).invoke(app, ["log", "ds", "--json"])
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 2

    config = tmp_path / "dyngen.yaml"
    config.write_text(f"store:\n  root: {root}\n")
    result = CliRunner(env={"DYNGEN_STORE_ROOT": None}).invoke(
        app, ["--config", str(config), "log", "ds", "--json"])
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 2


def test_console_script_starts() -> None:
    result = subprocess.run([sys.executable, "-m", "dyngen.cli", "--help"], cwd=REPO,
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    assert "verify" in result.stdout and "import" in result.stdout


def test_serve_refuses_an_unknown_isolation_before_touching_a_server(root: Path) -> None:
    result = run(root, "serve", "--isolation", "threads")
    assert result.exit_code == 2
    assert "--isolation must be 'fork' or 'process', found 'threads'" in result.output
