"""Code tasks: yield and drops per seed, sandbox runs per second, label precision by re-execution.

All in one run, on CPU, with the default model (SmolLM2-135M-Instruct, in-process):
  proposals  CodeTaskProposer on the shipped seed tasks (generators/code_tasks/seed_tasks.jsonl):
             hard_k seeds x proposals_per_seed, `passes` passes: proposals and kept per seed,
             drops by reason, seconds generating and checking
  labels     every kept row's program re-run in a fresh sandbox (and the seed file's 36):
             the share whose value is the row's label (it must be 100%)
  sandbox    `--runs` calls of a small function through run_python (warm sandboxes), one at
             a time and `workers` at once (as the generator runs them); the baseline, in the
             same run (5 interleaved rounds, medians), is the cold path (a sandbox started
             and ended per run) and, for scale, a plain `python -c pass` subprocess
  rewards    `--rewards` abduction reward calls (code_task_reward, one batch), each running
             the program on the answer, with sandbox_workers 1 and `workers`

    python benchmarks/code_tasks.py [--seeds 8] [--proposals 4] [--passes 1] [--runs 1000]
                                    [--rewards 4096]
                                    [--workers 2] [--tasks deduction,abduction]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROGRAM = "def f(x):\n    return sorted(x, reverse=True)[:3]\n"


def runs_per_second(run: Any, count: int, workers: int) -> float:
    """`count` calls of `run(i)` on `workers` threads: calls per second."""
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(run, range(count)))
    return count / (time.perf_counter() - start)


def sandbox_speed(count: int, workers: int, rounds: int = 5) -> None:
    """Sandbox runs per second, warm (run_python: the process-wide pool of warm sandboxes)
    against cold (a sandbox started and ended per run, as before warm sandboxes) and plain
    `python -c pass` subprocesses, same run: `rounds` interleaved rounds, medians."""
    from dyngen.sandbox import require_bwrap, run_python
    from dyngen.sandbox.pool import close_pool
    from dyngen.sandbox.process import execute

    require_bwrap()

    def warm(i: int) -> None:
        assert run_python(PROGRAM, "f", [i, 3, 9, 1]).ok

    def cold(i: int) -> None:
        assert execute(PROGRAM, "f", repr([i, 3, 9, 1]), timeout_seconds=5, memory_mb=512,
                       isolation="bwrap").ok

    def plain(i: int) -> None:
        subprocess.run([sys.executable, "-c", "pass"], check=True)

    # (label, function, calls per round): a cold run costs ~10x a warm one
    kinds = [("plain `python -c pass` (venv, site)", plain, max(2, count // rounds // 10)),
             ("run_python cold (a sandbox per run)", cold, max(2, count // rounds // 10)),
             ("run_python warm (sandbox pool)", warm, max(2, count // rounds))]
    warm(0)  # the pool's first sandbox starts outside the timing, as in a long training run
    rates: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for label, run, calls in kinds:
            for w in (1, workers):
                rates.setdefault((label, w), []).append(runs_per_second(run, calls, w))
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"{'runs/s (median of ' + str(rounds) + ' rounds)':<44}{'1 at a time':>12}"
          f"{f'{workers} at once':>12}")
    for label, _, _ in kinds:
        print(f"{label:<44}{med[label, 1]:>12.1f}{med[label, workers]:>12.1f}")
    hot, cool = kinds[2][0], kinds[1][0]
    print(f"{'ratio warm / cold':<44}{med[hot, 1] / med[cool, 1]:>12.2f}"
          f"{med[hot, workers] / med[cool, workers]:>12.2f}")
    close_pool()


def reward_speed(calls: int, workers: int) -> None:
    """Seconds for `calls` abduction rewards (each runs the program on the answer in the
    sandbox), as TRL calls code_task_reward with a whole batch."""
    from dyngen.generators.code_tasks.reward import code_task_reward
    from dyngen.generators.code_tasks.tasks import ABDUCTION

    info = {"task": ABDUCTION, "program": PROGRAM, "function": "f", "input": "[1, 2, 3, 4]",
            "output": "[4, 3, 2]"}
    completions = [f"It sorts.\nAnswer: [{i % 7}, 2, 3, 4]" for i in range(calls)]
    for w in (1, workers):
        start = time.perf_counter()
        scores = code_task_reward(prompts=[""] * calls, completions=completions,
                                  reward_model=[{"ground_truth": info["output"]}] * calls,
                                  extra_info=[info] * calls, sandbox_workers=w)
        seconds = time.perf_counter() - start
        print(f"{calls} abduction reward calls, sandbox_workers={w}: {seconds:.1f} s "
              f"({calls / seconds:.0f}/s; {sum(scores):.0f} scored 1.0)")


def relabel(rows: list[dict[str, Any]]) -> tuple[int, int]:
    """(rows whose program, re-run in a fresh sandbox, gives their label; rows)."""
    from dyngen.generators.code_tasks.tasks import literal
    from dyngen.sandbox import run_python, same_value

    def same(row: dict[str, Any]) -> bool:
        info = row["extra_info"]
        result = run_python(info["program"], info["function"], literal(info["input"])[1])
        return result.ok and same_value(result.value or "", info["output"]) and \
            info["output"] == row["reward_model"]["ground_truth"]

    with ThreadPoolExecutor(2) as pool:
        return sum(pool.map(same, rows)), len(rows)


def proposals(args: argparse.Namespace, cache: Path) -> None:
    """One generate call on the shipped seed tasks: yield, drops, precision of the labels."""
    import datasets

    from dyngen.generators.code_tasks import CodeTaskProposer
    from dyngen.generators.code_tasks.seed_tasks import SEED_FILE

    data = datasets.Dataset.from_json(str(SEED_FILE))
    gen = CodeTaskProposer({"cache_dir": str(cache), "hard_k": args.seeds,
                            "proposals_per_seed": args.proposals, "max_passes": args.passes,
                            "min_rows": 10**6, "tasks": args.tasks.split(",")})
    start = time.perf_counter()
    rows = gen.generate(data).to_list()
    seconds = time.perf_counter() - start
    st = gen.stats
    seeds = st["seeds"]
    print(f"proposals: {seeds} seeds x {args.proposals} proposals x {st['passes']} passes "
          f"in {seconds:.1f} s (generating {st['generate_seconds']:.1f} s, "
          f"{st['generated_tokens']} tokens; sandbox {st['sandbox_seconds']:.1f} s for "
          f"{st['programs_run']} programs run twice)")
    print(f"  proposed {st['proposed']} ({st['proposed'] / seeds:.2f} per seed), kept "
          f"{st['kept']} programs ({st['kept'] / seeds:.2f} per seed, "
          f"{st['kept'] / max(st['proposed'], 1):.1%}), rows {st['rows']} {st['tasks']}")
    print("  dropped: " + ", ".join(f"{k} {v}" for k, v in st["dropped"].items()))
    for row in rows[:: max(1, len(rows) // 6)]:
        info = row["extra_info"]
        print(f"    kept ({info['task']}): {json.dumps(info['program'])}  f({info['input']}) "
              f"-> {info['output']}")
    ok, total = relabel(rows)
    seeds_ok, seed_total = relabel(datasets.Dataset.from_json(str(SEED_FILE)).to_list())
    print(f"labels by re-execution in a fresh sandbox: kept rows {ok}/{total} "
          f"({ok / max(total, 1):.0%}), seed file {seeds_ok}/{seed_total} "
          f"({seeds_ok / seed_total:.0%})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=8, help="hard_k")
    ap.add_argument("--proposals", type=int, default=4, help="proposals_per_seed")
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--runs", type=int, default=1000, help="warm sandbox runs to time")
    ap.add_argument("--rewards", type=int, default=4096, help="abduction reward calls")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tasks", default="deduction")
    ap.add_argument("--cache", default=str(REPO / ".dyngen" / "models"),
                    help="the converted model's folder (default: the project's cache)")
    ap.add_argument("--only", choices=("sandbox", "proposals"), default=None)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    if args.only != "proposals":
        sandbox_speed(args.runs, args.workers)
        print()
        reward_speed(args.rewards, args.workers)
        print()
    if args.only != "sandbox":
        proposals(args, Path(args.cache))


if __name__ == "__main__":
    main()
