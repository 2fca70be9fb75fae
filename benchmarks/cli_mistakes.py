"""How long a newcomer waits: `dyngen --help`, and a config mistake until its message.

Each command runs in a fresh interpreter, PREFECT_API_URL unset, alternately with the
baseline (a bare `python -c "import typer"`, the floor any typer CLI pays), best of N; it
prints wall and CPU seconds of each and the ratio to the baseline. A config mistake
(a missing generator file, a generator key typo) must answer before any server starts.

    python benchmarks/cli_mistakes.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GENERATOR = '''import datasets
from dyngen import AbstractDataGenerator


class HarderSums(AbstractDataGenerator):
    defaults = {"rows": 4}

    def generate(self, dataset, context=None):
        return datasets.Dataset.from_list([])
'''
ROW = {"data_source": "sums", "prompt": [{"role": "user", "content": "What is 1 + 1?"}],
       "ability": "math", "reward_model": {"style": "rule", "ground_truth": "2"},
       "extra_info": {"index": 0}}


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds and exit code of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, timeout=600)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), \
        done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PREFECT_API_URL", None)
    folder = Path(tempfile.mkdtemp(prefix="dyngen-bench-cli-"))
    (folder / "train.jsonl").write_text(json.dumps(ROW) + "\n")
    (folder / "harder_sums.py").write_text(GENERATOR)
    cli = [sys.executable, "-m", "dyngen.cli"]
    subprocess.run([*cli, "import", "my-data", "train.jsonl"], cwd=folder, env=env, check=True,
                   capture_output=True)
    round_ = [*cli, "round", "my-data", "--step", "1", "data.datagen.name=HarderSums"]
    cases = {
        "baseline: python -c 'import typer'": [sys.executable, "-c", "import typer"],
        "dyngen --help": [*cli, "--help"],
        "missing generator file": [*round_, "data.datagen.path=harder_sum.py"],
        "generator key typo": [*round_, "data.datagen.path=harder_sums.py",
                               "data.datagen.rowz=3"],
    }
    best = {name: (float("inf"), float("inf"), 0) for name in cases}
    for _ in range(args.repeat):  # interleaved: the machine's noise hits every case alike
        for name, argv in cases.items():
            wall, cpu, code = timed(argv, folder, env)
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu), code)
    base_wall, base_cpu, _ = best[next(iter(cases))]
    print(f"{'case':38} {'wall s':>7} {'cpu s':>7} {'exit':>4} {'wall/base':>9}")
    for name, (wall, cpu, code) in best.items():
        print(f"{name:38} {wall:7.2f} {cpu:7.2f} {code:4d} {wall / base_wall:9.1f}")


if __name__ == "__main__":
    main()
