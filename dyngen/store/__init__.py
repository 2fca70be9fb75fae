"""The versioned dataset store (append-only shards + version log)."""

from dyngen.store.maintenance import Problem, gc, verify
from dyngen.store.names import validate_name
from dyngen.store.records import ShardInfo, VersionRecord
from dyngen.store.shards import PROVENANCE_COLUMNS
from dyngen.store.store import PendingCommit, Store

__all__ = [
    "PROVENANCE_COLUMNS",
    "PendingCommit",
    "Problem",
    "ShardInfo",
    "Store",
    "VersionRecord",
    "gc",
    "validate_name",
    "verify",
]
