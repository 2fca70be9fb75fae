"""dyngen: grow an RL training dataset while the model trains, one recorded round at a time.

The packages, by what they are for:
  store/     the versioned dataset store        round/     a generation round's core
  filters/   the round's row filters            config/    the configuration
  llm/       asking a chat model                sandbox/   running model-written code
  trainers/  the trainer side: datasets, events, verl and TRL
  server/    the local Prefect server, PostgreSQL, auth   cli/  the `dyngen` command
  mirror/    copies other engines read          report/    a dataset's history as a page

Modules that moved into these packages keep their old import paths: `import dyngen.events`
gives the very module `dyngen.trainers.events` (not a copy), so code and configs written
against the old paths, and tests that patch them, keep working.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

# Old module path -> where the module lives now.
MOVED_MODULES = {
    "dyngen.cli_rounds": "dyngen.cli.rounds",
    "dyngen.cli_trainers": "dyngen.cli.trainers",
    "dyngen.cli_maintenance": "dyngen.cli.maintenance",
    "dyngen.cli_support": "dyngen.cli.support",
    "dyngen.demo": "dyngen.cli.demo",
    "dyngen.local_server": "dyngen.server.local",
    "dyngen.postgres": "dyngen.server.postgres",
    "dyngen.server_auth": "dyngen.server.auth",
    "dyngen.processes": "dyngen.server.processes",
    "dyngen.dataset": "dyngen.trainers.dataset",
    "dyngen.verl_format": "dyngen.trainers.verl_format",
    "dyngen.events": "dyngen.trainers.events",
    "dyngen.outbox": "dyngen.trainers.outbox",
    "dyngen.integrations": "dyngen.trainers",
    "dyngen.integrations.trl": "dyngen.trainers.trl",
    "dyngen.integrations.verl": "dyngen.trainers.verl_follow",
    "dyngen.integrations.verl_files": "dyngen.trainers.verl_files",
    "dyngen.integrations.rollouts": "dyngen.trainers.rollouts",
    "dyngen.context": "dyngen.round.context",
    "dyngen.lineage": "dyngen.round.lineage",
    "dyngen.partitions": "dyngen.round.partitions",
    "dyngen.task_runners": "dyngen.round.task_runners",
    "dyngen.rollouts": "dyngen.round.rollouts",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path as the module now at its new one (the same object)."""

    def __init__(self) -> None:
        self.specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(self, fullname: str, path: object = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(MOVED_MODULES[spec.name])
        self.specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system set the old name's spec on the module: give it its own back.
        assert module.__spec__ is not None
        module.__spec__ = self.specs.pop(module.__spec__.name, module.__spec__)


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    # First: a path finder would otherwise load a second copy of an old sub-module path
    # (dyngen.integrations.trl) from the new package's folder.
    sys.meta_path.insert(0, _MovedModules())
