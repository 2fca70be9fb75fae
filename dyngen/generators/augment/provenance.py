"""Tracing an augmented row back to its source, and that one to its own, to a row no
Augmenter made: each step is extra_info.augmented_from = {version, index, method}."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dyngen.errors import StoreError
from dyngen.store import Store


@dataclass(frozen=True)
class TraceStep:
    """One row on the way back: where it is, and how it was made from the next step's row
    (None: from nothing an Augmenter recorded)."""

    version: int
    index: int
    method: str | None
    row: dict[str, Any]


def trace_row(store: Store, name: str, version: int, index: int) -> list[TraceStep]:
    """Row `index` of `version`, then its source, its source's source, ...: the row first."""
    steps: list[TraceStep] = []
    while True:
        rows = store.load(name, version)
        if not 0 <= index < len(rows):
            where = f" (the source of row {steps[-1].index} of version {steps[-1].version})" \
                if steps else ""
            raise StoreError(f"{name!r} version {version} has {len(rows)} rows, so no row "
                             f"{index}{where}. Rows are counted from 0; see `dyngen show "
                             f"{name} --version {version}`.")
        row = rows[index]
        info = row.get("extra_info")
        origin = info.get("augmented_from") if isinstance(info, Mapping) else None
        origin = origin if isinstance(origin, Mapping) and origin.get("version") is not None \
            else None
        steps.append(TraceStep(version, index, origin.get("method") if origin else None, row))
        if origin is None:
            return steps
        source_version, source_index = int(origin["version"]), int(origin["index"])
        if source_version >= version:  # a source is always read from an older version
            raise StoreError(f"row {index} of {name!r} version {version} names its source as "
                             f"row {source_index} of version {source_version}, which is not "
                             "older: its extra_info.augmented_from was not written by dyngen.")
        version, index = source_version, source_index
