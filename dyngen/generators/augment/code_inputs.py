"""`code_inputs`: a code task's program on a new input, its output recomputed in the sandbox.

A source is a code task (extra_info program, function, input, task: rows CodeTaskProposer
and the seed tasks wrote). The new input is drawn like the old one, of its type and shape:
numbers of as many digits, text of the same kind of characters, containers of about the
same length whose items are drawn like their own. The program runs on it in the sandbox
once per hash seed, `hash_seeds` (8) of them (PYTHONHASHSEED 0, 1, ...;
dyngen.sandbox.run_deterministic): a label that depends on set order (`list(set(xs))` of
text) is one that another seed contradicts, and two seeds agree by chance too often (a
two-item set: one time in two; eight: one in 128). An input that errs, times out, differs
between the runs or gives back no literal is drawn again
(up to `redraws` times; each failed run counted in `failed_runs` by reason), after which the
row is skipped (`no_input_ran`). `check` refuses a variant whose prompt does not show its
program, input and (abduction) output, or whose label is not the value the runs gave.

Config (data.datagen): sandbox (bwrap; unisolated: without isolation, with a warning),
timeout_seconds (5), memory_mb (512), max_value_chars (300), max_input_chars (300),
redraws (3), hash_seeds (8: runs that must agree, at least 2).
"""

from __future__ import annotations

import logging
import random
import string
from collections import Counter
from typing import Any

from dyngen.errors import ConfigError, SandboxInputError
from dyngen.generators.augment.base import (
    DEFAULTS,
    AugmentContext,
    Augmenter,
    Check,
    NotApplicable,
    with_question,
)
from dyngen.generators.code_tasks.checking import label_of
from dyngen.generators.code_tasks.generator import UNISOLATED_WARNING
from dyngen.generators.code_tasks.proposing import Candidate
from dyngen.generators.code_tasks.tasks import (
    ABDUCTION,
    DEDUCTION,
    abduction_prompt,
    deduction_prompt,
    literal,
    program_of,
)
from dyngen.sandbox import ISOLATIONS, argument_literal, require_bwrap, run_deterministic
from dyngen.text import question_of

logger = logging.getLogger(__name__)
MAX_DEPTH = 4


