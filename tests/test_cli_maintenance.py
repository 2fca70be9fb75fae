"""`dyngen log --limit/--all`, `dyngen compact` and `dyngen vacuum` on real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from dyngen.cli import app
from dyngen.store import Store
from tests.rows import verl_rows


def run(root: Path, *args: str) -> Result:
    return CliRunner(env={"COLUMNS": "200"}).invoke(app, ["--root", str(root), *args])


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """Dataset `ds`: version 0 of 2 rows, then 11 appends of one row each."""
    store = Store(tmp_path / "store")
    store.create("ds", verl_rows(2))
    for r in range(11):
        store.append("ds", verl_rows(1, start=2 + r), idempotency_key=f"event:{r}")
    return store.root


def versions_shown(stdout: str) -> list[int]:
    return [int(line.split()[1]) for line in stdout.splitlines()
            if line.startswith("│") and line.split()[1].isdigit()]


def test_log_shows_the_newest_versions_first(root: Path) -> None:
    result = run(root, "log", "ds", "--limit", "3")
    assert result.exit_code == 0, result.output
    assert "newest 3 of 12 versions" in result.stdout
    assert versions_shown(result.stdout) == [11, 10, 9]
    assert "13 (+1)" in result.stdout  # the oldest shown still gets its row delta
    assert versions_shown(run(root, "log", "ds").stdout) == list(range(11, -1, -1))
    assert versions_shown(run(root, "log", "ds", "--all").stdout) == list(range(11, -1, -1))
    lines = run(root, "log", "ds", "--json", "--limit", "2").stdout.splitlines()
    assert [json.loads(x)["version"] for x in lines] == [10, 11]  # oldest of the shown first
    assert json.loads(lines[-1])["added"][0]["rows"] == 1


def test_compact_merges_small_shards_and_says_so(root: Path) -> None:
    result = run(root, "compact", "ds")
    assert result.exit_code == 0, result.output
    assert "nothing to compact: the head (v11) has 12 small shard(s); the policy allows 50" \
        in result.stdout
    result = run(root, "compact", "ds", "--max-small-shards", "4", "--fan-in", "4")
    assert result.exit_code == 0, result.output
    assert "compacted 'ds' as version 12" in result.stdout
    result = run(root, "compact", "ds", "--full")
    assert "compacted 'ds' as version 13" in result.stdout and "1 data shard(s)" in result.stdout
    assert "compact (" in run(root, "log", "ds", "--limit", "1").stdout
    assert [e["index"] for e in Store(root).load("ds")["extra_info"]] == list(range(13))


def test_vacuum_expires_versions_and_loading_one_names_the_vacuum(root: Path) -> None:
    assert run(root, "compact", "ds", "--full").exit_code == 0
    result = run(root, "vacuum", "ds", "--keep-versions", "1", "--grace-seconds", "0",
                 "--dry-run")
    assert result.exit_code == 0, result.output
    assert "would remove data/" in result.stdout and Store(root).head_version("ds") == 12
    result = run(root, "vacuum", "ds", "--keep-versions", "1", "--grace-seconds", "0")
    assert result.exit_code == 0, result.output
    assert "vacuum committed as version 13: versions below 12 no longer load" in result.stdout
    result = run(root, "show", "ds", "--version", "3")
    assert result.exit_code == 2
    assert "removed by retention" in result.stderr
    assert "dyngen vacuum --keep-versions 1" in result.stderr
    assert "vacuum (< v12 expired)" in run(root, "log", "ds", "--limit", "1").stdout
    assert run(root, "verify", "ds").exit_code == 0


def test_vacuum_without_a_rule_is_a_usage_error(root: Path) -> None:
    result = run(root, "vacuum", "ds")
    assert result.exit_code == 2
    assert "--keep-versions N or --keep-days D" in result.stderr


def test_help_lists_the_maintenance_commands(root: Path) -> None:
    result = run(root, "--help")
    assert result.exit_code == 0
    assert "compact" in result.stdout and "vacuum" in result.stdout


def test_the_commands_defaults_are_the_stores() -> None:
    """The CLI writes the defaults out (so `--help` imports no store code): keep them equal."""
    from dyngen.cli import maintenance
    from dyngen.store.compaction import CompactionPolicy
    from dyngen.store.retention import DEFAULT_GRACE_SECONDS

    policy = CompactionPolicy()
    assert policy.max_small_shards == maintenance.MAX_SMALL_SHARDS
    assert policy.fan_in == maintenance.FAN_IN
    assert policy.target_bytes == maintenance.TARGET_MB * 2**20
    assert maintenance.DEFAULT_GRACE_SECONDS == DEFAULT_GRACE_SECONDS
