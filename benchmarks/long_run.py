"""A store through a whole training run: N versions of 10 rows, as rounds commit them.

Each version goes through the store API as a generation round calls it, each stage with
a fresh `Store` (as each Prefect task makes one): idempotency lookup, head load, dedup
against the head, `prepare_append` + `commit_with_rebase` with the trigger's key, then
the default compaction policy. At N/10 and at N it measures, each in the same run:

  append     p50 of prepare_append + commit (+ compaction) over the last 100 versions,
             against the first 100 (target <= 1.5); and, as the load of a shared machine
             drifts over a long run, 100 more rounds interleaved with the first 100 rounds
             of a new store, so noise hits both alike
  log bytes  bytes per version of _versions/ (and of the whole log: checkpoints and key
             markers too) at N against N/10 (target <= 2)
  head load  Store.load(head) in a fresh process, checksums verified, against the same
             rows committed as one shard (targets <= 0.5 s and <= 2x)
  lookup     find_idempotency_key from a fresh Store, 20 keys spread over the log (median
             and max) and an unknown key (target <= 10 ms)
  log        `dyngen log NAME --limit 20` as a command, wall time (target <= 1 s), with
             Python's start and imports alone, and the command's own work in-process
  verify     `dyngen verify NAME` as a command: wall time and peak RSS (target <= 500 MB)

then extrapolates each to 100,000 versions from the slope between N/10 and N (a figure
that did not grow is kept as it is).

    python benchmarks/long_run.py [--versions 10000] [--rows 10]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.rows import bench_row  # noqa: E402
from dyngen.store import CompactionPolicy, Store  # noqa: E402
from dyngen.store.keys import prompt_keys  # noqa: E402

NAME = "run"
_ENV = {"PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HF_DATASETS_OFFLINE": "1"}
_TIMED = r"""
import json, os, subprocess, sys, tempfile, time
report, out = sys.argv[1], sys.argv[2]
with open(out, "w") as fh, tempfile.TemporaryFile() as err:
    t0 = time.perf_counter()
    proc = subprocess.Popen(sys.argv[3:], stdout=fh, stderr=err)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    err.seek(0)
    stderr = err.read().decode(errors="replace")
with open(report, "w") as fh:
    json.dump({"seconds": seconds, "maxrss_kb": usage.ru_maxrss, "stderr": stderr,
               "returncode": os.waitstatus_to_exitcode(status)}, fh)
"""
_LOAD = r"""
import json, sys, time
import datasets  # imported before timing: a trainer or round has it loaded already
from dyngen.store import Store
t0 = time.perf_counter()
ds = Store(sys.argv[1]).load(sys.argv[2])
print(json.dumps({"seconds": time.perf_counter() - t0, "rows": len(ds)}))
"""


def one_round(root: Path, version: int, rows: int, policy: CompactionPolicy) -> float:
    """A round's store calls for one version; returns the seconds its append took."""
    key = f"event:{version}"
    assert Store(root).find_idempotency_key(NAME, key) is None
    store = Store(root)
    head = store.head(NAME)
    store.load(NAME, head.version)
    new = [bench_row(version * rows + i) for i in range(rows)]
    assert not Store(root).contains_prompts(NAME, prompt_keys([r["prompt"] for r in new]),
                                            head.version).any()
    t0 = time.perf_counter()
    store = Store(root)
    pending = store.prepare_append(NAME, new, idempotency_key=key, round_id=f"r{version}",
                                   generator="bench", lineage={"round": version})
    store.commit_with_rebase(pending)
    Store(root).compact(NAME, policy)
    return time.perf_counter() - t0


def folder_bytes(folder: Path) -> int:
    """Bytes of every file under `folder`."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def run_command(*args: str) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MB) and stdout of `python *args` in a fresh process.

    A child's peak RSS on Linux includes the memory image it was forked from, so the
    command is started by a small Python process (_TIMED) that measures it, not by this
    one, which holds a whole store's caches by now.
    """
    with tempfile.TemporaryDirectory() as tmp:
        report, out = Path(tmp) / "report.json", Path(tmp) / "out.txt"
        subprocess.run([sys.executable, "-c", _TIMED, str(report), str(out), sys.executable,
                        *args], cwd=REPO, env=_ENV, check=True)
        found = json.loads(report.read_text())
        stdout = out.read_text()
    if found["returncode"] not in (0, 1):
        raise RuntimeError(f"{args} failed: {found['stderr'][-2000:]}")
    return found["seconds"], found["maxrss_kb"] / 1024, stdout


