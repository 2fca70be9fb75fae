"""Write the proposals the label-precision fixture is made of (benchmarks/data/).

The default model proposes variations of the GSM-style seeds in proposer_seeds.jsonl with
the generator's default sampling; every completion that parses into a task (question,
ground truth, method) is written once, with what replays it (the completion, the seed, the
renumbering RNG seed). Labels are then added by a person reading each task (the rule is in
benchmarks/data/README.md); an existing label is kept when its (question, truth) is written
again, so re-running never loses labelling work.

    python benchmarks/proposer_fixture.py [--passes 2] [--out benchmarks/data/proposer_labels.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

DATA = REPO / "benchmarks" / "data"
SEEDS = DATA / "proposer_seeds.jsonl"
LABELS = DATA / "proposer_labels.jsonl"
CACHE = REPO / ".dyngen" / "models"  # the tests' model cache (gitignored)


def fixture_config() -> dict[str, Any]:
    """The generator's defaults on the project's model cache: what the fixture samples with."""
    from dyngen.generators.proposer import ProposerGenerator

    return ProposerGenerator({"cache_dir": str(CACHE)}).settings()


def seeds() -> list[Any]:
    """The fixture's seeds: every task of proposer_seeds.jsonl, in file order."""
    from dyngen.generators.proposer import seeds_from_rollouts
    from dyngen.round.rollouts import RolloutsPolicy

    rollouts = RolloutsPolicy((str(DATA),)).read(str(SEEDS))
    return sorted(seeds_from_rollouts(rollouts, 10**6), key=lambda s: s.index)


def replay(entry: dict[str, Any], seed: Any, cfg: dict[str, Any]) -> Any:
    """What parse_proposal makes of an entry's completion today (the policy's input)."""
    from dyngen.generators.proposer import normalise, parse_proposal

    return parse_proposal(entry["completion"], seed, {normalise(seed.question)}, cfg,
                          random.Random(entry["rng"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--out", type=Path, default=LABELS)
    args = ap.parse_args()

    from dyngen.generators.proposer.sampling import propose
    from dyngen.llm import chat_model, seed_int

    cfg = fixture_config()
    model = chat_model(cfg)
    old = {}
    if args.out.exists():
        old = {(e["question"], e["truth"]): e for e in map(json.loads, args.out.open())}
    by_index = seeds()
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for p in range(args.passes):
        results = propose(model, by_index, cfg, (cfg["seed"], 0, p))
        for seed, result in zip(by_index, results, strict=True):
            for j, text in enumerate(result.texts):
                entry = {"seed_index": seed.index, "seed": seed.question,
                         "seed_truth": seed.truth, "completion": text,
                         "rng": seed_int(cfg["seed"], 0, p, seed.index, j)}
                prop = replay(entry, seed, cfg)
                if not prop.ok or (prop.question, prop.truth) in out:
                    continue
                key = (prop.question, prop.truth)
                label = old.get(key, {}).get("correct")
                out[key] = {"id": len(out), "method": prop.method, "question": prop.question,
                            "truth": prop.truth, "correct": label, **entry}
    args.out.write_text("".join(json.dumps(e) + "\n" for e in out.values()))
    methods = {m: sum(e["method"] == m for e in out.values()) for m in ("renumbered",
                                                                         "computed", "model")}
    print(f"{len(out)} proposals from {len(by_index)} seeds x {cfg['proposals_per_seed']} x "
          f"{args.passes} passes -> {args.out} ({methods}); "
          f"{sum(e['correct'] is None for e in out.values())} to label")


if __name__ == "__main__":
    main()
