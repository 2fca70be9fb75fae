"""The reference answer as a duplicate gate (issue 53): answers compared as values, code by
what it does; in both duplicate filters a different answer keeps the row, the same answer
lets a reworded task go at a lower cosine, and rows without a comparable answer keep the
similarity rule; the detail says which rule decided. Real stores, the real MiniLM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from dyngen.config import load_config
from dyngen.filters import NearDuplicateFilter, SemanticDuplicateFilter, run_filters
from dyngen.filters.answers import answer_key, answer_keys, answer_of, canonical, swapped
from dyngen.filters.chain import build_filters
from dyngen.rows import RowBatch
from dyngen.store import Store
from dyngen.store.embeddings import VectorSettings, embedder
from dyngen.store.semantic import VecKind

MINILM = VecKind(VectorSettings("minilm"))
TANK = ("A tank fills at 15 litres per minute. How many minutes does it take to fill a "
        "600-litre tank?")
TANK_SECONDS = TANK.replace("How many minutes", "How many seconds")
PAGES = "Omar reads 18 pages a day. How many pages does he read in 5 days?"
PAGES_REWORDED = "Reading 18 pages every day, how many pages will Jun get through in 5 days?"
PAGES_OTHER_NUMBERS = "Omar reads 30 pages a day. How many pages does he read in 3 days?"
ESSAY = "Write a short essay on why steel bridges expand in summer and what engineers do about it."
ESSAY_AGAIN = ESSAY.replace("essay on why", "essay explaining why")
RUBRIC = ("A good essay names thermal expansion, explains expansion joints and sliding "
          "bearings, and gives one real bridge as an example.")
LIBRARY = ("The town library is open from Monday to Saturday and lends books, films and board "
           "games to its members. Last month it lent 320 books, 85 films and 40 board games, and "
           "every single loan came back on time, which the librarian was very proud of. How many "
           "books and {} did the library lend last month?")


def row(text: str, answer: Any, i: int = 0, **extra: Any) -> dict[str, Any]:
    return {"data_source": "t", "ability": "math",
            "prompt": [{"role": "system", "content": "Solve it."},
                       {"role": "user", "content": text}],
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"index": i, **extra}}


def cosine(a: str, b: str) -> float:
    va, vb = embedder(MINILM.settings).embed([a, b])
    return float(np.dot(va, vb))


def details(flt: Any, rows: list[dict[str, Any]]) -> list[str | None]:
    return [None if v is None else v[1] for v in flt.verdicts(rows)]


# ---- the answer, normalised
@pytest.mark.parametrize(("one", "other"), [
    ("12", "12.0"), ("$12", " 12 "), ("1,200", "1200"), ("30%", "30"), ("1/4", "0.25"),
    ("\\frac{1}{4}", "1/4"), ("x = 6", "n = 6"), ("9 cm", "9"), ("\\boxed{40}", "40"),
    ("  Paris. ", "paris"), ("Jane  Austen", "jane austen"), (12, "12"), (0.5, "1/2"),
    (["4", "four"], ["four", "4.0"]), ("[1, 2,3]", "[1, 2, 3]"), ("{'b': 2, 'a': 1}",
                                                                  "{'a': 1, 'b': 2}")])
def test_equal_answers_are_equal_as_values(one: Any, other: Any) -> None:
    assert canonical(one) is not None and canonical(one) == canonical(other)


@pytest.mark.parametrize(("one", "other"), [
    ("12", "13"), ("1/4", "1/3"), ("-5", "5"), ("'HELLO'", "'Hello'"), ("3:2", "2:3"),
    ("[1, 2]", "[2, 1]"), ("Paris", "Rome")])
def test_different_answers_differ(one: str, other: str) -> None:
    assert canonical(one) != canonical(other)


def test_free_text_and_missing_references_are_not_compared() -> None:
    assert canonical(None) is None and canonical("") is None and canonical([]) is None
    assert canonical(RUBRIC) is None  # more than MAX_WORDS words: a rubric, an essay
    assert answer_key(row(ESSAY, RUBRIC)) is None


def test_a_choice_letter_stands_for_its_option() -> None:
    asked = "Which metal is liquid at room temperature? A) Iron B) Mercury C) Copper D) Tin"
    reordered = ("Name the metal that is a liquid at room temperature. (A) Tin (B) Copper "
                 "(C) Mercury")
    assert answer_of(row(asked, "B")) == answer_of(row(reordered, "(C)")) == "text:mercury"
    assert answer_of(row(asked, "Mercury")) == answer_of(row(asked, "b"))
    assert answer_of(row(asked, "A")) != answer_of(row(asked, "B"))
    assert answer_of(row("Is it true? Pick B if so.", "B")) == "choice:b"  # no options listed


def test_code_tasks_compare_what_the_reference_does() -> None:
    def code(program: str, name: str, arg: str, out: str) -> dict[str, Any]:
        return row(f"What does `{name}({arg})` return?\n{program}", out, task="deduction",
                   program=program, function=name, input=arg, output=out)

    first = code("def f(x):\n    return sorted(x)[-2]", "f", "[5, 1, 9]", "5")
    renamed = code("def second(values):\n    return sorted(values)[-2]", "second", "[5,1,9]",
                   "5")
    other_input = code("def f(x):\n    return sorted(x)[-2]", "f", "[5, 1, 2]", "2")
    assert answer_key(first) == answer_key(renamed) != answer_key(other_input)
    tests = {"inputs": ["1 2\n", "3 4"], "outputs": ["3", "7\n"]}
    assert canonical(tests) == canonical('{"inputs": ["3 4", "1  2"], "outputs": ["7", "3"]}')
    asserts = "assert add(1, 2) == 3\nassert add(3, 4) == 7"
    assert canonical(asserts) == canonical("assert plus(3,4) == 7\nassert plus(1,2) == 3")
    assert canonical(asserts) != canonical("assert add(1, 2) == 4")


def test_a_struct_columns_empty_code_fields_leave_the_ground_truth_to_decide() -> None:
    # Arrow gives every row of a struct column every field: a math row's are None.
    math = row(PAGES, "90", program=None, function=None, input=None, output=None)
    assert answer_of(math) == "num:90"
    batch = RowBatch(pa.Table.from_pylist([math, row(TANK, "40")]))
    assert answer_keys(batch) == [answer_key(math), answer_key(row(TANK, "40"))]



def test_code_writing_references_tell_a_rewording_from_another_function() -> None:
    # benchmarks/data/fixture_answers.jsonl gives code-writing prompts tests of this kind
    vowels = "assert count_vowels('hello') == 2\nassert count_vowels('sky') == 0"
    removed = "assert remove_vowels('hello') == 'hll'\nassert remove_vowels('sky') == 'sky'"
    assert canonical(vowels) == canonical(vowels.replace("count_vowels", "num_vowels"))
    assert canonical(vowels) != canonical(removed)  # the same inputs, other results
    unique = {"fn_name": "removeDuplicates", "inputs": [[[1, 2, 2]], [[]]], "outputs": [[1, 2], []]}
    only = {"fn_name": "duplicatesOnly", "inputs": [[[1, 2, 2]], [[]]], "outputs": [[2], []]}
    assert canonical(unique) != canonical(only) is not None


def test_the_same_words_with_the_numbers_swapped_are_another_task() -> None:
    tom = "Tom is 12 and his sister is 8. How much older is Tom?"
    tom_swapped = "Tom is 8 and his sister is 12. How much older is his sister?"
    anna = "Anna is 3 years older than Ben. Ben is 9. How old is Anna?"
    moved = "Ben is 9 years old and Anna is 3 years older than him. What is Anna's age?"
    assert swapped(tom, tom_swapped) and swapped("What is 9% of 50?", "What is 50% of 9?")
    assert not swapped(tom, tom)  # the numbers in the same order
    assert not swapped(tom, tom.replace("12", "13"))  # other numbers: a number variant
    assert not swapped(anna, moved)  # a rewording that moves its numbers
    semantic = SemanticDuplicateFilter(None, "-")  # type: ignore[arg-type]
    four, twelve = answer_key(row("", "4")), answer_key(row("", "12"))
    assert semantic.rule(tom_swapped, four, tom, four, 0.98) is None  # both 4, by chance
    assert semantic.rule(moved, twelve, anna, twelve, 0.9) == "same answer, numbers within"


# ---- the semantic filter
def test_semantic_a_different_answer_keeps_a_row_the_same_answer_catches_a_rewording(
        tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", [row(TANK, "40", 0), row(PAGES, "90", 1), row(ESSAY, RUBRIC, 2)],
                 vectors=MINILM)
    assert cosine(TANK, TANK_SECONDS) >= 0.95  # today's rule takes them for one task
    assert 0.6 <= cosine(PAGES, PAGES_REWORDED) < 0.95  # ... and misses this rewording
    assert cosine(ESSAY, ESSAY_AGAIN) >= 0.95
    new = [row(TANK_SECONDS, "2400", 10), row(PAGES_REWORDED, "90", 11),
           row(PAGES_OTHER_NUMBERS, "90", 12), row(ESSAY_AGAIN, RUBRIC, 13)]
    found = details(SemanticDuplicateFilter(store, "ds"), new)
    assert found[0] is None  # 2400 seconds is not 40 minutes: another task
    assert found[1] is not None and "of row 1 of version 0" in found[1]
    assert found[1].endswith("same answer, numbers within")
    assert found[2] is None  # the same answer with other numbers: a number variant
    assert found[3] is not None and found[3].endswith("same numbers; no comparable answer")
    today = details(SemanticDuplicateFilter(store, "ds", answer_gate=False), new)
    assert today[0] is not None and today[1] is None  # what the gate changes
    assert today[3] is not None and today[3].endswith("same numbers")


def test_semantic_rows_of_one_round_meet_each_other_through_the_gate(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", [row(ESSAY, RUBRIC)], vectors=MINILM)
    rows = [row(TANK, "40", 1), row(TANK_SECONDS, "2400", 2), row(PAGES, "90", 3),
            row(PAGES_REWORDED, "90", 4), row(PAGES_OTHER_NUMBERS, "90", 5)]
    out = run_filters(rows, [SemanticDuplicateFilter(store, "ds")])
    assert [r["detail"] for r in out.rejected] == [
        f"semantic duplicate of generated row 2 of this round: cosine "
        f"{cosine(PAGES, PAGES_REWORDED):.3f}, same answer, numbers within"]


def test_semantic_answers_are_read_from_the_compacted_shards_rows(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", [row(ESSAY, RUBRIC)], vectors=MINILM)
    store.append("ds", [row(TANK, "40", 1)], vectors=MINILM, compact=False)
    store.append("ds", [row(PAGES, "90", 2)], vectors=MINILM, compact=False)
    store.compact("ds", full=True)
    assert len(store.state("ds").shards) == 1
    found = details(SemanticDuplicateFilter(store, "ds"),
                    [row(TANK_SECONDS, "2400", 9), row(PAGES_REWORDED, "90", 10)])
    assert found[0] is None and "of row 2 of version 3 (added by version 2)" in (found[1] or "")
    store.restore("ds", 1)  # the pages task is gone from the version read
    assert details(SemanticDuplicateFilter(store, "ds"), [row(PAGES_REWORDED, "90", 10)]) \
        == [None]


# ---- the MinHash filter
def test_minhash_a_different_answer_keeps_a_near_copy(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", [row(LIBRARY.format("films"), "405"), row(ESSAY, RUBRIC)])
    games = LIBRARY.format("games")
    found = details(NearDuplicateFilter(store, "ds"),
                    [row(games, "360", 1), row(games, "405", 2),
                     row(ESSAY + " Be brief.", RUBRIC, 3)])
    assert found[0] is None  # another answer: another task, however alike the words
    assert found[1] is not None and found[1].endswith("same numbers; same answer")
    assert found[2] is not None and found[2].endswith("same numbers; no comparable answer")
    today = details(NearDuplicateFilter(store, "ds", answer_gate=False), [row(games, "360", 1)])
    assert today[0] is not None and today[0].endswith("same numbers")
    within = run_filters([row(games, "360", 1), row(LIBRARY.format("tools"), "999", 2),
                          row(LIBRARY.format("tools"), "360", 3)],
                         [NearDuplicateFilter(store, "ds")])
    assert len(within.rejected) == 1 and "generated row 0" in within.rejected[0]["detail"]


def test_the_config_turns_the_gate_off_and_sets_the_same_answer_threshold(
        tmp_path: Path) -> None:
    cfg = load_config(overrides=["round.semantic_duplicate.enabled=true",
                                 "round.semantic_duplicate.same_answer_threshold=0.7",
                                 "round.near_duplicate.answer_gate=false",
                                 "data.filter_overlong_prompts=false"])
    assert cfg.round.semantic_duplicate.answer_gate is True
    store = Store(tmp_path)
    rec = store.create("ds", [row(TANK, "40")], vectors=MINILM)
    chain = {type(f).__name__: f for f in build_filters(cfg, store, "ds", rec)}
    assert chain["NearDuplicateFilter"].answer_gate is False
    semantic = chain["SemanticDuplicateFilter"]
    assert semantic.answer_gate and semantic.same_answer_threshold == 0.7
    lineage = semantic.lineage()
    assert lineage is not None and lineage["same_answer_threshold"] == 0.7