def load_seconds(root: Path) -> float:
    """Seconds of a head load in a fresh process (checksums verified)."""
    out = subprocess.run([sys.executable, "-c", _LOAD, str(root), NAME], cwd=REPO,
                         env=_ENV, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def head_and_one_shard_loads(root: Path, repeat: int = 5) -> tuple[float, float]:
    """Median head load, and median load of the same rows as one shard, interleaved."""
    one_shard = Path(tempfile.mkdtemp(prefix="dyngen-one-shard-"))
    try:
        Store(one_shard).create(NAME, Store(root).load(NAME))  # the same rows, one shard
        pairs = [(load_seconds(root), load_seconds(one_shard)) for _ in range(repeat)]
    finally:
        shutil.rmtree(one_shard)
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)


def lookup_ms(root: Path, keys: list[str]) -> list[float]:
    """Milliseconds of an idempotency lookup of each key, each from a fresh Store."""
    times = []
    for key in keys:
        t0 = time.perf_counter()
        Store(root).find_idempotency_key(NAME, key)
        times.append((time.perf_counter() - t0) * 1000)
    return times


def log_in_process_s(root: Path) -> float:
    """`dyngen log --limit 20` run in this process once imports are done: its own work."""
    from typer.testing import CliRunner

    from dyngen.cli import app

    args = ["--root", str(root), "log", NAME, "--limit", "20"]
    CliRunner().invoke(app, args)  # typer imports its parameter machinery on first use
    t0 = time.perf_counter()
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return time.perf_counter() - t0


def measure(root: Path, versions: int) -> dict[str, float]:
    """Everything the issue asks for, at the store's current size."""
    store = Store(root)
    head = store.state(NAME)
    base = root / NAME
    head_load, one_shard_load = head_and_one_shard_loads(root)
    start_s, _, _ = run_command("-c", "import dyngen.cli")  # Python start + imports alone
    log_s, _, _ = run_command("-m", "dyngen.cli", "--root", str(root), "log", NAME,
                              "--limit", "20")
    verify_s, verify_mb, verify_out = run_command("-m", "dyngen.cli", "--root", str(root),
                                                  "verify", NAME)
    if not verify_out.startswith("ok:"):
        raise RuntimeError(f"verify found problems: {verify_out[-2000:]}")
    return {
        "versions": versions,
        "head_shards": len(head.shards),
        "versions_bytes": folder_bytes(base / "_versions") / versions,
        "log_bytes": sum(folder_bytes(base / d) for d in ("_versions", "_checkpoints", "_keys"))
        / versions,
        "head_load_s": head_load,
        "one_shard_load_s": one_shard_load,
        # Keys spread over the log: a hit replays 0..K-1 records after its checkpoint.
        "lookup_hit_ms": statistics.median(hits := lookup_ms(
            root, [f"event:{1 + i * (versions - 2) // 19}" for i in range(20)])),
        "lookup_hit_max_ms": max(hits),
        "lookup_miss_ms": statistics.median(lookup_ms(root, ["event:never"] * 20)),
        "log_in_process_s": log_in_process_s(root),
        "log_s": log_s,
        "cli_start_s": start_s,
        "verify_s": verify_s,
        "verify_peak_mb": verify_mb,
    }


