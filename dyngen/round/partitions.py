"""A round's generation fanned out over partitions, free of Prefect: who makes which
share, and the one batch of rows and one lineage the filter → concat → version stages
take from all of them.

Partition i of P is the generator built from the same config, called with a context
that says `partition=i, partitions=P`; what a share means (a slice of the seeds, a
different random seed, a range of difficulty) is the generator's to decide.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa

from dyngen.round import RoundContext
from dyngen.rows import RowBatch


def partition_contexts(context: RoundContext, count: int) -> list[RoundContext]:
    """The round's context once per partition, each naming its index and the count."""
    return [replace(context, partition=i, partitions=count) for i in range(count)]


def union_rows(batches: Sequence[RowBatch]) -> RowBatch:
    """Every partition's rows in partition order, as one batch.

    The rows each partition's generator refused stay with them. Arrow tables with the same
    columns stay one table where their types unify (extra_info fields one partition adds
    read as null in the others); anything else becomes a list of rows, which the schema
    filter then checks row by row, as it would a generator's list.
    """
    tables = [batch.table for batch in batches]
    refused = [r for batch in batches for r in batch.quarantined]
    # Same columns only: a column missing from one partition must reach the schema filter
    # as missing, not as nulls that promotion would fill in.
    if tables and all(t is not None and set(t.column_names) == set(tables[0].column_names)
                      for t in tables):
        try:
            return RowBatch(pa.concat_tables(tables, promote_options="permissive"), refused)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            pass  # e.g. one column a string here and a list there: rows are judged one by one
    return RowBatch([row for batch in batches for row in batch.to_list()], refused)


def union_generator_lineage(generators: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One `generator` lineage entry for all partitions: partition 0's, with every state
    and every partition's stats.

    `state` stays partition 0's, so a reader of unpartitioned rounds reads it as before;
    `partition_states` keeps each partition's memory for the next round's same partition,
    and `partition_stats` each partition's counts (`stats` alone would be partition 0's).
    """
    merged = dict(generators[0])
    for key, name in (("state", "partition_states"), ("stats", "partition_stats")):
        values = [g.get(key) for g in generators]
        if len(generators) > 1 and any(value is not None for value in values):
            merged[name] = values
    return merged


def partitions_lineage(kind: str, batches: Sequence[RowBatch]) -> dict[str, Any]:
    """What the version record says about the fan-out: count, runner, rows per partition."""
    return {"count": len(batches), "task_runner": kind,
            "rows": [len(batch) for batch in batches]}
