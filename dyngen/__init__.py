"""dyngen: grow an RL training dataset while the model trains, one recorded round at a time.

The public API is the names below, imported on first use so that `import dyngen` stays
cheap (no Prefect, datasets or torch until a name needs them):

    from dyngen import AbstractDataGenerator, MockDataGenerator, RoundContext, RowFilter
    from dyngen import Store, run_round, emit_batch_end, DyngenDataset

The packages, by what they are for:
  store/       the versioned dataset store        round/     a generation round's core
  filters/     the round's row filters            config/    the configuration
  generators/  the generator contract, the loader and the built-in generators
  tasks/       one Prefect task per stage         flows/     the Prefect flows
  llm/         asking a chat model                sandbox/   running model-written code
  trainers/    the trainer side: datasets, events, verl and TRL
  server/      the local Prefect server, PostgreSQL, auth   cli/  the `dyngen` command
  mirror/      copies other engines read          report/    a dataset's history as a page
"""

from __future__ import annotations

import importlib

# typing is not imported at run time: `import dyngen` stays as cheap as an empty package.
TYPE_CHECKING = False

# Public name -> the module that defines it.
_public_api: dict[str, str] = {
    "AbstractDataGenerator": "dyngen.generators.base",
    "MockDataGenerator": "dyngen.generators.base",
    "RoundContext": "dyngen.round.context",
    "RowFilter": "dyngen.filters.base",
    "Store": "dyngen.store.store",
    "run_round": "dyngen.runtime.in_process",
    "emit_batch_end": "dyngen.trainers.events",
    "DyngenDataset": "dyngen.trainers.dataset",
}

__all__ = [
    "AbstractDataGenerator", "DyngenDataset", "MockDataGenerator", "RoundContext", "RowFilter",
    "Store", "emit_batch_end", "run_round",
]

if TYPE_CHECKING:
    from typing import Any

    from dyngen.filters.base import RowFilter
    from dyngen.generators.base import AbstractDataGenerator, MockDataGenerator
    from dyngen.round.context import RoundContext
    from dyngen.runtime.in_process import run_round
    from dyngen.store.store import Store
    from dyngen.trainers.dataset import DyngenDataset
    from dyngen.trainers.events import emit_batch_end


def __getattr__(name: str) -> Any:
    module = _public_api.get(name)
    if module is None:
        raise AttributeError(f"module 'dyngen' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_public_api))
