"""The near-duplicate filter on real stores: number-aware, within the round, as of the version
read (after a restore, after compaction), on older stores, and with other settings."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from dyngen.cli import app
from dyngen.config import load_config
from dyngen.filters import NearDuplicateFilter, run_filters
from dyngen.filters.chain import build_filters
from dyngen.store import CompactionPolicy, Store, gc
from dyngen.store.index import INDEX_DIR
from dyngen.store.lsh import IndexMismatchError
from dyngen.store.minhash import LshParams, jaccard, numbers, shingles, words
from dyngen.store.retention import live_files

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "near_duplicates.jsonl"
HELD_OUT = FIXTURE.with_name("near_duplicates_heldout.jsonl")
# A long task: one changed word leaves most of its 5-word shingles intact.
STORY = ("A school orchestra is planning its spring concert in the town hall. The orchestra has "
         "{a} violins, {b} cellos and {c} flutes, and every instrument needs one chair on the "
         "stage and one music stand beside it. The hall manager says that the stage can hold "
         "at most {d} chairs and that extra stands can be borrowed from the library next door. "
         "How many chairs are still free on the {day} of the concert?")


def row(text: str, i: int = 0) -> dict[str, Any]:
    return {"data_source": "t", "prompt": [{"role": "system", "content": "Solve it."},
                                           {"role": "user", "content": text}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": "1"},
            "extra_info": {"index": i}}


def story(day: str = "day", **nums: int) -> str:
    return STORY.format(**{"a": 12, "b": 5, "c": 7, "d": 40, **nums}, day=day)


def task(topic: str) -> str:
    return (f"Write a short essay about {topic}, explaining its history, its importance today "
            "and one open question that researchers still study.")


def reasons(store: Store, rows: list[dict[str, Any]], version: int | None = None,
            **kwargs: Any) -> list[str | None]:
    verdicts = NearDuplicateFilter(store, "ds", version, **kwargs).verdicts(rows)
    return [None if v is None else v[1] for v in verdicts]


def test_a_copy_with_one_word_changed_goes_naming_the_row_version_and_similarity(
        tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", [row(task("volcanoes")), row(story())])
    store.append("ds", [row(task("glaciers"))])
    found = reasons(store, [row(story(day="evening")), row(task("glaciers") + " Be brief.")])
    assert found[0] is not None and "row 1 of version 1 (added by version 0)" in found[0]
    assert "row 2 of version 1 (added by version 1)" in (found[1] or "")
    similarity = float(re.search(r"Jaccard similarity ([0-9.]+)", found[0]).group(1))
    expected = jaccard(shingles(words(story()), 5), shingles(words(story(day="evening")), 5))
    assert similarity == pytest.approx(expected, abs=0.005) and similarity >= 0.8
    assert re.search(r"MinHash estimate 0\.\d\d|MinHash estimate 1\.00", found[0])


def test_other_numbers_are_another_task_and_short_prompts_are_left_to_the_exact_filter(
        tmp_path: Path) -> None:
    store = Store(tmp_path)
    short = "What is 3 plus 4 times 2?"
    store.create("ds", [row(story()), row(short)])
    found = reasons(store, [row(story(a=13)), row(story(b=5, d=41)), row(short + " Answer."),
                            row(story(c=7, day="night"))])
    assert found[:3] == [None, None, None]  # numbers differ; fewer than min_words words
    assert found[3] is not None  # the same numbers, one word changed


def test_rows_of_one_round_are_checked_against_each_other(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", [row(task("volcanoes"))])
    rows = [row(task("tides")), row(story()), row(story(day="week")), row(story(a=1)),
            row(task("tides") + " Thanks.")]
    out = run_filters(rows, [NearDuplicateFilter(store, "ds", 0)])
    assert [json.loads(r["row"]) for r in out.rejected] == [rows[2], rows[4]]
    assert "generated row 1 of this round" in out.rejected[0]["detail"]
    assert "generated row 0 of this round" in out.rejected[1]["detail"]


def test_is_in_the_round_chain_after_the_exact_filter_with_the_issue_defaults(
        tmp_path: Path) -> None:
    cfg = load_config(base={"store": {"root": str(tmp_path)}})
    assert dict(cfg.round.near_duplicate) == {"enabled": True, "threshold": 0.8, "num_perm": 128,
                                              "bands": 16, "ngram": 5, "min_words": 10,
                                              "answer_gate": True}
    store = Store(tmp_path)
    rec = store.create("ds", [row(story())])
    names = [type(f).__name__ for f in build_filters(cfg, store, "ds", rec)]
    assert names[names.index("DuplicateFilter") + 1] == "NearDuplicateFilter"
    off = load_config(overrides=["round.near_duplicate.enabled=false"],
                      base={"store": {"root": str(tmp_path)}})
    assert "NearDuplicateFilter" not in [type(f).__name__
                                         for f in build_filters(off, store, "ds", rec)]


def test_a_restore_checks_against_exactly_the_restored_rows(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", [row(task("volcanoes"))])
    store.append("ds", [row(story())])
    store.restore("ds", 0)  # version 2: the rows of version 0
    near_story, near_task = row(story(day="evening")), row(task("volcanoes") + " Be brief.")
    assert reasons(store, [near_story, near_task], 2)[0] is None
    assert "row 0 of version 2" in (reasons(store, [near_story, near_task], 2)[1] or "")
    assert reasons(store, [near_story], 1)[0] is not None  # version 1 still holds the story


def test_after_compaction_the_merged_sidecar_finds_every_row_at_its_place(
        tmp_path: Path) -> None:
    store = Store(tmp_path)
    topics = ["volcanoes", "tides", "glaciers", "deserts", "rivers", "comets", "coral reefs"]
    store.create("ds", [row(task(topics[0]))])
    for t in topics[1:]:
        store.append("ds", [row(task(t))])
    made = store.compact("ds", CompactionPolicy(max_small_shards=2, fan_in=2), full=True)
    head = store.state("ds")
    assert made and len(head.shards) == 1 and head.shards[0].lsh is not None
    found = reasons(store, [row(task(t) + " Thanks.") for t in topics], head.version)
    assert [f"row {i} of version {head.version} (added by version {i})" in (f or "")
            for i, f in enumerate(found)] == [True] * len(topics)


def test_an_older_store_is_indexed_once_then_gc_follows_its_shards(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", [row(story())], index=None)  # as a store from before sidecars
    store.append("ds", [row(task("tides"))], index=None)
    assert store.head("ds").shards[0].lsh is None
    assert reasons(store, [row(story(day="evening"))])[0] is not None
    derived = sorted((tmp_path / "ds" / INDEX_DIR).iterdir())
    assert len(derived) == 2
    stamps = [p.stat().st_mtime_ns for p in derived]
    assert reasons(store, [row(task("tides") + " Thanks.")])[0] is not None
    assert [p.stat().st_mtime_ns for p in sorted(derived)] == stamps  # not hashed again
    store.compact("ds", full=True)  # merges the derived sidecars into the new shard's own
    assert store.head("ds").shards[0].lsh is not None
    store.vacuum("ds", keep_versions=1, grace_seconds=0)
    assert not list((tmp_path / "ds" / INDEX_DIR).iterdir())  # their shards are gone
    kept = live_files(store, "ds", store.state("ds").expired_before)
    gc(store, "ds", grace_seconds=0)
    assert all(f in kept for f in store.head("ds").shards[0].files)


def test_other_settings_are_refused_until_the_index_is_rebuilt(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.create("ds", [row(story())])
    with pytest.raises(IndexMismatchError, match="ngram.*rebuild-index NAME"):
        reasons(store, [row(story(day="evening"))], params=LshParams(ngram=3))
    config = tmp_path / "c.yaml"
    config.write_text("round: {near_duplicate: {ngram: 3}}\n")
    result = CliRunner().invoke(app, ["--root", str(store.root), "--config", str(config),
                                      "rebuild-index", "ds"])
    assert result.exit_code == 0, result.output
    assert "1 shard(s) indexed" in result.stdout
    found = reasons(Store(store.root), [row(story(day="evening"))], params=LshParams(ngram=3))
    assert found[0] is not None  # compared with hashes made the same way
    assert reasons(store, [row(story(day="evening"))])[0] is not None  # the own ones still serve


def fixture_pairs(path: Path = FIXTURE) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def rejected_share(tmp_path: Path, kind: str, ngram: int,
                   path: Path = FIXTURE) -> tuple[float, float]:
    """Share of the fixture's `kind` pairs whose b is rejected against a store holding the
    a's, and the share the rule itself (exact Jaccard, same numbers) rejects."""
    pairs = [p for p in fixture_pairs(path) if p["kind"] == kind]
    store = Store(tmp_path / f"{kind}-{ngram}")
    params = LshParams(ngram=ngram)
    store.create("ds", [row(p["a"], i) for i, p in enumerate(pairs)], index=params)
    found = reasons(store, [row(p["b"], i) for i, p in enumerate(pairs)], params=params)
    for i, detail in enumerate(found):
        if detail is not None and "this round" not in detail:
            assert f"near-duplicate of row {i} of version 0" in detail  # its own pair
    rule = [jaccard(shingles(words(p["a"]), ngram), shingles(words(p["b"]), ngram)) >= 0.8
            and numbers(p["a"]) == numbers(p["b"]) for p in pairs]
    return float(np.mean([f is not None for f in found])), float(np.mean(rule))