def extrapolate(small: dict[str, float], big: dict[str, float], target: int) -> dict:
    """Each figure at `target` versions along the line through the two measurements (a
    figure that did not grow between them is kept: noise is not a negative slope)."""
    span = big["versions"] - small["versions"]
    return {k: max(big[k], big[k] + (big[k] - small[k]) / span * (target - big["versions"]))
            for k in big if k != "versions"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", type=int, default=10_000)
    ap.add_argument("--rows", type=int, default=10)
    args = ap.parse_args()
    n, early = args.versions, args.versions // 10
    policy = CompactionPolicy()
    with tempfile.TemporaryDirectory(prefix="dyngen-long-run-") as tmp:
        root = Path(tmp)
        Store(root).create(NAME, [bench_row(i) for i in range(args.rows)])
        appends, points = [], {}
        started = time.perf_counter()
        for v in range(1, n):
            appends.append(one_round(root, v, args.rows, policy))
            if v + 1 in (early, n):
                points[v + 1] = measure(root, v + 1)
            if v % 1000 == 0:
                print(f"  {v} rounds, {time.perf_counter() - started:.0f} s", flush=True)
        # A baseline under the same load: 100 more rounds of this store, each followed by
        # a round of a new store (its first 100), so machine noise hits both alike.
        fresh = root / "fresh"
        Store(fresh).create(NAME, [bench_row(i) for i in range(args.rows)])
        paired: list[tuple[float, float]] = []
        for v in range(1, 101):
            paired.append((one_round(root, n - 1 + v, args.rows, policy),
                           one_round(fresh, v, args.rows, policy)))
        head = Store(root).state(NAME)
        rounds = n - 1 + len(paired)
        compactions = head.version - rounds
        first = statistics.median(appends[:100]) * 1000
        last = statistics.median(appends[-100:]) * 1000
        small, big = points[early], points[n]
        far = extrapolate(small, big, 100_000)
        print(f"\n{rounds:,} rounds of {args.rows} rows -> head v{head.version} "
              f"({compactions} compaction versions), {head.rows:,} rows in "
              f"{len(head.shards)} shards; {time.perf_counter() - started:.0f} s")
        print(f"{'':<28}{early:>12,}{n:>12,}{'ratio':>8}{'100,000 (extrapolated)':>26}")
        for key, label in [("head_shards", "head shards"),
                           ("versions_bytes", "_versions/ bytes per version"),
                           ("log_bytes", "log bytes per version"),
                           ("head_load_s", "head load s"),
                           ("one_shard_load_s", "same rows in 1 shard s"),
                           ("lookup_hit_ms", "lookup hit ms (median)"),
                           ("lookup_hit_max_ms", "lookup hit ms (max of 20)"),
                           ("lookup_miss_ms", "lookup miss ms"),
                           ("log_s", "dyngen log --limit 20 s"),
                           ("cli_start_s", "  of it, start + imports s"),
                           ("log_in_process_s", "  the command's own work s"),
                           ("verify_s", "dyngen verify s"),
                           ("verify_peak_mb", "dyngen verify peak RSS MB")]:
            print(f"{label:<28}{small[key]:>12.3f}{big[key]:>12.3f}"
                  f"{big[key] / small[key] if small[key] else float('nan'):>8.2f}"
                  f"{far[key]:>26.3f}")
        slope = statistics.linear_regression(range(len(appends)), appends).slope * 1000  # ms/v
        old_p50 = statistics.median(p[0] for p in paired) * 1000
        new_p50 = statistics.median(p[1] for p in paired) * 1000
        print(f"\nappend p50: first 100 {first:.1f} ms, last 100 {last:.1f} ms, ratio "
              f"{last / first:.2f} (target <= 1.5); interleaved with a new store's first 100: "
              f"{old_p50:.1f} ms vs {new_p50:.1f} ms, ratio {old_p50 / new_p50:.2f}; "
              f"least-squares slope {slope * 1000:+.2f} ms per 1,000 versions, so about "
              f"{last + max(0.0, slope) * (100_000 - n):.1f} ms at 100,000")
        print(f"_versions/ bytes per version at {n:,} / at {early:,}: "
              f"{big['versions_bytes'] / small['versions_bytes']:.2f} (target <= 2); whole log "
              f"{big['log_bytes'] / small['log_bytes']:.2f}")
        print(f"head load at {n:,}: {big['head_load_s']:.3f} s, "
              f"{big['head_load_s'] / big['one_shard_load_s']:.2f}x one shard "
              "(targets <= 0.5 s, <= 2x)")
        print(f"lookup from a fresh Store: hit {big['lookup_hit_ms']:.2f} ms (max "
              f"{big['lookup_hit_max_ms']:.2f}), miss {big['lookup_miss_ms']:.2f} ms "
              "(target <= 10 ms)")
        print(f"dyngen log --limit 20: {big['log_s']:.2f} s (target <= 1 s), of which "
              f"{big['cli_start_s']:.2f} s start Python and import dyngen.cli; its own work "
              f"{big['log_in_process_s'] * 1000:.0f} ms; dyngen verify: "
              f"{big['verify_s']:.1f} s, peak RSS {big['verify_peak_mb']:.0f} MB "
              "(target <= 500 MB)")


if __name__ == "__main__":
    main()
