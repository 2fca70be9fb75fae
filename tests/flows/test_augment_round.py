"""Augmentation through the round's flow: the rows a batch's rollouts failed are renumbered,
the filters keep the variants, a bad template is quarantined with its reason, skips are
counted; then the docs' own Augmenter augments a variant, and `dyngen show --row` traces
that row back through both rounds to the row it came from."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dyngen.cli import app
from dyngen.store import Store
from dyngen.store.minhash import jaccard, shingles, words
from tests.docs_blocks import DOCS, blocks

pytestmark = pytest.mark.usefixtures("prefect_server")

TEMPLATE = "Ana packs {a} boxes of {b} apples each and eats {c}. How many apples are left?"
# One number in many words: a renumbered copy shares most shingles with its source, so only
# the near-duplicate filter's number check tells them apart.
LONG = ("The school library lends books to every class in the building, and each class may "
        "keep the books it borrows for two whole weeks before the librarian comes round to "
        "ask for them back, stamps each card, and puts every book on its shelf again in the "
        "right order by author; this week every class borrowed {a} books from the library "
        "and read them all. If there are three classes, how many books were borrowed?")


def row(i: int, question: str, truth: str, **extra: Any) -> dict[str, Any]:
    return {"data_source": "stories", "ability": "math",
            "prompt": [{"role": "user", "content": question}],
            "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": {"index": i, "template": None, "answer": None, **extra}}


def story(i: int, a: int, b: int, c: int) -> dict[str, Any]:
    return row(i, TEMPLATE.format(a=a, b=b, c=c), str(a * b - c), template=TEMPLATE,
               answer="a * b - c")


def rollouts(path: Path, scored: list[tuple[dict[str, Any], float]]) -> Path:
    path.write_text("".join(json.dumps({"prompt": r["prompt"], "score": s}) + "\n"
                            for r, s in scored))
    return path


def config(store: Store, folder: Path, **datagen: Any) -> dict[str, Any]:
    return {"store": {"root": str(store.root)},
            "data": {"filter_overlong_prompts": False, "datagen": datagen},
            "round": {"retries": 0, "rollouts_dirs": [str(folder)]}}


def test_a_round_augments_the_rows_the_rollouts_failed(tmp_path: Path) -> None:
    from dyngen.flows.generation_round import generation_round

    store = Store(tmp_path / "store")
    broken = story(6, 3, 4, 1)
    broken["extra_info"]["template"] = "Ana packs {a} boxes of {b apples."
    rows = [story(0, 4, 12, 5), story(1, 7, 30, 9), story(2, 2, 10, 3),
            row(3, "What is 23 + 45?", "68"), row(4, "What is 61 + 17?", "78"),
            row(5, "What is 3 + 4?", "7"), broken, row(7, "Name a prime number.", "2"),
            row(8, LONG.format(a=14), "42", template=LONG, answer="a * 3")]
    store.create("stories", rows)
    failed = [(rows[i], 0.0) for i in (0, 1, 3, 4, 6, 7, 8)] + [(rows[2], 1.0), (rows[5], 1.0)]
    batch = rollouts(tmp_path / "step-1.jsonl", failed)
    # Through `dyngen round`, as the docs page runs it: the round says what it skipped.
    out = CliRunner(env={"COLUMNS": "200"}).invoke(app, [
        "--root", str(store.root), "round", "stories",
        "data.datagen.path=pkg://dyngen.generators.augment",
        "data.datagen.name=RenumberAugmenter", "+data.datagen.rows_per_round=8",
        "data.filter_overlong_prompts=false", "round.retries=0", "--rollouts", str(batch),
        "--step", "1"])
    assert out.exit_code == 0, out.output
    # Five rows with a program failed; the near-duplicate filter keeps the renumbered
    # stories (other numbers); the broken template is quarantined, the prime skipped.
    assert "kept 5 of 5, rejected {'bad_template': 1}" in out.output, out.output
    assert "skipped 1 source rows the generator cannot apply to: {'no_program': 1}" \
        in out.output
    head = store.load("stories")
    added = head.select(range(len(rows), len(head))).to_list()
    assert sorted(r["extra_info"]["augmented_from"]["index"] for r in added) == [0, 1, 3, 4, 8]
    long = next(r for r in added if r["extra_info"]["augmented_from"]["index"] == 8)
    assert jaccard(*(shingles(words(x["prompt"][0]["content"]), 5) for x in (long, rows[8]))
                   ) >= 0.8  # as near as a duplicate, but for its number
    assert {r["extra_info"]["augmented_from"]["version"] for r in added} == {0}
    quarantined = store.load_rejected("stories", 1).to_list()
    assert [q["reason"] for q in quarantined] == ["bad_template"]
    assert "row 6 of version 0" in quarantined[0]["detail"]
    stats = store.head("stories").lineage["generator"]["stats"]
    assert stats["skipped"] == 1 and stats["methods"]["renumber"]["skipped"] == {
        "no_program": 1}

    # Round 2: the docs' own Augmenter, on the renumbered sum the next batch failed.
    (tmp_path / "backward.py").write_text(
        next(b.code for b in blocks(DOCS / "generators" / "augment.md")
             if b.title == "backward.py"))
    variant = next(i for i, r in enumerate(added, len(rows))
                   if r["extra_info"]["augmented_from"]["index"] == 3)
    batch = rollouts(tmp_path / "step-2.jsonl", [(head[variant], 0.0)])
    result = generation_round(
        "stories", config(store, tmp_path, path=str(tmp_path / "backward.py"),
                          name="Backward", rows_per_round=1),
        {"event_id": "batch-2", "step": 2, "rollouts": str(batch)})
    assert result["counts"]["kept"] == 1 and result["version"] == 2
    newest = result["rows"] - 1

    out = CliRunner(env={"COLUMNS": "200"}).invoke(
        app, ["--root", str(store.root), "show", "stories", "--row", str(newest), "--json"])
    assert out.exit_code == 0, out.output
    steps = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(s["version"], s["index"], s["method"]) for s in steps] == [
        (2, newest, "backward"), (1, variant, "renumber"), (0, 3, None)]
    assert steps[-1]["row"]["prompt"] == rows[3]["prompt"]
    a, b = (int(n) for n in re.findall(r"\d+", steps[1]["row"]["prompt"][-1]["content"]))
    assert steps[0]["row"]["prompt"][-1]["content"].startswith(f"{a} plus a number is {a + b}.")
    assert steps[0]["row"]["reward_model"]["ground_truth"] == str(b)
    table = CliRunner(env={"COLUMNS": "200"}).invoke(
        app, ["--root", str(store.root), "show", "stories", "--row", str(newest)])
    assert "made from 2 source rows" in table.stdout and "What is 23 + 45?" in table.stdout
