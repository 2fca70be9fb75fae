"""ProposerGenerator: new tasks with verified labels, written by a small causal LM.

Each pass samples `proposals_per_seed` completions for each seed (seeds.py, sampling.py),
parses each into a task and its method (checking.py), and keeps a task only once its label
is verified: `renumbered` (renumbering.py) and `arithmetic` by construction — the default;
`computed` and `model`, when listed in `methods`, by the solver's self-consistency
(verifying.py), all of a pass's tasks in one batched call. With the default 135M solver
that check passes many wrong labels (benchmarks/proposer.py measures it), so they are not
kept by default. It repeats, up to max_passes, until min_rows are kept. In a round of P
partitions (`round.partitions`), each partition takes every P-th seed and min_rows / P
(rounded up), and asks the model itself (a served endpoint sees P clients). `self.stats`
counts, per method, the proposals, the kept and the dropped by reason (`model_error`: the
model never answered, after its retries; under the method `none` for a seed's whole
request), and each model's usage (`model`, `solver`: dyngen.llm.ModelUsage); the round
saves it in the version's lineage.

Config (data.datagen): the model's keys (dyngen.llm: endpoint, model_name, api_key_env, ...
for a served model; model_path, gguf_file, cache_dir, batch_size, num_threads in-process);
max_new_tokens (48), temperature (0.8), top_p (0.95), hard_k (8),
proposals_per_seed (6), min_rows (hard_k) and max_passes (3): sample again until min_rows
are kept, max_question_chars (300), min_question_chars (10), seed_window (512), seed (0),
num_threads (one per two cores), fit_schema (true); the policy: methods ([renumbered,
arithmetic]: kept once verified; add computed / model to verify them with the solver),
unverified_methods ([]: kept WITHOUT verification, e.g. [computed]), verify_samples (5),
verify_agreement (0.6), verify_temperature (0.7), and the solver's model: solver_endpoint /
solver_model_name / solver_api_key_env, or solver_model_path / solver_gguf_file (unset:
the proposer's model).

Rows: data_source "dyngen-proposer", the seed's system messages + the new question,
reward_model {style: rule, ground_truth}, extra_info {index, seed_index, seed_score,
model, method, verification, agreement}. With fit_schema, rows take the dataset's columns
(not the store's `_dyngen_*` ones) and extra_info holds the dataset's own extra_info fields
(null where the proposer has none) plus the provenance fields, typed as the dataset declares
them, else as PROVENANCE_FEATURES; the store adds extra_info fields new to the dataset to
its schema on append, so every proposer row keeps its provenance.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from typing import Any

import datasets

from dyngen.errors import ConfigError
from dyngen.generators.base import AbstractDataGenerator, rows_of
from dyngen.generators.proposer.checking import Proposal, parse_proposal
from dyngen.generators.proposer.sampling import propose
from dyngen.generators.proposer.seeds import Seed, min_rows_share, round_seeds
from dyngen.generators.proposer.text import normalise
from dyngen.generators.proposer.verifying import verify
from dyngen.generators.schema import rows_as_dataset
from dyngen.llm import MODEL_DEFAULTS, SOLVER_DEFAULTS, ChatModel, chat_model, seed_int
from dyngen.round.context import RoundContext

logger = logging.getLogger(__name__)

SOURCE = "dyngen-proposer"
# The proposer's fields in each row's extra_info, and their types where the dataset has none.
PROVENANCE_FEATURES = {"seed_index": datasets.Value("int64"),
                       "seed_score": datasets.Value("float64"),
                       "model": datasets.Value("string"), "method": datasets.Value("string"),
                       "verification": datasets.Value("string"),
                       "agreement": datasets.Value("float64")}
METHODS = ("renumbered", "arithmetic", "computed", "model")
BY_CONSTRUCTION_METHODS = ("renumbered", "arithmetic")  # their labels cannot be wrong
# How each kept row's label was verified (extra_info.verification).
BY_CONSTRUCTION, SELF_CONSISTENCY, UNVERIFIED = "by_construction", "self_consistency", "none"
DEFAULTS: dict[str, Any] = {
    **MODEL_DEFAULTS, **SOLVER_DEFAULTS, "max_new_tokens": 48,
    "temperature": 0.8, "top_p": 0.95, "hard_k": 8, "proposals_per_seed": 6,
    "max_question_chars": 300, "min_question_chars": 10, "seed_window": 512,
    "methods": BY_CONSTRUCTION_METHODS, "unverified_methods": (), "verify_samples": 5,
    "verify_agreement": 0.6, "verify_temperature": 0.7, "seed": 0, "fit_schema": True,
    "min_rows": None, "max_passes": 3,
}


class ProposerGenerator(AbstractDataGenerator):
    """New verified tasks written by a causal LM from the hardest recent tasks."""

    defaults = DEFAULTS

    def check_settings(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """The methods are known ones, and verification's numbers are in range."""
        for key, allowed in (("methods", METHODS), ("unverified_methods", METHODS[2:])):
            if isinstance(cfg[key], str) or not set(cfg[key]) <= set(allowed):
                raise ConfigError(f"data.datagen.{key}: expected a list of some of "
                                  f"{', '.join(allowed)}; found {cfg[key]!r}.")
        if int(cfg["verify_samples"]) < 1 or not 0 < float(cfg["verify_agreement"]) <= 1:
            raise ConfigError("data.datagen: expected verify_samples >= 1 and 0 < "
                              f"verify_agreement <= 1; found {cfg['verify_samples']!r} and "
                              f"{cfg['verify_agreement']!r}.")
        return cfg

    def generate(self, dataset: Any, context: RoundContext | None = None) -> datasets.Dataset:
        """New rows with verified labels; sampling repeats (max_passes) until min_rows."""
        cfg = self.settings()
        rows = rows_of(dataset)
        seeds = round_seeds(cfg, rows, context)
        models: dict[str, ChatModel] = {}
        try:
            return self._generate(cfg, rows, seeds, context, models)
        finally:  # a served model's connections and thread end with the round
            for m in models.values():
                m.close()

    def _generate(self, cfg: dict[str, Any], rows: datasets.Dataset, seeds: list[Seed],
                  context: RoundContext | None, models: dict[str, ChatModel]
                  ) -> datasets.Dataset:
        """Sample, parse, verify and keep, pass after pass, from the seeds of this round."""
        if seeds:
            models["model"] = model = chat_model(cfg)
            model.check()  # an endpoint that cannot answer fails the round before any work
        name = models["model"].name if seeds else ""
        round_no = getattr(context, "round_seed", 0)
        min_rows = min_rows_share(cfg, context)
        seen = {normalise(s.question) for s in seeds}
        counts: dict[str, Counter[str]] = {}
        new: list[dict[str, Any]] = []
        timing = Counter({"generated_tokens": 0, "generate_seconds": 0.0,
                          "verify_tokens": 0, "verify_seconds": 0.0})
        passes = 0
        for p in range(int(cfg["max_passes"]) if seeds else 0):
            model = models["model"]
            t0 = time.perf_counter()
            results = propose(model, seeds, cfg, (cfg["seed"], round_no, p))
            timing.update(generated_tokens=sum(r.completion_tokens for r in results),
                          generate_seconds=time.perf_counter() - t0)
            passes += 1
            to_verify: list[tuple[Seed, Proposal]] = []
            for seed, result in zip(seeds, results, strict=True):
                if not result.ok:  # the seed's proposals never came: counted, not guessed
                    counts.setdefault("none", Counter()).update(
                        proposed=int(cfg["proposals_per_seed"]),
                        dropped_model_error=int(cfg["proposals_per_seed"]))
                for j, text in enumerate(result.texts):
                    rng = random.Random(seed_int(cfg["seed"], round_no, p, seed.index, j))
                    prop = parse_proposal(text, seed, seen, cfg, rng)
                    tally = counts.setdefault(prop.method, Counter())
                    tally["proposed"] += 1
                    how = _policy(prop, cfg)
                    if how is None or not prop.ok:
                        tally[f"dropped_{prop.reason or 'not_kept'}"] += 1
                        continue
                    seen.add(normalise(prop.question or ""))
                    if how == SELF_CONSISTENCY:
                        to_verify.append((seed, prop))
                        continue
                    tally["kept"] += 1
                    new.append(self._row(seed, prop, how, None, len(rows) + len(new), name))
            if to_verify and "solver" not in models:
                models["solver"] = chat_model(cfg, "solver")
                models["solver"].check()
            t0 = time.perf_counter()
            verdicts, replies = verify(models["solver"], [t.question or "" for _, t in to_verify],
                                       [t.truth or "" for _, t in to_verify], cfg,
                                       (cfg["seed"], round_no, p)) if to_verify else ([], [])
            timing.update(verify_tokens=sum(r.completion_tokens for r in replies),
                          verify_seconds=time.perf_counter() - t0 if to_verify else 0.0)
            for (seed, prop), verdict, reply in zip(to_verify, verdicts, replies, strict=True):
                if not reply.ok:  # the solver never answered: not a verdict on the task
                    counts[prop.method]["dropped_model_error"] += 1
                    continue
                counts[prop.method]["kept" if verdict.verified else "dropped_not_verified"] += 1
                if verdict.verified:
                    new.append(self._row(seed, prop, SELF_CONSISTENCY, verdict.agreement,
                                         len(rows) + len(new), name))
            if len(new) >= min_rows:
                break
        self.stats = _stats(counts, len(seeds), passes, len(new), timing)
        for role, m in models.items():
            self.stats[role] = m.usage.as_dict()
        logger.info("ProposerGenerator: %s", self.stats)
        return self._to_dataset(new, rows, cfg)

    @staticmethod
    def _row(seed: Seed, prop: Proposal, verification: str, agreement: float | None,
             index: int, model: str) -> dict[str, Any]:
        return {
            "data_source": SOURCE,
            "prompt": [*seed.system, {"role": "user", "content": prop.question}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": prop.truth},
            "extra_info": {"index": index, "seed_index": seed.index, "seed_score": seed.score,
                           "model": model, "method": prop.method,
                           "verification": verification, "agreement": agreement},
        }

    def _to_dataset(self, new: list[dict[str, Any]], rows: datasets.Dataset,
                    cfg: dict[str, Any]) -> datasets.Dataset:
        """The rows as a Dataset; with fit_schema, in the dataset's columns plus provenance."""
        return rows_as_dataset(new, rows, PROVENANCE_FEATURES, bool(cfg["fit_schema"]))


def _policy(prop: Proposal, cfg: dict[str, Any]) -> str | None:
    """How a task of this method is verified before it is kept, or None if it is not kept."""
    if prop.method in cfg["unverified_methods"]:
        return UNVERIFIED
    if prop.method not in cfg["methods"]:
        return None
    return BY_CONSTRUCTION if prop.method in BY_CONSTRUCTION_METHODS else SELF_CONSISTENCY


def _stats(counts: dict[str, Counter[str]], seeds: int, passes: int, kept: int,
           timing: Counter[str]) -> dict[str, Any]:
    """The round's counts, JSON-safe: per method proposed / kept / dropped by reason."""
    methods = {}
    for method, tally in sorted(counts.items()):
        dropped = {k.removeprefix("dropped_"): v for k, v in sorted(tally.items())
                   if k.startswith("dropped_")}
        methods[method] = {"proposed": tally["proposed"], "kept": tally["kept"],
                           "dropped": dropped}
    tokens, seconds = timing["generated_tokens"], timing["generate_seconds"]
    return {"seeds": seeds, "passes": passes,
            "proposed": sum(m["proposed"] for m in methods.values()), "kept": kept,
            "methods": methods, "generated_tokens": tokens,
            "generate_seconds": round(seconds, 3),
            "tokens_per_second": round(tokens / seconds, 1) if seconds else 0.0,
            "verify_tokens": timing["verify_tokens"],
            "verify_seconds": round(timing["verify_seconds"], 3)}
