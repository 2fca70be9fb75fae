"""ProposerGenerator: new verified tasks written by a small causal LM from the hardest tasks.

Each pass samples `proposals_per_seed` completions for each seed (seeds.py, sampling.py),
keeps those that verify (checking.py) and repeats, up to max_passes, until min_rows are
kept. `self.stats` counts the drops by reason, the kept rows by method, and tokens/s.

Config (data.datagen): model_path, gguf_file, cache_dir (model.py); max_new_tokens (48),
temperature (0.8), top_p (0.95), batch_size (8 seeds per generate call), hard_k (8),
proposals_per_seed (6), min_rows (hard_k) and max_passes (3): sample again until min_rows
are kept, max_question_chars (300), min_question_chars (10), seed_window (512), seed (0),
num_threads (one per two cores), methods ([computed, renumbered]), fit_schema (true).

Rows: data_source "dyngen-proposer", the seed's system messages + the new question,
reward_model {style: rule, ground_truth}, extra_info {index, seed_index, seed_score,
model, method}. With fit_schema, rows take the dataset's columns (not the store's
`_dyngen_*` ones) and extra_info holds the dataset's own extra_info fields (null where the
proposer has none) plus the provenance fields, typed as the dataset declares them, else as
PROVENANCE_FEATURES; the store adds extra_info fields new to the dataset to its schema on
append, so every proposer row keeps its provenance.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from typing import Any

import datasets

from dyngen.errors import ConfigError
from generators.base import AbstractDataGenerator, rows_of
from generators.proposer.checking import normalise, parse_proposal
from generators.proposer.model import load_model
from generators.proposer.sampling import complete, seed_int
from generators.proposer.seeds import Seed, seeds_from_dataset, seeds_from_rollouts

logger = logging.getLogger(__name__)

SOURCE = "dyngen-proposer"
_ROW_COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")
# The proposer's fields in each row's extra_info, and their types where the dataset has none.
PROVENANCE_FEATURES = {"seed_index": datasets.Value("int64"),
                       "seed_score": datasets.Value("float64"),
                       "model": datasets.Value("string"), "method": datasets.Value("string")}
DEFAULTS: dict[str, Any] = {
    "model_path": None, "gguf_file": None, "cache_dir": None, "max_new_tokens": 48,
    "temperature": 0.8, "top_p": 0.95, "batch_size": 8, "hard_k": 8, "proposals_per_seed": 6,
    "max_question_chars": 300, "min_question_chars": 10, "seed_window": 512,
    "methods": ("computed", "renumbered"), "seed": 0, "fit_schema": True, "min_rows": None,
    "max_passes": 3, "num_threads": None,
}


class ProposerGenerator(AbstractDataGenerator):
    """New verified tasks written by a causal LM from the hardest recent tasks."""

    def settings(self) -> dict[str, Any]:
        """The config (data.datagen) over DEFAULTS; an unknown key is an error (a typo)."""
        given = dict(self.config or {})
        unknown = sorted(set(given) - set(DEFAULTS) - {"path", "name"})
        if unknown:
            raise ConfigError(f"data.datagen has unknown keys {unknown} for ProposerGenerator; "
                              f"expected some of {sorted(DEFAULTS)}.")
        cfg = {**DEFAULTS, **given}
        if not set(cfg["methods"]) <= {"computed", "renumbered", "model"}:
            raise ConfigError(f"data.datagen.methods: expected some of computed, renumbered, "
                              f"model; found {list(cfg['methods'])}.")
        return cfg

    def generate(self, dataset: Any, context: Any = None) -> datasets.Dataset:
        """New verified rows; sampling repeats (max_passes) until min_rows are kept."""
        cfg = self.settings()
        rows = rows_of(dataset)
        rollouts = context.read_rollouts() if context is not None else []
        k = int(cfg["hard_k"])
        seeds = (seeds_from_rollouts(rollouts, k) if rollouts
                 else seeds_from_dataset(rows, k, int(cfg["seed_window"])))
        model, tokenizer, name = load_model(cfg) if seeds else (None, None, "")
        round_no = getattr(context, "round", 0)
        min_rows = int(cfg["min_rows"] if cfg["min_rows"] is not None else k)
        seen = {normalise(s.question) for s in seeds}
        stats: Counter[str] = Counter()
        new: list[dict[str, Any]] = []
        tokens, seconds = 0, 0.0
        for p in range(int(cfg["max_passes"]) if seeds else 0):
            completions, n_tokens, secs = complete(model, tokenizer, seeds, cfg,
                                                    (cfg["seed"], round_no, p))
            tokens, seconds = tokens + n_tokens, seconds + secs
            stats["passes"] += 1
            for seed, texts in zip(seeds, completions, strict=True):
                for j, text in enumerate(texts):
                    rng = random.Random(seed_int(cfg["seed"], round_no, p, seed.index, j))
                    verdict = parse_proposal(text, seed, seen, cfg, rng)
                    stats["proposed"] += 1
                    if isinstance(verdict, str):
                        stats[f"dropped_{verdict}"] += 1
                        continue
                    stats[verdict[2]] += 1
                    new.append(self._row(seed, *verdict, len(rows) + len(new), name))
            if len(new) >= min_rows:
                break
        self.stats = {**stats, "seeds": len(seeds), "kept": len(new),
                      "generated_tokens": tokens, "generate_seconds": round(seconds, 3),
                      "tokens_per_second": round(tokens / seconds, 1) if seconds else 0.0}
        logger.info("ProposerGenerator: %s", self.stats)
        return self._to_dataset(new, rows, cfg)

    @staticmethod
    def _row(seed: Seed, question: str, truth: str, method: str, index: int,
             model: str) -> dict[str, Any]:
        return {
            "data_source": SOURCE,
            "prompt": [*seed.system, {"role": "user", "content": question}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": {"index": index, "seed_index": seed.index, "seed_score": seed.score,
                           "model": model, "method": method},
        }

    def _to_dataset(self, new: list[dict[str, Any]], rows: datasets.Dataset,
                    cfg: dict[str, Any]) -> datasets.Dataset:
        """The rows as a Dataset; with fit_schema, in the dataset's columns plus provenance."""
        feats = rows.features
        extra = feats.get("extra_info")
        if not cfg["fit_schema"] or not isinstance(extra, dict):
            columns = list(new[0]) if new else [*_ROW_COLUMNS]
            return datasets.Dataset.from_dict({c: [r[c] for r in new] for c in columns})
        # A provenance field the dataset declares keeps its declared type.
        extra = {**extra, **{f: t for f, t in PROVENANCE_FEATURES.items() if f not in extra}}
        columns = [c for c in feats if not c.startswith("_dyngen_")]
        shaped = {c: [{f: r["extra_info"].get(f) for f in extra} if c == "extra_info"
                      else r.get(c) for r in new] for c in columns}
        # from_dict, not from_list: an empty round must still have the dataset's columns.
        return datasets.Dataset.from_dict(shaped, features=datasets.Features(
            {c: extra if c == "extra_info" else feats[c] for c in columns}))
