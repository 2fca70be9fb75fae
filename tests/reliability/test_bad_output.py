"""Every kind of bad generator output, as real rounds: a clear failure or a quarantine, and
never a partial commit.

One table lists each kind and what a user gets: the round fails with a message naming the
generator and the problem (output that is not rows at all, an exception, a hang past
`round.timeout_seconds`), or the bad rows are quarantined with a reason while the good rows
of the same round are kept. Whatever happens, the head is the old version or exactly one
newer, `verify` is clean, and no shard is left without a record naming it.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from dyngen.filters import RowBatch, SchemaFilter
from dyngen.flows.generation_round import generation_round
from dyngen.store import PROVENANCE_COLUMNS, Store, gc, verify
from dyngen.store.shards import schema_from_json
from dyngen.store.store import DATA_DIR, REJECTED_DIR
from tests.reliability.gens import GOOD, HUGE_CONTENT_CHARS, MILLION_START
from tests.rows import verl_row, verl_rows

pytestmark = pytest.mark.usefixtures("prefect_server")

SEED_ROWS = 4
GENERATOR = "Misbehaves"


@dataclass(frozen=True)
class Kind:
    """One kind of bad output and the outcome a user gets."""

    fails: bool  # the round fails (else: bad rows quarantined, good rows kept)
    # in the failure message, or in each quarantined row's detail (a tuple: one per row)
    wording: str | tuple[str, ...]
    reason: str = "schema"  # the quarantine reason
    bad_rows: int = 1
    timeout: float | None = None  # round.timeout_seconds
    overlong_filter: bool = False


KINDS: dict[str, Kind] = {
    # not rows at all: the round fails, naming the generator and what it returned
    "raises": Kind(True, "proposer crashed"),
    "hangs": Kind(True, "timed out after 2.0 second", timeout=2.0),
    "none": Kind(True, "returned None"),
    "string": Kind(True, "returned a str"),
    "int": Kind(True, "returned a int"),
    "generator_object": Kind(True, "returned a generator"),
    "dict_of_scalars": Kind(True, "returned a dict"),
    "unequal_columns": Kind(True, "columns of unequal lengths"),
    # rows, some bad: each bad row is quarantined with its reason, the good rows kept
    "missing_column": Kind(False, "reward_model must be a dict"),
    "wrong_types": Kind(False, "data_source must be a string"),
    "plain_string_prompt": Kind(False, "plain string"),
    "empty_messages": Kind(False, "non-empty list"),
    "non_string_role": Kind(False, "role must be a non-empty string"),
    "nan_ground_truth": Kind(False, "must be a finite value"),
    "inf_ground_truth": Kind(False, "must be a finite value", bad_rows=2),
    "numpy_nan_ground_truth": Kind(False, "must be a finite value"),
    "bytes_content": Kind(False, "content must be a string, found bytes"),
    "bytes_row": Kind(False, "row is a bytes, expected a dict"),
    "surrogate_content": Kind(False, "not valid UTF-8"),
    "nested_wrong_types": Kind(False, "does not fit the dataset's schema"),
    "message_extra_keys": Kind(False, "prompt[].name, prompt[].tool_calls"),
    "unknown_column": Kind(False, "unknown columns ['surprise']"),
    "huge_row": Kind(False, "over the limit", reason="too_large"),
    "huge_prompt": Kind(False, "max_prompt_length", reason="overlong_prompt",
                        overlong_filter=True),
    "arrow_rows_with_defects": Kind(False, ("prompt[1].content is empty",
                                            "prompt[0].role must be a non-empty string"),
                                    bad_rows=2),
}

SUMMARY: dict[str, str] = {}  # kind -> outcome
PARTIAL: dict[str, int] = {}  # kind -> files on disk that no version record names


@pytest.fixture(scope="module", autouse=True)
def summary() -> Iterator[None]:
    yield
    print(f"\nbad generator output: {len(SUMMARY)} kinds tried, partial commits = "
          f"{sum(1 for n in PARTIAL.values() if n)}")
    for kind, outcome in SUMMARY.items():
        print(f"  {kind:<26} {outcome}")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "store")
    store.create("ds", verl_rows(SEED_ROWS))
    return store


def config(store: Store, name: str, **datagen: Any) -> dict[str, Any]:
    return {
        "store": {"root": str(store.root)},
        "data": {"filter_overlong_prompts": False,
                 "datagen": {"path": "pkg://tests.reliability.gens", "name": name, **datagen}},
        "round": {"retries": 0, "retry_delay_seconds": 0},
    }


def failure_text(state: Any) -> str:
    """The run's state message, the exception, and the notes the round added to it (or to
    the exception it interrupted: a timeout's cancellation is raised inside the generator)."""
    exc = state.result(raise_on_failure=False)
    lines = [state.message or "", str(exc)]
    while isinstance(exc, BaseException):
        lines += getattr(exc, "__notes__", [])
        exc = exc.__cause__ or exc.__context__
    return "\n".join(lines)