@pytest.mark.parametrize("ngram", [5, 1])
def test_fixture_precision_and_recall_at_the_default_threshold(tmp_path: Path,
                                                               ngram: int) -> None:
    pairs = fixture_pairs()
    assert len(pairs) >= 200
    shares = {kind: rejected_share(tmp_path, kind, ngram)
              for kind in ("paraphrase", "numbers", "different")}
    print(f"\nngram {ngram}: rejected " + ", ".join(
        f"{k} {got:.1%} (rule {rule:.1%})" for k, (got, rule) in shares.items()))
    assert shares["numbers"][0] == 0.0  # a number-only variant is never rejected
    assert shares["different"][0] <= 0.0125  # at most one of the 80
    got, rule = shares["paraphrase"]
    assert got <= rule and got >= rule - 0.05  # LSH finds nearly all the rule would reject
    # What the defaults can do on prompts of ~20 words (README: Filters): 5-word shingles
    # change 5 at a time, so one reworded word costs a 20-word prompt about half of them.
    assert rule < 0.1 if ngram == 5 else rule > 0.7


def test_held_out_pairs_at_the_defaults(tmp_path: Path) -> None:
    """Pairs written without seeing the filter: a number-only variant is never rejected, and
    few different tasks are (the README's table: 3 of 50, long instructions one word
    apart)."""
    shares = {kind: rejected_share(tmp_path, kind, 5, HELD_OUT)[0]
              for kind in ("numbers", "different")}
    assert shares["numbers"] == 0.0
    assert shares["different"] <= 0.06


