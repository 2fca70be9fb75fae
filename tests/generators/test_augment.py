"""The Augmenter base and `renumber`: which rows are chosen, every label recomputed from the
variant's own text, provenance on each row, bad templates quarantined, skips counted."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import datasets
import pytest

from dyngen.errors import ConfigError
from dyngen.generators.arithmetic import arithmetic_task
from dyngen.generators.augment import Augmenter, NotApplicable, RenumberAugmenter
from dyngen.round import RoundContext, Trigger, call_generator
from dyngen.round.rollouts import RolloutsPolicy
from tests.generators.contract import GeneratorContract

TEMPLATE = "Ana packs {a} boxes of {b} apples each and eats {c}. How many apples are left?"


def template_row(i: int, a: int, b: int, c: int, **extra: Any) -> dict[str, Any]:
    return {"data_source": "stories", "ability": "math",
            "prompt": [{"role": "user", "content": TEMPLATE.format(a=a, b=b, c=c)}],
            "reward_model": {"style": "rule", "ground_truth": str(a * b - c)},
            "extra_info": {"index": i, "template": TEMPLATE, "answer": "a * b - c", **extra}}


def arithmetic_rows(n: int) -> list[dict[str, Any]]:
    rows = [arithmetic_task(random.Random(i), i, 1 + i % 8) for i in range(n)]
    for r in rows:
        r["extra_info"].update(template=None, answer=None)
    return rows


def dataset(rows: list[dict[str, Any]]) -> datasets.Dataset:
    return datasets.Dataset.from_list(rows)


def question(row: dict[str, Any]) -> str:
    return row["prompt"][-1]["content"]


class TestRenumberAugmenter(GeneratorContract):
    def make_generator(self) -> RenumberAugmenter:
        return RenumberAugmenter({"select": "random", "rows_per_round": 3})

    @pytest.fixture
    def seed_dataset(self) -> datasets.Dataset:
        return dataset(arithmetic_rows(6))


def test_every_renumbered_label_is_what_the_new_numbers_give() -> None:
    rows = arithmetic_rows(16) + [template_row(16 + i, 3 + i, 12, 5) for i in range(4)]
    gen = RenumberAugmenter({"select": "random", "rows_per_round": 20})
    new = gen.generate(dataset(rows)).to_list()
    assert len(new) == 20 and gen.stats["kept"] == 20
    for row in new:
        source = rows[row["extra_info"]["augmented_from"]["index"]]
        assert row["extra_info"]["augmented_from"]["method"] == "renumber"
        assert question(row) != question(source)
        if row["data_source"] == "stories":  # read the numbers back, compute a * b - c
            a, b, c = map(int, re.findall(r"\d+", question(row)))
            assert row["reward_model"]["ground_truth"] == str(a * b - c)
            assert a * b - c > 0  # a step that was positive stays so
        else:  # digits and + - * only; as many digits per number as the source had
            expression = question(row).removeprefix("What is ").rstrip("?")
            assert int(row["reward_model"]["ground_truth"]) == eval(  # noqa: S307
                expression, {"__builtins__": {}})
            sizes = [len(n) for n in re.findall(r"\d+", question(source))]
            assert [len(n) for n in re.findall(r"\d+", expression)] == sizes


def test_variants_per_row_makes_that_many_different_rows_from_each_source() -> None:
    """8 sources, variants_per_row=3: 24 rows, three different questions from each source,
    each with its own label (once, one row a source whatever the setting)."""
    rows = arithmetic_rows(8)
    gen = RenumberAugmenter({"select": "random", "rows_per_round": 100, "variants_per_row": 3})
    new = gen.generate(dataset(rows)).to_list()
    assert len(new) == 24 and gen.stats["kept"] == 24
    by_source: dict[int, list[str]] = {}
    for row in new:
        by_source.setdefault(row["extra_info"]["augmented_from"]["index"], []).append(
            question(row))
        expression = question(row).removeprefix("What is ").rstrip("?")
        assert int(row["reward_model"]["ground_truth"]) == eval(  # noqa: S307
            expression, {"__builtins__": {}})
    assert sorted(by_source) == list(range(8))
    for index, questions in by_source.items():
        assert len(set(questions)) == 3 and question(rows[index]) not in questions
    capped = RenumberAugmenter({"select": "random", "rows_per_round": 10, "variants_per_row": 3})
    assert len(capped.generate(dataset(rows))) == 10  # rows_per_round still caps the round


class Once(Augmenter):
    """A method with one possible variant a source: asked again, it makes the same row."""

    method = "once"

    def augment(self, row: dict[str, Any], context: Any) -> list[dict[str, Any]]:
        return [{**row, "prompt": [{"role": "user", "content": question(row) + " Once."}]}]


def test_a_method_with_fewer_variants_than_asked_gives_each_once() -> None:
    gen = Once({"select": "random", "rows_per_round": 20, "variants_per_row": 4})
    new = gen.generate(dataset(arithmetic_rows(3))).to_list()
    assert sorted(question(r) for r in new) == sorted(
        question(r) + " Once." for r in arithmetic_rows(3))


def test_proposer_rows_are_renumbered_by_the_one_formula_their_label_fits() -> None:
    word = {"data_source": "dyngen-proposer", "ability": "math",
            "prompt": [{"role": "user", "content": "A box holds 24 pencils. How many pencils "
                                                   "are in 6 boxes?"}],
            "reward_model": {"style": "rule", "ground_truth": "144"},
            "extra_info": {"index": 0, "method": "renumbered"}}
    voted = {**word, "extra_info": {"index": 1, "method": "model"}}
    gen = RenumberAugmenter({"select": "random", "rows_per_round": 2})
    new = gen.generate(dataset([word, voted])).to_list()
    assert len(new) == 1
    boxes, per = (int(n) for n in re.findall(r"\d+", question(new[0])))
    assert new[0]["reward_model"]["ground_truth"] == str(boxes * per) != "144"
    # A row whose label only a solver's vote backs has no program to renumber.
    assert gen.stats["methods"]["renumber"]["skipped"] == {"label_unproved": 1}


def test_a_template_that_does_not_parse_quarantines_its_row_with_the_reason() -> None:
    broken = template_row(1, 4, 5, 2)
    broken["extra_info"]["template"] = "Ana packs {a boxes of {b} apples each."
    wrong = template_row(2, 4, 5, 2, )
    wrong["extra_info"]["answer"] = "a + b - c"  # not what the label is
    plain = {**template_row(3, 1, 2, 0), "extra_info": {"index": 3, "template": None,
                                                        "answer": None}}
    plain["prompt"] = [{"role": "user", "content": "Name a prime number."}]
    rows = [template_row(0, 4, 5, 2), broken, wrong, plain]
    gen = RenumberAugmenter({"select": "random", "rows_per_round": 4})
    context = RoundContext("stories", 5, 4, Trigger())
    batch = call_generator(gen, dataset(rows), context)
    assert len(batch) == 1  # only the good row made a variant
    reasons = {json.loads(q["row"])["extra_info"]["index"]: (q["reason"], q["detail"])
               for q in batch.quarantined}
    assert reasons[1][0] == reasons[2][0] == "bad_template"
    assert "row 1 of version 4" in reasons[1][1] and "does not parse" in reasons[1][1]
    assert "gives 7 at the row's numbers; its label is '18'" in reasons[2][1]
    stats = gen.stats["methods"]["renumber"]
    assert stats["skipped"] == {"no_program": 1} and gen.stats["skipped"] == 1
    assert stats["rejected"] == {"bad_template": 2} and stats["bad_sources"] == 2


def test_failed_takes_the_rows_the_rollouts_scored_lowest(tmp_path: Path) -> None:
    rows = arithmetic_rows(8)
    scores = {1: 0.0, 4: 0.25, 6: 0.5, 0: 1.0}
    lines = [{"prompt": rows[i]["prompt"], "score": s} for i, s in scores.items()]
    lines.append({"prompt": rows[4]["prompt"], "score": 0.75})  # row 4's mean: 0.5
    lines.append({"prompt": [{"role": "user", "content": "not in the dataset"}], "score": 0})
    path = tmp_path / "batch.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    context = RoundContext("ds", 3, 2, Trigger(rollouts=str(path)),
                           rollouts_policy=RolloutsPolicy((str(tmp_path),)))
    gen = RenumberAugmenter({"select": "failed", "rows_per_round": 2})
    new = gen.generate(dataset(rows), context).to_list()
    assert [r["extra_info"]["augmented_from"] for r in new] == [
        {"version": 2, "index": 1, "method": "renumber"},
        {"version": 2, "index": 4, "method": "renumber"}]  # 6 ties 4 at 0.5: the earlier line
    assert [r["extra_info"]["index"] for r in new] == [8, 9]
    assert gen.stats["select"] == {"how": "failed", "rollouts": 6, "prompts": 5, "failed": 4,
                                   "not_in_dataset": 1}
    # Without rollouts nothing failed: no rows, and the stats say why.
    none = RenumberAugmenter({"select": "failed"})
    assert len(none.generate(dataset(rows), RoundContext("ds", 3, 2, Trigger()))) == 0
    assert "no rollouts" in none.stats["select"]["note"]


def test_band_takes_the_rows_whose_measured_solve_rate_is_inside_it() -> None:
    rows = arithmetic_rows(6)
    rates = [None, (1, 8), (4, 8), (8, 8), (2, 8), (0, 8)]
    for row, rate in zip(rows, rates, strict=True):
        row["extra_info"]["solve_rate"] = None if rate is None else {
            "passed": rate[0], "samples": rate[1], "model": "p", "version": "p"}
    gen = RenumberAugmenter({"select": "band", "band": [0.1, 0.5], "rows_per_round": 8})
    new = gen.generate(dataset(rows)).to_list()
    assert [r["extra_info"]["augmented_from"]["index"] for r in new] == [1, 4, 2]
    assert all(r["extra_info"]["solve_rate"] is None for r in new)  # not measured yet
    assert gen.stats["select"]["measured"] == 5


@pytest.mark.parametrize(("key", "value"), [("select", "worst"), ("band", [0.6, 0.2]),
                                            ("rows_per_round", 0)])
def test_settings_out_of_range_are_refused(key: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"data.datagen.{key}"):
        RenumberAugmenter({key: value}).settings()


class Doubler(Augmenter):
    """A user's augmenter whose check refuses what it makes half of the time."""

    method = "doubled"

    def augment(self, row: dict[str, Any], context: Any) -> list[dict[str, Any]]:
        if "+" not in question(row):
            raise NotApplicable("no_sum")
        new = {**row, "prompt": [{"role": "user", "content": question(row) + " Twice."}]}
        return [new, "not a row"]

    def check(self, source: dict[str, Any], variant: dict[str, Any], context: Any) -> Any:
        return None if context.index % 2 == 0 else ("odd_row", f"row {context.index}")