def data_files(store: Store, name: str) -> set[str]:
    base = store.dataset_dir(name)
    return {f"{sub}/{p.name}" for sub in (DATA_DIR, REJECTED_DIR) if (base / sub).is_dir()
            for p in (base / sub).iterdir()}


def named_files(store: Store, name: str) -> set[str]:
    return {f for rec in Store(store.root).history(name)
            for s in rec.shards + rec.rejected for f in s.files}


def assert_no_partial_commit(store: Store, name: str, old_head: int, kind: str) -> int:
    """Head is old or old+1, verify is clean, and every file on disk is named by a record."""
    head = Store(store.root).head_version(name)
    orphans = data_files(store, name) - named_files(store, name)
    PARTIAL[kind] = len(orphans)
    assert head in (old_head, old_head + 1)
    assert verify(store, name) == []
    assert orphans == set(), f"files no record names (a partial commit): {orphans}"
    assert gc(store, name, grace_seconds=0) == []  # nor a half-written shard or record
    return head


@pytest.mark.parametrize("kind", KINDS)
def test_bad_output_fails_clearly_or_is_quarantined_never_partially_committed(
    store: Store, kind: str, qwen_tokenizer_dir: str,
) -> None:
    spec = KINDS[kind]
    cfg = config(store, GENERATOR, case=kind)
    if spec.timeout is not None:
        cfg["round"]["timeout_seconds"] = spec.timeout
    if spec.overlong_filter:
        cfg["data"].update(filter_overlong_prompts=True, tokenizer=qwen_tokenizer_dir)
    before = store.load("ds").num_rows

    started = time.monotonic()
    state = generation_round("ds", cfg, {"step": 1}, return_state=True)
    seconds = time.monotonic() - started

    head = assert_no_partial_commit(store, "ds", 0, kind)
    if spec.fails:
        assert state.is_failed(), f"{kind}: expected a failed round, got {state.type}"
        text = failure_text(state)
        assert spec.wording in text, text
        assert GENERATOR in text, f"the failure does not name the generator:\n{text}"
        assert head == 0
        if spec.timeout is not None:  # the hung generator did not hold the flow open
            assert seconds < spec.timeout + 30, f"the round took {seconds:.0f} s"
        SUMMARY[kind] = f"fails: {text.splitlines()[0][:90]}"
        return
    assert state.is_completed(), failure_text(state)
    result = state.result()
    assert head == 1 and result["version"] == 1
    assert result["counts"]["generated"] == spec.bad_rows + len(GOOD)
    assert result["counts"]["kept"] == len(GOOD)
    assert result["counts"]["rejected"] == {spec.reason: spec.bad_rows}
    ds = store.load("ds")
    assert ds.num_rows == before + len(GOOD)
    assert [e["index"] for e in ds["extra_info"][before:]] == list(GOOD)
    rejected = store.load_rejected("ds")
    assert rejected["reason"] == [spec.reason] * spec.bad_rows
    wordings = spec.wording if isinstance(spec.wording, tuple) else (spec.wording,) * spec.bad_rows
    for wording, detail in zip(wordings, rejected["detail"], strict=True):
        assert wording in detail, detail
    if kind == "huge_row":  # quarantined whole, as it came
        assert len(rejected[0]["row"]) > HUGE_CONTENT_CHARS
    SUMMARY[kind] = f"quarantined {spec.bad_rows} ({spec.reason}): {rejected[0]['detail'][:70]}"


