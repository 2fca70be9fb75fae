"""The store walkthrough behind `dyngen demo`."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow.parquet as pq
from rich.console import Console

from dyngen.demo import run_demo
from dyngen.store import verify


def test_demo_builds_three_verified_versions_and_an_export(tmp_path: Path) -> None:
    out = io.StringIO()
    store = run_demo(tmp_path, Console(file=out, width=120))
    history = store.history("arith-0")
    assert [(r.version, r.operation, r.rows) for r in history] == [
        (0, "create", 16), (1, "append", 24), (2, "append", 32)]
    assert verify(store, "arith-0") == []
    exported = pq.read_table(tmp_path / "arith-0.parquet")
    assert exported.num_rows == 32 and "_dyngen_version" not in exported.column_names
    for row in exported.to_pylist():  # every generated ground truth is the true answer
        a, op, b = row["prompt"][-1]["content"].removeprefix("What is ").rstrip("?").split()
        assert int(row["reward_model"]["ground_truth"]) == (int(a) + int(b) if op == "+"
                                                            else int(a) * int(b))
    assert "verify: ok" in out.getvalue()
    run_demo(tmp_path, Console(file=io.StringIO()))  # a second run reuses, never duplicates
    assert store.head("arith-0").version == 2