def test_a_users_augmenter_gets_shape_and_label_checks_and_provenance() -> None:
    rows = [arithmetic_task(random.Random(i), i, 1) for i in range(4)]  # a + b
    rows.append({**rows[0], "prompt": [{"role": "user", "content": "What is 2 * 3?"}]})
    gen = Doubler({"select": "random", "rows_per_round": 10, "variants_per_row": 2})
    batch = call_generator(gen, dataset(rows), RoundContext("ds", 1, 0, Trigger()))
    assert sorted(r["extra_info"]["augmented_from"]["index"] for r in batch) == [0, 2]
    reasons = sorted(q["reason"] for q in batch.quarantined)
    assert reasons == ["bad_variant"] * 4 + ["odd_row"] * 2
    assert gen.stats["methods"]["doubled"]["rejected"] == {"bad_variant": 4, "odd_row": 2}
    assert gen.stats["methods"]["doubled"]["skipped"] == {"no_sum": 1}


def test_partitions_keep_every_row_their_generators_refused() -> None:
    from dyngen.round.partitions import union_rows
    from dyngen.rows import RowBatch

    refused = [{"reason": "bad_template", "detail": "d", "row": "{}"}]
    merged = union_rows([RowBatch([{"a": 1}], refused), RowBatch([{"a": 2}], refused * 2)])
    assert len(merged) == 2 and [q["reason"] for q in merged.quarantined] == ["bad_template"] * 3