def _defective(i: int, rng: random.Random) -> dict[str, Any]:
    """verl_row(i) with up to two random defects that keep its Arrow types."""
    row = verl_row(i)
    for _ in range(rng.randint(0, 2)):
        where, value = rng.choice([
            ("content", ""), ("content", " \t\n"), ("content", "\u3000\x1c\x85"),
            ("content", None), ("content", "\u200b"), ("content", "x" * 300),
            ("role", None), ("role", "\xa0"), ("prompt", None), ("prompt", []),
            ("message", None), ("reward_model", None), ("style", None), ("truth", None),
            ("data_source", None), ("ability", None), ("extra_info", None)])
        messages = row["prompt"] or []
        k = rng.randrange(2)
        if where in ("content", "role") and len(messages) == 2 and messages[k] is not None:
            messages[k][where] = value
        elif where == "message" and len(messages) == 2:
            messages[k] = value
        elif where in ("style", "truth") and row["reward_model"] is not None:
            row["reward_model"][{"truth": "ground_truth"}.get(where, where)] = value
        elif where in row:
            row[where] = value
    return row


def test_checking_columns_at_once_gives_the_verdicts_of_checking_each_row(
    store: Store, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The schema filter reads a generator's Arrow rows by column; the row checks decide."""
    schema = schema_from_json(store.head("ds").schema)
    flt = SchemaFilter(schema, max_row_bytes=300)
    rng = random.Random(7)
    rows = [_defective(i, rng) for i in range(3000)]
    body = pa.schema([f for f in schema if f.name not in PROVENANCE_COLUMNS])
    table = pa.Table.from_pylist(rows, schema=body)
    marked: list[int] = []
    suspects = flt._suspects

    def spy(t: pa.Table) -> Any:
        found = suspects(t)
        marked.append(-1 if found is None else int(found.sum()))
        return found

    monkeypatch.setattr(flt, "_suspects", spy)
    by_column = flt.verdicts(RowBatch(table))
    by_row = flt.verdicts(table.to_pylist())
    assert marked and 0 < marked[0] < len(rows), "the columns were not checked at once"
    assert by_column == by_row
    reasons = Counter(v[0] for v in by_row if v)
    assert reasons["schema"] > 1000 and reasons["too_large"] > 20, reasons


# 200,000 rows: enough that a per-row step of the round's own would show, small enough for CI
# (benchmarks/filters.py and benchmarks/long_run.py measure the speeds at scale).
MANY = 200_000


def test_two_hundred_thousand_rows_at_once_are_filtered_and_committed_in_one_round(
        store: Store) -> None:
    started = time.monotonic()
    state = generation_round("ds", config(store, "MillionRows", n=MANY), {"step": 1},
                             return_state=True)
    seconds = time.monotonic() - started
    assert state.is_completed(), failure_text(state)
    result = state.result()
    assert result["counts"] == {"generated": MANY, "kept": MANY - 3,
                                "rejected": {"duplicate": 1, "schema": 2}}
    assert assert_no_partial_commit(store, "ds", 0, "many_rows") == 1
    head = store.load("ds")
    assert head.num_rows == SEED_ROWS + MANY - 3
    assert head[SEED_ROWS]["extra_info"]["index"] == MILLION_START + 3
    assert head[-1]["extra_info"]["index"] == MILLION_START + MANY - 1
    rejected = store.load_rejected("ds")
    assert sorted(rejected["detail"]) == [
        "prompt already in dataset 'ds'", "prompt[1].content is empty",
        "reward_model.ground_truth must be a finite value, found None"]
    timings = store.head("ds").lineage["timings"]
    print(f"\n{MANY:,} rows in one round: {seconds:.1f} s in all; stages {timings}")
    SUMMARY["many_rows"] = (f"kept {MANY - 3:,}, quarantined 3, {seconds:.0f} s "
                            f"(filter {timings['filter']:.1f} s)")