class CodeInputsAugmenter(Augmenter):
    """A code task on a new input; the label is what the program returns under every one
    of `hash_seeds` hash seeds."""

    method = "code_inputs"
    defaults = {**DEFAULTS, "sandbox": "bwrap", "timeout_seconds": 5.0, "memory_mb": 512,
                "max_value_chars": 300, "max_input_chars": 300, "redraws": 3, "hash_seeds": 8}

    def check_settings(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """A known sandbox, besides the base's checks."""
        if cfg["sandbox"] not in ISOLATIONS:
            raise ConfigError(f"data.datagen.sandbox: expected one of {', '.join(ISOLATIONS)}; "
                              f"found {cfg['sandbox']!r}. Use bwrap unless it cannot run here.")
        seeds = cfg["hash_seeds"]
        if isinstance(seeds, bool) or not isinstance(seeds, int) or not 2 <= seeds <= 64:
            raise ConfigError(f"data.datagen.hash_seeds: expected 2..64 runs (each its own "
                              f"PYTHONHASHSEED) that must agree; found {seeds!r}.")
        return super().check_settings(cfg)

    def opened(self, cfg: dict[str, Any]) -> None:
        """A round that cannot isolate its runs stops before any (unless told otherwise)."""
        if cfg["sandbox"] == "bwrap":
            require_bwrap()
        else:
            logger.warning(UNISOLATED_WARNING.replace("CodeTaskProposer", type(self).__name__))
        self._failed: Counter[str] = Counter()

    def augment(self, row: dict[str, Any], context: AugmentContext) -> list[dict[str, Any]]:
        """The task on a new input, labelled by runs in the sandbox under `hash_seeds`
        hash seeds that all agree."""
        info = row.get("extra_info") or {}
        program, function, shown = info.get("program"), info.get("function"), info.get("input")
        task = info.get("task") or DEDUCTION
        if not all(isinstance(x, str) for x in (program, function, shown)) \
                or task not in (DEDUCTION, ABDUCTION):
            raise NotApplicable("not_a_code_task")
        ok, value = literal(shown)
        if not ok:
            raise NotApplicable("input_not_literal")
        cfg = context.settings
        for _ in range(int(cfg["redraws"]) + 1):
            new = new_input(value, context.rng)
            try:
                new_shown = argument_literal(new)
            except SandboxInputError:
                continue
            if new == value or len(new_shown) > int(cfg["max_input_chars"]):
                continue
            result = run_deterministic(
                program, function, new, runs=int(cfg["hash_seeds"]), isolation=str(cfg["sandbox"]),
                timeout_seconds=float(cfg["timeout_seconds"]), memory_mb=int(cfg["memory_mb"]),
                max_value_chars=int(cfg["max_value_chars"]))
            output, why = label_of(result, Candidate(program, function, new_shown, new))
            if output is None:
                self._failed[why] += 1
                continue
            question = (deduction_prompt(program, function, new_shown) if task == DEDUCTION
                        else abduction_prompt(program, function, output))
            variant = with_question(row, question, output)
            variant["extra_info"].update(input=new_shown, output=output)
            return [variant]
        raise NotApplicable("no_input_ran")

    def check(self, source: dict[str, Any], variant: dict[str, Any],
              context: AugmentContext) -> Check:
        """The prompt shows the source's program and the variant's input (or output), and
        the label is the output the runs gave."""
        info, src = variant["extra_info"], source["extra_info"]
        shown = program_of(question_of(variant["prompt"]))
        if shown is None or shown[0].strip() != str(src["program"]).strip() \
                or info.get("program") != src["program"]:
            return ("label_unchecked", "the prompt does not show the source's program")
        if (info.get("task") or DEDUCTION) == DEDUCTION and shown[1] != info.get("input"):
            return ("label_unchecked", "the prompt does not show the input the label is for")
        if variant["reward_model"]["ground_truth"] != info.get("output"):
            return ("label_mismatch", "the label is not the output the program returned")
        return None

    def method_stats(self) -> dict[str, Any]:
        """Runs on new inputs that gave no label, by the sandbox's reason."""
        return {"failed_runs": dict(sorted(self._failed.items()))}


def new_input(value: Any, rng: random.Random, depth: int = 0) -> Any:
    """A value drawn like `value`: its type, its shape, about its size."""
    if isinstance(value, bool):
        return rng.random() < 0.5
    if isinstance(value, int):
        digits = len(str(abs(value)))
        drawn = rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10 ** digits - 1)
        return -drawn if value < 0 else drawn
    if isinstance(value, float):
        return round(rng.uniform(0, 2 * abs(value) or 1.0), 2) * (-1 if value < 0 else 1)
    if isinstance(value, str):
        return _new_text(value, rng)
    if depth >= MAX_DEPTH:
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
        if not items:
            return value
        size = max(1, len(items) + rng.randint(-1, 1))
        drawn = [new_input(rng.choice(items), rng, depth + 1) for _ in range(size)]
        return type(value)(drawn)
    if isinstance(value, dict):
        return {k: new_input(v, rng, depth + 1) for k, v in value.items()}
    return value  # None, bytes, complex: kept (the input still changes elsewhere, or not)


def _new_text(text: str, rng: random.Random) -> str:
    """Words of letters as long as the old ones (as many, or one more or fewer), else
    characters from the text's own."""
    words = text.split(" ")
    if len(words) > 1 and all(w.isalpha() for w in words):
        count = max(1, len(words) + rng.randint(-1, 1))
        return " ".join(_word(rng.choice(words), rng) for _ in range(count))
    if text.isalpha():
        return _word(text, rng)
    alphabet = sorted(set(text)) or list(string.ascii_lowercase)
    size = max(1, len(text) + rng.randint(-1, 1)) if text else 0
    return "".join(rng.choice(alphabet) for _ in range(size))


def _word(like: str, rng: random.Random) -> str:
    """Letters as many as `like`'s, each of its letter's case."""
    return "".join(rng.choice(string.ascii_uppercase if c.isupper() else string.ascii_lowercase)
                   for c in like)
