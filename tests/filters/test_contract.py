"""Every built-in filter, and the example user filter, inherits the RowFilter contract."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dyngen.filters import (
    DuplicateFilter,
    NearDuplicateFilter,
    OverlongPromptFilter,
    RowFilter,
    SchemaFilter,
)
from dyngen.plugins import load_class
from dyngen.store import Store
from dyngen.store.shards import schema_from_json
from tests.filters.contract import FilterContract
from tests.rows import verl_row, verl_row_with, verl_rows

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "short_answer_filter.py"


class TestSchemaFilter(FilterContract):
    dropped_reason = "schema"

    def make_filter(self, tmp_path: Path) -> RowFilter:
        rec = Store(tmp_path).create("ds", verl_rows(2))
        return SchemaFilter(schema_from_json(rec.schema))

    def rows_to_keep(self) -> list[dict[str, Any]]:
        return verl_rows(3, start=10)

    def rows_to_drop(self) -> list[dict[str, Any]]:
        return [verl_row(20, content="   "), verl_row_with(21, **{"reward_model.style": None})]


class TestOverlongPromptFilter(FilterContract):
    dropped_reason = "overlong_prompt"

    @pytest.fixture(autouse=True)
    def _tokenizer(self, qwen_tokenizer: Any) -> None:
        self.tokenizer = qwen_tokenizer

    def make_filter(self, tmp_path: Path) -> RowFilter:
        return OverlongPromptFilter(self.tokenizer, max_prompt_length=40)

    def rows_to_keep(self) -> list[dict[str, Any]]:
        return verl_rows(2)

    def rows_to_drop(self) -> list[dict[str, Any]]:
        return [verl_row(5, content="word " * 60)]


class TestDuplicateFilter(FilterContract):
    dropped_reason = "duplicate"

    def make_filter(self, tmp_path: Path) -> RowFilter:
        store = Store(tmp_path)
        rec = store.create("ds", verl_rows(3))
        return DuplicateFilter(store, "ds", rec.version)

    def rows_to_keep(self) -> list[dict[str, Any]]:
        return verl_rows(2, start=50)

    def rows_to_drop(self) -> list[dict[str, Any]]:
        return [verl_row(1, source="again"), verl_row(2)]  # already in the dataset


class TestNearDuplicateFilter(FilterContract):
    dropped_reason = "near_duplicate"
    task = ("Write a short essay about {}, explaining its history, its importance today and one "
            "open question that researchers still study.")
    # An essay's reference is free text: no answer to compare, the similarity rule decides.
    reference = "A rubric: a clear history, why it matters today, one open question, cited."

    def essay(self, i: int, topic: str) -> dict[str, Any]:
        row = verl_row(i, content=self.task.format(topic))
        row["reward_model"] = {**row["reward_model"], "ground_truth": self.reference}
        return row

    def make_filter(self, tmp_path: Path) -> RowFilter:
        store = Store(tmp_path)
        rec = store.create("ds", [self.essay(i, t)
                                  for i, t in enumerate(["volcanoes", "tides", "comets"])])
        return NearDuplicateFilter(store, "ds", rec.version)

    def rows_to_keep(self) -> list[dict[str, Any]]:
        return [self.essay(50, "glaciers"), verl_row(51), self.essay(52, "the 2 moons of Mars")]

    def rows_to_drop(self) -> list[dict[str, Any]]:
        tides, comets = self.essay(60, "tides"), self.essay(61, "comets")
        tides["prompt"][-1]["content"] += " Be brief."
        comets["prompt"][-1]["content"] = comets["prompt"][-1]["content"].upper()
        return [tides, comets]


class TestShortAnswersExample(FilterContract):
    """The README's user filter, loaded as the round loads `round.filters` entries."""

    dropped_reason = "long_answer"

    def make_filter(self, tmp_path: Path) -> RowFilter:
        cls = load_class(str(EXAMPLE), "ShortAnswers", RowFilter, key="round.filters[0]",
                         kind="filter")
        return cls({"path": str(EXAMPLE), "name": "ShortAnswers", "max_chars": 2})

    def rows_to_keep(self) -> list[dict[str, Any]]:
        return verl_rows(3)  # ground truths "0", "2", "4"

    def rows_to_drop(self) -> list[dict[str, Any]]:
        return [verl_row(500), verl_row(77)]  # "1000", "154"
