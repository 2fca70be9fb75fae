"""The versioned dataset store (append-only shards + a linear version log)."""

from dyngen.store.compaction import CompactionPolicy
from dyngen.store.maintenance import Problem, gc, verify
from dyngen.store.names import validate_name
from dyngen.store.records import LogEntry, PendingCommit, ShardInfo, VersionRecord
from dyngen.store.retention import VacuumResult
from dyngen.store.shards import PROVENANCE_COLUMNS
from dyngen.store.state import LogState, Retention
from dyngen.store.store import Store

__all__ = [
    "PROVENANCE_COLUMNS",
    "CompactionPolicy",
    "LogEntry",
    "LogState",
    "PendingCommit",
    "Problem",
    "Retention",
    "ShardInfo",
    "Store",
    "VacuumResult",
    "VersionRecord",
    "gc",
    "validate_name",
    "verify",
]
