"""Code tasks whose labels are proved by running them (Absolute Zero's deduction/abduction).

Configure as `data.datagen: {path: pkg://dyngen.generators.code_tasks, name: CodeTaskProposer}`.
  tasks.py       the prompts (deduction, abduction) and reading programs back from them;
  proposing.py   the few-shot chat per seed, and a completion read into a candidate;
  checking.py    each candidate run twice in the sandbox (dyngen.sandbox): kept with its
                 value as the label, or dropped with a reason;
  generator.py   CodeTaskProposer: seeds, passes, rows, stats;
  reward.py      the reward for verl (compute_score) and TRL (code_task_reward);
  seed_tasks.py  a few dozen hand-written seed tasks (seed_tasks.jsonl).
The model is dyngen.llm's (served, or in-process: by default SmolLM2-135M).
"""

from dyngen.generators.code_tasks.generator import (
    DEFAULTS,
    PROVENANCE_FEATURES,
    SOURCE,
    UNISOLATED_WARNING,
    CodeTaskProposer,
)
from dyngen.generators.code_tasks.tasks import ABDUCTION, DEDUCTION, TASKS

__all__ = [
    "ABDUCTION",
    "DEDUCTION",
    "DEFAULTS",
    "PROVENANCE_FEATURES",
    "SOURCE",
    "TASKS",
    "UNISOLATED_WARNING",
    "CodeTaskProposer",
]
