"""The round's filters on real data: verl-exact over-long counting, schema, duplicates."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from dyngen.filters import (
    DuplicateFilter,
    OverlongPromptFilter,
    RowBatch,
    RowFilter,
    SchemaFilter,
    run_filters,
)
from dyngen.store import Store
from dyngen.store.shards import schema_from_json
from tests.rows import verl_row, verl_row_with, verl_rows

WORDS = ["solve", "the", "équation", "für", "x", "数学", "问题", "🙂", "∑", "مرحبا", "\t", "  ",
         "integral", "\n", "0.5", "ℝ", "naïve", "Ωmega", "<tag>", "{json}", "—", "ß"]


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)) or "x"


def varied_prompts(n: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """Prompts with and without system messages, multi-turn, unicode, many near 64 tokens."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        msgs = []
        if rng.random() < 0.5:
            msgs.append({"role": "system", "content": _text(rng, rng.randint(1, 12))})
        for turn in range(rng.choice([1, 1, 2, 3])):
            if turn:
                msgs.append({"role": "assistant", "content": _text(rng, rng.randint(1, 8))})
            msgs.append({"role": "user", "content": _text(rng, rng.randint(1, 40))})
        prompts.append(msgs)
    return prompts


def verl_count(tokenizer: Any, prompt: list[dict[str, str]], **kwargs: Any) -> int:
    """verl's per-row count: len of the token ids apply_chat_template returns.

    transformers 5 returns a BatchEncoding by default; verl reads its input_ids
    (verl.utils.tokenizer.normalize_token_ids), as transformers 4 returned the list.
    """
    out = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, **kwargs)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return len(ids)


@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}])
def test_overlong_filter_keeps_exactly_what_verl_keeps(qwen_tokenizer: Any,
                                                       kwargs: dict[str, Any]) -> None:
    prompts = varied_prompts(2000)
    limit = 64
    expected = [verl_count(qwen_tokenizer, p, **kwargs) <= limit for p in prompts]
    assert 300 < sum(expected) < 1700, "the prompts must straddle the limit to test anything"
    near = sum(abs(verl_count(qwen_tokenizer, p, **kwargs) - limit) <= 2 for p in prompts)
    assert near > 50
    flt = OverlongPromptFilter(qwen_tokenizer, limit, chat_template_kwargs=kwargs)
    rows = [{"prompt": p} for p in prompts]
    got = [v is None for v in flt.check(rows)]
    assert got == expected
    assert flt.lengths(prompts[:50]) == [verl_count(qwen_tokenizer, p, **kwargs)
                                         for p in prompts[:50]]


def test_overlong_detail_names_the_count_and_limit(qwen_tokenizer: Any) -> None:
    huge = [{"role": "user", "content": "word " * 100_000}]
    (detail,) = OverlongPromptFilter(qwen_tokenizer, 1024).check([{"prompt": huge}])
    assert detail is not None and "> max_prompt_length 1024" in detail
    assert int(detail.split()[0]) > 100_000


@pytest.fixture
def schema_filter(tmp_path: Path) -> SchemaFilter:
    rec = Store(tmp_path).create("ds", verl_rows(2))
    return SchemaFilter(schema_from_json(rec.schema))


def _with(**changes: Any) -> dict[str, Any]:
    return verl_row_with(7, **changes)


BAD_ROWS = {
    "prompt as plain string": (_with(prompt="What is 2+2?"), "plain string"),
    "empty messages": (_with(prompt=[]), "non-empty list"),
    "empty content": (_with(prompt=[{"role": "user", "content": "  "}]), "content is empty"),
    "non-string role": (_with(prompt=[{"role": 1, "content": "hi"}]), "role must be"),
    "content not a string": (_with(prompt=[{"role": "user", "content": b"x"}]), "content must"),
    "NaN ground truth": (_with(**{"reward_model.ground_truth": math.nan}), "finite"),
    "missing ground truth": (_with(**{"reward_model.ground_truth": None}), "finite"),
    "reward_model not a dict": (_with(reward_model="4"), "reward_model must be a dict"),
    "data_source not a string": (_with(data_source=3), "data_source must be a string"),
    "unknown column": (_with(surprise=1), "unknown columns ['surprise']"),
    "unknown nested field": (_with(**{"extra_info.novel": 1}), "extra_info.novel"),
    "wrong nested type": (_with(**{"extra_info.index": "seven"}), "does not fit"),
}


@pytest.mark.parametrize("case", BAD_ROWS)
def test_schema_filter_rejects_each_defect_with_a_reason(schema_filter: SchemaFilter,
                                                         case: str) -> None:
    row, wording = BAD_ROWS[case]
    good = verl_row(8)
    out = run_filters([good, row], [schema_filter])
    assert out.kept == [good]
    assert [r["reason"] for r in out.rejected] == ["schema"]
    assert wording in out.rejected[0]["detail"]
    assert out.counts == {"total": 2, "kept": 1, "schema": 1}


def test_content_of_any_unicode_whitespace_counts_as_empty(schema_filter: SchemaFilter) -> None:
    spaces = [c for c in map(chr, range(0x110000)) if c.isspace()]
    rows = [verl_row_with(i, prompt=[{"role": "user", "content": f"{c} {c}"}])
            for i, c in enumerate(spaces)]
    # As a generator's Dataset arrives: an Arrow table, checked column by column.
    table = pa.Table.from_pylist([*rows, verl_row(99)], schema=schema_filter.schema)
    out = run_filters(RowBatch(table), [schema_filter])
    assert len(out.kept) == 1
    assert ["content is empty" in r["detail"] for r in out.rejected] == [True] * len(spaces)


def test_schema_filter_accepts_numeric_truth_and_missing_optional_fields(
    schema_filter: SchemaFilter,
) -> None:
    row = _with(**{"reward_model.ground_truth": 4})
    del row["extra_info"]["split"]
    assert schema_filter.check([row]) == [None]


def test_non_dict_rows_are_quarantined_not_lost(schema_filter: SchemaFilter) -> None:
    out = run_filters(["junk", b"\x00\xff", None, verl_row(1)], [schema_filter])
    assert len(out.kept) == 1
    assert [r["reason"] for r in out.rejected] == ["schema"] * 3
    assert "'junk'" in out.rejected[0]["row"] or '"junk"' in out.rejected[0]["row"]


def test_duplicates_against_the_dataset_and_within_the_batch(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", verl_rows(3))
    rows = [verl_row(1), verl_row(10), verl_row(10), verl_row(11)]
    out = run_filters(rows, [DuplicateFilter(store, "ds")])
    assert [r["extra_info"]["index"] for r in out.kept] == [10, 11]
    assert [r["detail"] for r in out.rejected] == [
        "prompt already in dataset 'ds'", "same prompt as generated row 1 of this round"]
    assert out.rejected_by_reason == {"duplicate": 2}


class ShortAnswersOnly(RowFilter):
    reason = "long_answer"

    def check(self, rows):
        return [None if len(r["reward_model"]["ground_truth"]) < 2 else "answer too long"
                for r in rows]


def test_filters_run_in_order_and_each_sees_only_survivors(tmp_path: Path,
                                                           schema_filter: SchemaFilter) -> None:
    seen: list[int] = []

    class Spy(RowFilter):
        def check(self, rows):
            seen.extend(r["extra_info"]["index"] for r in rows)
            return [None] * len(rows)

    rows = [verl_row(1), verl_row(9), _with(prompt=[])]
    out = run_filters(rows, [schema_filter, ShortAnswersOnly(), Spy()])
    assert seen == [1]
    assert out.rejected_by_reason == {"long_answer": 1, "schema": 1}
