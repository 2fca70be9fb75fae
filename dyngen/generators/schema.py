"""New rows as a Dataset shaped like the dataset they join: its columns, its extra_info."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import datasets

ROW_COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")


def rows_as_dataset(new: list[dict[str, Any]], rows: datasets.Dataset,
                    provenance: Mapping[str, Any], fit_schema: bool) -> datasets.Dataset:
    """`new` as a Dataset; with `fit_schema`, in the columns of `rows` plus provenance.

    With fit_schema, rows take the dataset's columns (not the store's `_dyngen_*` ones) and
    extra_info holds the dataset's own extra_info fields (null where the generator has none)
    plus the `provenance` fields, typed as the dataset declares them, else as `provenance`
    gives them (field -> datasets feature).
    """
    feats = rows.features
    extra = feats.get("extra_info")
    if not fit_schema or not isinstance(extra, dict):
        # Every row's keys, in the order first seen: not only the first row's.
        columns = list(dict.fromkeys(k for r in new for k in r)) if new else [*ROW_COLUMNS]
        return datasets.Dataset.from_dict({c: [r.get(c) for r in new] for c in columns})
    # A provenance field the dataset declares keeps its declared type.
    extra = {**extra, **{f: t for f, t in provenance.items() if f not in extra}}
    columns = [c for c in feats if not c.startswith("_dyngen_")]
    shaped = {c: [{f: r["extra_info"].get(f) for f in extra} if c == "extra_info"
                  else r.get(c) for r in new] for c in columns}
    # from_dict, not from_list: an empty round must still have the dataset's columns.
    return datasets.Dataset.from_dict(shaped, features=datasets.Features(
        {c: extra if c == "extra_info" else feats[c] for c in columns}))
