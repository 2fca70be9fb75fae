"""The duplicate filter: prompts already in the dataset, or earlier in the same round."""

from __future__ import annotations

from collections.abc import Sequence

from dyngen.filters.base import RowFilter
from dyngen.rows import Row, column_of
from dyngen.store import Store
from dyngen.store.keys import prompt_keys


class DuplicateFilter(RowFilter):
    """Drop prompts already in the dataset or earlier in the same batch (normalised)."""

    reason = "duplicate"

    def __init__(self, store: Store, dataset: str, version: int | None = None,
                 prompt_key: str = "prompt") -> None:
        super().__init__(None)
        self.store, self.dataset, self.version = store, dataset, version
        self.prompt_key = prompt_key

    def check(self, rows: Sequence[Row]) -> list[str | None]:
        keys = prompt_keys(column_of(rows, self.prompt_key))
        stored = self.store.contains_prompts(self.dataset, keys, self.version)
        seen: dict[int, int] = {}
        out: list[str | None] = []
        for i, (key, in_store) in enumerate(zip(keys.tolist(), stored.tolist(), strict=True)):
            if in_store:
                out.append(f"prompt already in dataset {self.dataset!r}")
            elif key in seen:
                out.append(f"same prompt as generated row {seen[key]} of this round")
            else:
                seen[key] = i
                out.append(None)
        return out