def test_a_failed_shard_write_leaves_no_keys_or_sidecar(tmp_path: Path) -> None:
    """A shard write that fails (here: over the file size limit, as on a full disk) removes
    the shard's own files written before it."""
    import subprocess
    import sys

    code = """
import resource, signal, sys
from dyngen.store import Store
from tests.filters.test_near_duplicate import row, story
store = Store(sys.argv[1])
store.create("ds", [row(story())])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not death, past the limit
resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, 60_000))
try:
    store.append("ds", [row(story(a=i) + " pad" * 400, i) for i in range(40)])
except OSError as exc:
    print("failed:", exc.strerror)
"""
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=repo, text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(repo)},
                          timeout=120)
    assert "failed: File too large" in proc.stdout, proc.stderr[-2000:]
    store = Store(tmp_path)
    on_disk = {f"data/{p.name}" for p in (tmp_path / "ds" / "data").iterdir()}
    assert on_disk == set(store.head("ds").shards[0].files)  # only version 0's


def test_settings_that_cannot_band_are_refused_by_the_config() -> None:
    from dyngen.errors import ConfigError

    with pytest.raises(ConfigError, match="num_perm: expected a multiple of"):
        load_config(overrides=["round.near_duplicate.num_perm=100"])
    with pytest.raises(ConfigError, match="threshold: expected a number in"):
        load_config(overrides=["round.near_duplicate.threshold=1.5"])
