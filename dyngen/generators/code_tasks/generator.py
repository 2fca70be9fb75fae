"""CodeTaskProposer: code tasks whose every label is proved by running the program.

Each pass asks the model for `proposals_per_seed` programs in the style of each seed
(proposing.py), runs each twice in the sandbox (checking.py) and turns every kept program
into a task per entry of `tasks`: `deduction` (what does f(input) return? label: the value)
and, if listed, `abduction` (give an input for which f returns this value; checked by
running the answer, see reward.py). It repeats, up to max_passes, until min_rows are kept.
In a round of P partitions each takes every P-th seed and min_rows / P (proposer's seeds).

Config (data.datagen): the model's keys (dyngen.llm); hard_k (8), seed_window (512),
proposals_per_seed (4), max_new_tokens (160), temperature (0.8), top_p (0.95), seed (0),
min_rows (hard_k), max_passes (2), tasks ([deduction]); the sandbox: sandbox (bwrap, or
unisolated: no isolation, a warning every round), timeout_seconds (5), memory_mb (512),
sandbox_workers (2: runs at once), max_program_chars (2000), max_input_chars (300),
max_value_chars (300); fit_schema (true: rows take the dataset's columns, as the proposer's).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

import datasets

from dyngen.errors import ConfigError
from dyngen.generators.base import AbstractDataGenerator, rows_of
from dyngen.generators.code_tasks.checking import Checked, check_candidates
from dyngen.generators.code_tasks.proposing import (
    Candidate,
    parse_candidate,
    propose,
    shot_programs,
)
from dyngen.generators.code_tasks.tasks import (
    ABDUCTION,
    DEDUCTION,
    TASKS,
    abduction_prompt,
    deduction_prompt,
    normal_form,
    program_of,
)
from dyngen.generators.proposer.seeds import Seed, min_rows_share, round_seeds
from dyngen.generators.schema import rows_as_dataset
from dyngen.llm import MODEL_DEFAULTS, ChatModel, chat_model
from dyngen.round.context import RoundContext
from dyngen.sandbox import ISOLATIONS, require_bwrap
from dyngen.sandbox.cgroup import runs_without_cgroup

logger = logging.getLogger(__name__)

SOURCE = "dyngen-code-tasks"
VERIFICATION = "execution"
PROVENANCE_FEATURES = {
    "seed_index": datasets.Value("int64"), "seed_score": datasets.Value("float64"),
    "model": datasets.Value("string"), "task": datasets.Value("string"),
    "program": datasets.Value("string"), "function": datasets.Value("string"),
    "input": datasets.Value("string"), "output": datasets.Value("string"),
    "verification": datasets.Value("string"),
}
DEFAULTS: dict[str, Any] = {
    **MODEL_DEFAULTS, "hard_k": 8, "seed_window": 512, "proposals_per_seed": 4,
    "max_new_tokens": 160, "temperature": 0.8, "top_p": 0.95, "seed": 0, "min_rows": None,
    "max_passes": 2, "tasks": (DEDUCTION,), "sandbox": "bwrap", "timeout_seconds": 5.0,
    "memory_mb": 512, "sandbox_workers": 2, "max_program_chars": 2000,
    "max_input_chars": 300, "max_value_chars": 300, "fit_schema": True,
}
UNISOLATED_WARNING = (
    "CodeTaskProposer: data.datagen.sandbox=unisolated: model-written programs run WITHOUT "
    "isolation (rlimits and a timeout only; they can read and write what this worker can, "
    "and as root a fork is not even bounded). Install bubblewrap and remove the setting.")


class CodeTaskProposer(AbstractDataGenerator):
    """Code tasks written by a model from the hardest seeds, labelled by running them."""

    defaults = DEFAULTS

    def check_settings(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """Known tasks and sandbox, and limits in range."""
        if isinstance(cfg["tasks"], str) or not cfg["tasks"] or not set(cfg["tasks"]) <= set(
                TASKS):
            raise ConfigError(f"data.datagen.tasks: expected a list of some of "
                              f"{', '.join(TASKS)}; found {cfg['tasks']!r}.")
        if cfg["sandbox"] not in ISOLATIONS:
            raise ConfigError(f"data.datagen.sandbox: expected one of {', '.join(ISOLATIONS)}"
                              f"; found {cfg['sandbox']!r}. Use bwrap (bubblewrap) unless it "
                              "cannot run here.")
        if not 0 < float(cfg["timeout_seconds"]) <= 600 or int(cfg["memory_mb"]) < 64:
            raise ConfigError("data.datagen: expected 0 < timeout_seconds <= 600 and "
                              f"memory_mb >= 64; found {cfg['timeout_seconds']!r} and "
                              f"{cfg['memory_mb']!r}.")
        return cfg

    def generate(self, dataset: Any, context: RoundContext | None = None) -> datasets.Dataset:
        """New code tasks labelled by execution; passes repeat until min_rows are kept."""
        cfg = self.settings()
        if cfg["sandbox"] == "bwrap":
            require_bwrap()  # before the model loads: a round that cannot check, stops
        else:
            logger.warning(UNISOLATED_WARNING)
        rows = rows_of(dataset)
        seeds = round_seeds(cfg, rows, context)
        if not seeds:
            return self._generate(cfg, rows, seeds, context, None)
        with chat_model(cfg) as model:  # a served model's connections end with the round
            model.check()  # an endpoint that cannot answer fails the round before any work
            return self._generate(cfg, rows, seeds, context, model)

    def _generate(self, cfg: dict[str, Any], rows: datasets.Dataset, seeds: list[Seed],
                  context: RoundContext | None, model: ChatModel | None) -> datasets.Dataset:
        """Propose, parse and run, pass after pass, from the seeds of this round."""
        seen = _known_programs(seeds, rows, int(cfg["seed_window"]))
        unbounded_before = runs_without_cgroup()
        round_no = getattr(context, "round_seed", 0)
        min_rows = min_rows_share(cfg, context)
        dropped: Counter[str] = Counter()
        new: list[dict[str, Any]] = []
        timing = Counter({"generated_tokens": 0, "generate_seconds": 0.0, "checked": 0,
                          "sandbox_seconds": 0.0})
        passes = proposed = kept = 0
        for p in range(int(cfg["max_passes"]) if seeds else 0):
            assert model is not None
            t0 = time.perf_counter()
            results = propose(model, seeds, cfg, (cfg["seed"], round_no, p))
            timing.update(generated_tokens=sum(r.completion_tokens for r in results),
                          generate_seconds=time.perf_counter() - t0)
            passes += 1
            candidates: list[tuple[Seed, Candidate]] = []
            for seed, result in zip(seeds, results, strict=True):
                if not result.ok:
                    proposed += int(cfg["proposals_per_seed"])
                    dropped["model_error"] += int(cfg["proposals_per_seed"])
                for text in result.texts:
                    proposed += 1
                    cand = parse_candidate(text, int(cfg["max_program_chars"]),
                                           int(cfg["max_input_chars"]))
                    if isinstance(cand, str):
                        dropped[cand] += 1
                    else:
                        candidates.append((seed, cand))
            t0 = time.perf_counter()
            checked = check_candidates([c for _, c in candidates], seen, cfg)
            timing.update(checked=sum(1 for c in checked if c.reason not in ("copy",
                                                                             "forbidden")),
                          sandbox_seconds=time.perf_counter() - t0)
            for (seed, _), check in zip(candidates, checked, strict=True):
                if not check.ok:
                    dropped[check.reason] += 1
                    continue
                kept += 1
                for task in cfg["tasks"]:
                    new.append(self._row(seed, check, task, len(rows) + len(new),
                                         model.name))
            if len(new) >= min_rows:
                break
        tasks = Counter(r["extra_info"]["task"] for r in new)
        self.stats = {
            "seeds": len(seeds), "passes": passes, "proposed": proposed, "kept": kept,
            "rows": len(new), "tasks": dict(sorted(tasks.items())),
            "dropped": dict(sorted(dropped.items())), "sandbox": cfg["sandbox"],
            "programs_run": timing["checked"],
            "sandbox_seconds": round(timing["sandbox_seconds"], 3),
            # runs whose memory only rlimits bounded (no cgroup could be made: see the log)
            "sandbox_runs_without_cgroup": runs_without_cgroup() - unbounded_before,
            "generated_tokens": timing["generated_tokens"],
            "generate_seconds": round(timing["generate_seconds"], 3)}
        if model is not None:
            self.stats["model"] = model.usage.as_dict()
        logger.info("CodeTaskProposer: %s", self.stats)
        return rows_as_dataset(new, rows, PROVENANCE_FEATURES, bool(cfg["fit_schema"]))

    @staticmethod
    def _row(seed: Seed, check: Checked, task: str, index: int, model: str) -> dict[str, Any]:
        """The row of one kept program as a `task` (deduction or abduction) task."""
        cand, output = check.candidate, check.output or ""
        question = (deduction_prompt(cand.program, cand.function, cand.argument)
                    if task == DEDUCTION else
                    abduction_prompt(cand.program, cand.function, output))
        return {
            "data_source": SOURCE,
            "prompt": [*seed.system, {"role": "user", "content": question}],
            "ability": "code",
            "reward_model": {"style": "rule", "ground_truth": output},
            "extra_info": {"index": index, "seed_index": seed.index,
                           "seed_score": seed.score, "model": model, "task": task,
                           "program": cand.program, "function": cand.function,
                           "input": cand.argument, "output": output,
                           "verification": VERIFICATION},
        }


def _known_programs(seeds: list[Seed], rows: datasets.Dataset, window: int) -> set[str]:
    """Normal forms of the programs a new one must differ from: the seeds', the examples',
    and those of the newest `window` rows of the dataset."""
    known = {normal_form(p) for p in shot_programs()}
    for seed in seeds:
        shown = program_of(seed.question)
        if shown is not None:
            known.add(normal_form(shown[0]))
    if "extra_info" in rows.column_names and len(rows):
        recent = rows.select(range(max(0, len(rows) - window), len(rows)))["extra_info"]
        known |= {normal_form(e["program"]) for e in recent
                  if isinstance(e, dict) and isinstance(e.get("program"), str)}
    return known


__all__ = ["ABDUCTION", "DEFAULTS", "DEDUCTION", "PROVENANCE_FEATURES", "SOURCE",
           "CodeTaskProposer"]
