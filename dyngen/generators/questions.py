"""Finding a dataset's rows by their question, in Arrow: a rollouts file names prompts only.

Trainers' rollouts carry a prompt, not a row's position, so a generator that wants the rows
a batch's rollouts were about searches the whole dataset for their texts: the prompt column
is searched in Arrow, and only the rows it finds become Python objects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

BATCH_ROWS = 1 << 16


def rows_asking(rows: Any, questions: set[str], columns: list[str],
                keep: Callable[[pa.Table], pa.Array] | None = None
                ) -> Iterator[tuple[int, dict[str, Any]]]:
    """(position, row) of the rows (among those `keep` marks) with a prompt message whose
    trimmed text is one of `questions`: candidates, for the caller to confirm by the row's
    own question. `columns` (with "prompt") are the columns read."""
    wanted = pa.array(sorted(questions), pa.string())
    start = 0
    for batch in rows.select_columns(columns).with_format("arrow").iter(batch_size=BATCH_ROWS):
        positions = np.arange(start, start + batch.num_rows)
        start += batch.num_rows
        if keep is not None:
            mask = pc.fill_null(keep(batch), False)
            batch, positions = batch.filter(mask), positions[mask.to_numpy(zero_copy_only=False)]
        for i in _asking(batch, wanted):
            yield int(positions[i]), batch.slice(i, 1).to_pylist()[0]


def _asking(table: pa.Table, wanted: pa.Array) -> list[int]:
    """The positions in `table` of rows with a prompt message whose text (trimmed) is wanted."""
    if not table.num_rows:
        return []
    prompts = table["prompt"].combine_chunks()
    if not pa.types.is_list(prompts.type) or not pa.types.is_struct(prompts.type.value_type):
        return list(range(table.num_rows))  # not verl's message lists: judged row by row
    texts = pc.utf8_trim_whitespace(pc.list_flatten(prompts).field("content"))
    hits = pc.filter(pc.list_parent_indices(prompts), pc.fill_null(pc.is_in(texts, wanted),
                                                                    False))
    return sorted(set(hits.to_pylist()))
