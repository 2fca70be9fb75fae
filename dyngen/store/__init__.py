"""The versioned dataset store (append-only shards + a linear version log).

The names below load on first use, so that a module needing one small part (the store's
location, its names) does not import Arrow, numpy and datasets with it.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False

# Public name -> the module that defines it.
_public_api: dict[str, str] = {
    "PROVENANCE_COLUMNS": "dyngen.store.shards",
    "AlreadyCoveredError": "dyngen.errors",
    "BatchEnd": "dyngen.store.inbox",
    "BatchEndError": "dyngen.errors",
    "CompactionPolicy": "dyngen.store.compaction",
    "CoverageError": "dyngen.errors",
    "CoverageOrderError": "dyngen.errors",
    "Covered": "dyngen.store.covered",
    "LogEntry": "dyngen.store.records",
    "LogState": "dyngen.store.state",
    "NotInInboxError": "dyngen.errors",
    "PendingCommit": "dyngen.store.records",
    "Problem": "dyngen.store.maintenance",
    "Retention": "dyngen.store.state",
    "ShardInfo": "dyngen.store.records",
    "Store": "dyngen.store.store",
    "VacuumResult": "dyngen.store.retention",
    "VersionRecord": "dyngen.store.records",
    "gc": "dyngen.store.maintenance",
    "validate_name": "dyngen.store.names",
    "verify": "dyngen.store.maintenance",
}

__all__ = [
    "PROVENANCE_COLUMNS", "AlreadyCoveredError", "BatchEnd", "BatchEndError",
    "CompactionPolicy", "CoverageError", "CoverageOrderError", "Covered", "LogEntry",
    "LogState", "NotInInboxError", "PendingCommit", "Problem", "Retention", "ShardInfo",
    "Store", "VacuumResult", "VersionRecord", "gc", "validate_name", "verify",
]

if TYPE_CHECKING:
    from typing import Any

    from dyngen.errors import (
        AlreadyCoveredError,
        BatchEndError,
        CoverageError,
        CoverageOrderError,
        NotInInboxError,
    )
    from dyngen.store.compaction import CompactionPolicy
    from dyngen.store.covered import Covered
    from dyngen.store.inbox import BatchEnd
    from dyngen.store.maintenance import Problem, gc, verify
    from dyngen.store.names import validate_name
    from dyngen.store.records import LogEntry, PendingCommit, ShardInfo, VersionRecord
    from dyngen.store.retention import VacuumResult
    from dyngen.store.shards import PROVENANCE_COLUMNS
    from dyngen.store.state import LogState, Retention
    from dyngen.store.store import Store


def __getattr__(name: str) -> Any:
    module = _public_api.get(name)
    if module is None:
        raise AttributeError(f"module 'dyngen.store' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_public_api))
