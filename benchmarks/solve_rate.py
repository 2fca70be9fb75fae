"""The solve-rate stage against llama.cpp (SmolLM2-135M): what it measures, what it keeps, and
its speed against a bare client sending the same requests to the same server.

Candidates of the benchmark's own: sums of two d-digit numbers, d = 1..6, an equal share of
each (data_source dyngen-arithmetic, so dyngen's exact-match reward grades them), asked with
few-shot turns that restate the sum (SmolLM2-135M solves almost no sum without them). One run:
  stage   round.solve_rate's grading of every candidate (`samples` completions each) through
          dyngen.llm at max_concurrency 8, on an xllamacpp server of 8 slots
  bare    the same HTTP requests (split as the stage split them: llama.cpp answers n choices
          but counts one's tokens, so dyngen sends n one-sample requests) from a bare httpx +
          asyncio client at the same concurrency
It prints the pass rate by digits (it must fall as the digits grow), what two bands keep of
the same measurements (R-Zero's [0.3, 0.8], SwS's [0.125, 0.875]), and the stage's tokens/s
vs the bare client's (target >= 0.9) with the client's CPU share (this process's CPU seconds
over its and the server's; target <= 5%). The machine is shared: stage and bare alternate
`--repeats` times; "vs bare" is the median of the pairs' ratios.

    python benchmarks/solve_rate.py [--candidates 100] [--samples 8] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from served import bare_client, cpu_seconds  # noqa: E402  (the served benchmark's)

from tests.llm.llama_server import LlamaServer  # noqa: E402

# SmolLM2-135M solves no sum when asked for the number alone (1 of 12 one-digit ones at
# temperature 1.0); restating the sum first, as these shots do, it solves one-digit sums.
SYSTEM = "Add the two numbers. Reply as: a + b = sum"
SHOTS = (("2 + 5", "2 + 5 = 7"), ("4 + 4", "4 + 4 = 8"), ("8 + 5", "8 + 5 = 13"),
         ("12 + 35", "12 + 35 = 47"), ("6 + 7", "6 + 7 = 13"), ("5 + 1", "5 + 1 = 6"))
BANDS = {"R-Zero [0.3, 0.8]": (0.3, 0.8), "SwS [0.125, 0.875]": (0.125, 0.875)}


def candidates(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """`count` sums, digits 1..6 in turn, in verl's schema."""
    rng = random.Random(seed)
    shots = [{"role": "system", "content": SYSTEM}]
    for question, answer in SHOTS:
        shots += [{"role": "user", "content": question},
                  {"role": "assistant", "content": answer}]
    rows = []
    for i in range(count):
        digits = 1 + i % 6
        low = 10 ** (digits - 1) if digits > 1 else 1
        a, b = rng.randrange(low, 10 ** digits), rng.randrange(low, 10 ** digits)
        rows.append({"data_source": "dyngen-arithmetic",
                     "prompt": [*shots, {"role": "user", "content": f"{a} + {b}"}],
                     "ability": "math",
                     "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                     "extra_info": {"index": i, "digits": digits}})
    return rows


def stage_run(settings: dict[str, Any], rows: list[dict[str, Any]], pid: int
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The stage's grading of `rows`: (its result, speed row)."""
    from dyngen.filters.solve_rate import grade_share
    from dyngen.rows import RowBatch

    before = cpu_seconds(pid)
    started = time.perf_counter()
    result = grade_share(settings, "prompt", RowBatch(rows), ("bench",))
    secs = time.perf_counter() - started
    return result, speed(result["usage"]["completion_tokens"], secs, before, cpu_seconds(pid))


def speed(tokens: int, secs: float, before: tuple[float, float], after: tuple[float, float]
          ) -> dict[str, Any]:
    client, server = after[0] - before[0], after[1] - before[1]
    return {"tokens": tokens, "seconds": secs, "tps": tokens / secs,
            "cpu": client / (client + server) if client + server else 1.0}


def sent_bodies(settings: dict[str, Any], rows: list[dict[str, Any]], name: str,
                together: bool) -> list[dict[str, Any]]:
    """The HTTP bodies the stage sends for `rows`, split as it splits them."""
    from dyngen.filters.solve_rate import requests_for
    from dyngen.llm.samples import sample_seed

    bodies = []
    for req in requests_for(rows, "prompt", settings, ("bench",)):
        base = {"model": name, "messages": [dict(m) for m in req.messages],
                "max_tokens": req.max_tokens, "temperature": req.temperature, "top_p": req.top_p}
        bodies += ([{**base, "n": req.n, "seed": req.seed}] if together else
                   [{**base, "seed": sample_seed(req.seed, j)} for j in range(req.n)])
    return bodies


def bare_run(url: str, bodies: list[dict[str, Any]], concurrency: int, pid: int
             ) -> dict[str, Any]:
    before = cpu_seconds(pid)
    started = time.perf_counter()
    tokens = asyncio.run(bare_client(url, bodies, concurrency))
    return speed(tokens, time.perf_counter() - started, before, cpu_seconds(pid))


def report(rows: list[dict[str, Any]], grades: list[Any], samples: int) -> None:
    """Pass rate by digits, and what each band keeps of the same measurements."""
    from dyngen.filters.solve_rate import band_verdict

    print(f"{'digits':<8}{'candidates':>11}{'passed':>9}{'of':>7}{'pass rate':>11}")
    for digits in range(1, 7):
        mine = [g for r, g in zip(rows, grades, strict=True)
                if r["extra_info"]["digits"] == digits and g.error is None]
        passed, asked = sum(g.passed for g in mine), samples * len(mine)
        print(f"{digits:<8}{len(mine):>11}{passed:>9}{asked:>7}"
              f"{passed / asked if asked else 0:>11.1%}")
    print(f"\n{'band':<22}{'kept':>6}{'too_easy':>10}{'too_hard':>10}{'model_error':>13}")
    for label, band in BANDS.items():
        reasons = [(band_verdict(g, band) or ("kept",))[0] for g in grades]
        print(f"{label:<22}" + "".join(f"{reasons.count(r):>{w}}" for r, w in (
            ("kept", 6), ("too_easy", 10), ("too_hard", 10), ("model_error", 13))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", type=int, default=100)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp threads")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    from dyngen.config import load_config
    from dyngen.filters.solve_rate import settings_of

    rows = candidates(args.candidates)
    with tempfile.TemporaryDirectory(prefix="dyngen-bench-solve-rate-") as tmp:
        server = LlamaServer(Path(tmp), parallel=args.concurrency, ctx=args.concurrency * 384,
                             threads=args.threads).start()
        try:
            cfg = load_config(overrides=[f"round.solve_rate.endpoint={server.url}"])
            settings = {**settings_of(cfg), "samples": args.samples,
                        "max_tokens": args.max_tokens, "max_concurrency": args.concurrency}
            # Warm up: the server's prompt caches, and the client's probe of n (once).
            warm, _ = stage_run(settings, candidates(args.concurrency, seed=99), server.pid)
            bodies = sent_bodies(settings, rows, warm["model"], bool(warm["n_in_one_request"]))
            stages, bares, ratios = [], [], []
            for repeat in range(args.repeats):
                if repeat % 2:  # alternate who goes first: the machine is shared
                    bare = bare_run(server.url, bodies, args.concurrency, server.pid)
                    result, stage = stage_run(settings, rows, server.pid)
                else:
                    result, stage = stage_run(settings, rows, server.pid)
                    bare = bare_run(server.url, bodies, args.concurrency, server.pid)
                stages.append(stage)
                bares.append(bare)
                ratios.append(stage["tps"] / bare["tps"])
        finally:
            server.stop()

    print(f"{len(rows)} candidates x {args.samples} samples, max_tokens {args.max_tokens}, "
          f"SmolLM2-135M on llama.cpp ({args.concurrency} slots, {args.threads} thread(s)); "
          f"n in one request: {result['n_in_one_request']} "
          f"({len(bodies)} HTTP requests per run)\n")
    report(rows, result["grades"], args.samples)
    print(f"\n{'run':<14}{'tokens':>8}{'seconds':>9}{'tokens/s':>10}{'client CPU':>12}")
    for label, runs in (("stage", stages), ("bare client", bares)):
        best = max(runs, key=lambda r: r["tps"])
        print(f"{label:<14}{best['tokens']:>8}{best['seconds']:>9.1f}{best['tps']:>10.1f}"
              f"{best['cpu']:>12.1%}")
    print(f"\nstage vs bare (tokens/s, median of {args.repeats} pairs): "
          f"{statistics.median(ratios):.2f} (target >= 0.90); seconds per round of "
          f"{len(rows)} x {args.samples}: {min(s['seconds'] for s in stages):.1f} "
          f"(best of {args.repeats}); {os.cpu_count()} CPUs shared.")


if __name__ == "__main__":
    main()
