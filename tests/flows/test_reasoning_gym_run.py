"""A simulated training run on ReasoningGymCurriculum, as users run it: `dyngen round` after
each batch end, with the batch's rollouts file, from a scripted policy that solves a family
up to a hidden level and fails above it. One round in the middle runs in a new process
(a restart): levels come back from the dataset's lineage, nothing else holds them.

With window W, a family at hidden level H first reaches H at round 1 + W*H and from then on
is at H, except W rounds at H + 1 after each wait (W*2, W*4, ... rounds): with W = 2, after
14 rounds chain_sum (H = 1) and leg_counting (H = 3) are at their hidden levels. The
restarted round (9) promotes leg_counting on a window that began in the old process.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dyngen.cli import app
from dyngen.report import report_html
from dyngen.store import Store
from dyngen.trainers.rollouts import rollouts_dir, write_rollouts
from tests.rows import verl_rows

pytestmark = pytest.mark.usefixtures("prefect_server")

REPO = Path(__file__).resolve().parents[2]
HIDDEN = {"chain_sum": 1, "leg_counting": 3}
WINDOW, ROUNDS, RESTART_AT = 2, 14, 9
# Round by round (W = 2): up every 2 rounds; at H + 1 the policy fails and the level falls
# back after 2 rounds; H + 1 is tried again after 4 rounds at H (then after 8).
EXPECTED = {"chain_sum": [0, 0, 1, 1, 2, 2, 1, 1, 1, 1, 2, 2, 1, 1],
            "leg_counting": [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 3, 3]}
CONFIG = f"""
data:
  datagen:
    path: pkg://dyngen.generators.reasoning_gym
    name: ReasoningGymCurriculum
    tasks: {{chain_sum: 1, leg_counting: 1}}
    rows_per_round: 8
    promote_at: 0.8
    demote_at: 0.3
    window: {WINDOW}
    seed: 0
"""


def batch(store: Store, rng: random.Random) -> list[dict[str, Any]]:
    """A training batch: the newest round's rows and a few older reasoning-gym rows."""
    head = store.head("rg")
    rows = store.load("rg", head.version).to_list()
    older = len(store.load("rg", head.version - 1))
    fresh = rows[older:]  # the near-duplicate filter may have kept fewer than were made
    ours = [r for r in rows[:older] if r["data_source"].startswith("reasoning_gym/")]
    return fresh + rng.sample(ours, min(4, len(ours)))


def rollouts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The scripted policy's rewards: 1 up to the family's hidden level, 0 above. Every other
    record names its family; the rest carry only the prompt (found in the dataset)."""
    out = []
    for i, row in enumerate(rows):
        info = row["extra_info"]["reasoning_gym"]
        record = {"prompt": row["prompt"],
                  "score": 1.0 if info["level"] <= HIDDEN[info["family"]] else 0.0}
        if i % 2:
            record["data_source"] = row["data_source"]
        out.append(record)
    return out


def levels(store: Store) -> list[dict[str, int]]:
    """Each round's levels, from the version records' lineage."""
    return [dict(r.lineage["generator"]["state"]["levels"]) for r in store.history("rg")[1:]]


def test_each_family_settles_at_its_hidden_level_across_a_restart(tmp_path: Path) -> None:
    from prefect.settings import PREFECT_API_URL

    store = Store(tmp_path / "store")
    store.create("rg", verl_rows(4))
    config = tmp_path / "dyngen.yaml"
    config.write_text(CONFIG)
    folder = rollouts_dir(store.root, "rg", "run-1")
    rng = random.Random(0)
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PYTHONPATH": str(REPO)}
    for step in range(1, ROUNDS + 1):
        args = ["--root", str(store.root), "round", "rg", "--config", str(config),
                "--step", str(step)]
        if step > 1:
            path = write_rollouts(folder / f"batch-{step}.jsonl", rollouts(batch(store, rng)))
            args += ["--rollouts", str(path)]
        if step == RESTART_AT:  # a new process: only the lineage knows the levels
            done = subprocess.run([sys.executable, "-m", "dyngen.cli", *args], env=env,
                                  cwd=REPO, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, done.stderr[-3000:]
        else:
            result = CliRunner().invoke(app, args)
            assert result.exit_code == 0, result.output
    trajectory = levels(store)
    assert len(trajectory) == ROUNDS
    for family, hidden in HIDDEN.items():
        seen = [t[family] for t in trajectory]
        first = seen.index(hidden)
        assert first + 1 == 1 + WINDOW * hidden, seen  # round numbers count from 1
        assert all(hidden <= level <= hidden + 1 for level in seen[first:]), seen
        assert seen[-2:] == [hidden] * 2, seen
    # The whole run, the restarted round included, is the one the rules give: levels went on
    # from the lineage exactly as in one process.
    assert [t["chain_sum"] for t in trajectory] == EXPECTED["chain_sum"]
    assert [t["leg_counting"] for t in trajectory] == EXPECTED["leg_counting"]
    assert trajectory[-1]["leg_counting"] - trajectory[-1]["chain_sum"] == 2
    # Rows are written at the level of their round; the stats count them by level.
    head = store.head("rg").lineage["generator"]["stats"]
    assert head["rows"] == {f: {str(h): 4} for f, h in HIDDEN.items()}
    # `dyngen report` draws each family's level across the versions.
    page = report_html(store, "rg")
    drawn = page[page.index('data-chart="levels"'):page.index('data-chart="timings"')]
    assert all(re.search(rf"<text[^>]*>{family}</text>", drawn) for family in HIDDEN)
    print("\nround  " + "  ".join(HIDDEN) + "\n" + "\n".join(
        f"{i:>5}  " + "  ".join(f"{t[f]:>{len(f)}}" for f in HIDDEN)
        for i, t in enumerate(trajectory, 1)))


def test_an_unknown_family_fails_the_round_before_it_commits_anything(tmp_path: Path) -> None:
    from dyngen.flows.generation_round import generation_round

    store = Store(tmp_path / "store")
    store.create("rg", verl_rows(4))
    config = {"store": {"root": str(store.root)}, "data": {"datagen": {
        "path": "pkg://dyngen.generators.reasoning_gym", "name": "ReasoningGymCurriculum",
        "tasks": ["chain_summ", "leg_counting"]}}}
    state = generation_round("rg", config, {"step": 1}, return_state=True)
    assert state.is_failed()
    assert "no task family 'chain_summ'. Did you mean chain_sum" in state.message
    assert store.head_version("rg") == 0
