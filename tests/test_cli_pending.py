"""`dyngen pending` on a real store: the batch ends no version covers, before and after a
round (`dyngen round`, a real flow run) covers them; --json; a dataset that does not exist."""

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
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "store")
    store.create("ds", verl_rows(4))
    store.write_batch_end("ds", "run-a", 1, {"score": 0.5, "loss": 1.0},
                          [{"prompt": "What is 1 + 1?", "score": 1.0}] * 3)
    store.write_batch_end("ds", "run-a", 2, {"score": 0.6})
    return store


@pytest.mark.usefixtures("prefect_server")
def test_pending_lists_the_batch_ends_a_round_then_covers(store: Store) -> None:
    before = run(store.root, "pending", "ds")
    assert before.exit_code == 0, before.output
    assert "ds: 2 batch end(s) pending at v0" in before.output
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in before.output.splitlines()
            if line.startswith("│") and "run-a" in line]
    # run, step, written (UTC), metrics, rollouts
    assert [(r[0], r[1], r[3], r[4]) for r in rows] == [("run-a", "1", "2", "3"),
                                                        ("run-a", "2", "1", "-")]
    assert all(r[2].startswith("20") and len(r[2]) == 19 for r in rows)

    as_json = run(store.root, "pending", "ds", "--json")
    assert as_json.exit_code == 0, as_json.output
    entries = [json.loads(line) for line in as_json.output.splitlines()]
    assert [(e["run"], e["step"], e["metrics"], e["rollouts"]) for e in entries] == [
        ("run-a", 1, {"score": 0.5, "loss": 1.0}, 3), ("run-a", 2, {"score": 0.6}, None)]
    assert all(e["written_at"].endswith("+00:00") for e in entries)

    rnd = run(store.root, "round", "ds", "round.retries=0")  # no trigger: a catch-up round
    assert rnd.exit_code == 0, rnd.output
    assert "committed 'ds' version 1" in rnd.output
    assert "version 1 covers run-a steps 1–2" in rnd.output

    after = run(store.root, "pending", "ds")
    assert after.exit_code == 0, after.output
    assert "ds: nothing pending at v1" in after.output
    assert run(store.root, "pending", "ds", "--json").output == ""


def test_pending_of_a_dataset_that_does_not_exist_is_a_user_error(store: Store) -> None:
    missing = run(store.root, "pending", "nope")
    assert missing.exit_code == 2 and "dataset 'nope' does not exist" in missing.output
    Store(store.root).create("empty", verl_rows(1))
    assert "empty: nothing pending at v0" in run(store.root, "pending", "empty").output
