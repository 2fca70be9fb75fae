"""`dyngen round --dry-run`: the round's own load, generate and filter stages, with no
Prefect server, committing nothing, printing the rows kept and rejected with their reasons.

The command runs in a fresh interpreter with PREFECT_API_URL unset and Prefect's temporary
server disabled (PREFECT_SERVER_EPHEMERAL_ENABLED=false): any flow run, task run or event
would fail the command ("No Prefect API URL provided"), so its success shows no server was
needed, and none was started (the fresh PREFECT_HOME holds no database, and no kept server
is recorded).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from dyngen.store import Store
from tests.rows import verl_rows
from tests.support import write

REPO = Path(__file__).resolve().parents[1]
GENERATOR = '''
    from dyngen import AbstractDataGenerator


    class Mixed(AbstractDataGenerator):
        """Two new sums, a copy of the dataset's first row, and a row without a prompt."""

        def generate(self, dataset, context=None):
            new = [{"data_source": "sums", "ability": "math",
                    "prompt": [{"role": "user", "content": f"What is {a} + 1000?"}],
                    "reward_model": {"style": "rule", "ground_truth": str(a + 1000)},
                    "extra_info": {"index": 100 + a}} for a in (1, 2)]
            copy = dict(dataset[0])
            bare = {"data_source": "sums", "ability": "math",
                    "reward_model": {"style": "rule", "ground_truth": "1"},
                    "extra_info": {"index": 9}}
            return [*new, copy, bare]
'''


def run_dry(folder: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_HOME": str(folder / "prefect-home"),
           "PREFECT_SERVER_EPHEMERAL_ENABLED": "false",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "XDG_CACHE_HOME": str(folder / "cache"), "COLUMNS": "200"}
    env.pop("PREFECT_API_URL", None)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "dyngen.cli", "--root", str(folder / "store"),
                           "round", *args], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=300)
    return done, time.monotonic() - started


def test_a_dry_run_shows_kept_and_rejected_rows_and_commits_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.create("ds", verl_rows(3))
    store.write_batch_end("ds", "run-a", 1, {"score": 0.5})
    write(tmp_path / "mixed.py", GENERATOR)
    done, seconds = run_dry(tmp_path, "ds", "--dry-run", "--step", "1",
                            "data.datagen.path=mixed.py", "data.datagen.name=Mixed")
    print(f"dry run: {seconds:.2f} s\n{done.stdout}")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr
    out = done.stdout
    assert "dry run of 'ds' on version 0 (3 rows), generator Mixed: generated 4, kept 2" in out
    assert "rejected 2 {'duplicate': 1, 'schema': 1}; nothing committed" in out
    assert "a round now would cover the pending batch ends run-a step 1" in out
    kept = out.split("kept (2):\n")[1].split("rejected (2):\n")[0].splitlines()
    assert kept == ["  + What is 1 + 1000? → 1001", "  + What is 2 + 1000? → 1002"]
    rejected = out.split("rejected (2):\n")[1].splitlines()
    assert len(rejected) == 2
    assert rejected[0].startswith("  - duplicate: ") or rejected[1].startswith("  - duplicate: ")
    schema = next(line for line in rejected if line.startswith("  - schema: "))
    assert "prompt" in schema  # the reason's detail names what is wrong
    # nothing committed, nothing covered
    after = Store(store.root)
    assert after.head_version("ds") == 0
    assert [(e.run, e.step) for e in after.pending("ds")] == [("run-a", 1)]
    # no Prefect server: no database in the fresh home, no kept server recorded
    home = tmp_path / "prefect-home"
    assert not (home / "prefect.db").exists() and not (home / "postgres").exists()
    assert not (tmp_path / "cache" / "dyngen" / "servers").exists()
    # the stages' own work is well under a second here; the rest is imports
    assert seconds < 60



def test_a_dry_run_asks_again_as_the_round_would_and_says_why_it_stopped(
        tmp_path: Path) -> None:
    """round.top_up.min_rows above what one call keeps: the dry run asks again; a generator
    that ignores context.attempt writes the same rows, and it stops, naming the fix."""
    store = Store(tmp_path / "store")
    store.create("ds", verl_rows(3))
    write(tmp_path / "mixed.py", GENERATOR)
    done, _ = run_dry(tmp_path, "ds", "--dry-run", "data.datagen.path=mixed.py",
                      "data.datagen.name=Mixed", "round.top_up.min_rows=4")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    out = " ".join(done.stdout.split())
    assert "generated 8, kept 2" in out  # two calls; the second's rows are the first's
    assert ("kept 2 rows of the 4 wanted after 2 generator calls; the generator's last call "
            "wrote only rows it had written before: does it seed by context.round_seed") in out
    assert Store(store.root).head_version("ds") == 0
