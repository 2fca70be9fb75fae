"""The difficulty record as rounds keep it, on a real store: what a round observes goes into
its version (a file named by its content, never rewritten), reading version N folds the
observations up to N, retirement and revival are recorded with their evidence and undone
only by a later version, and a broken reward is warned about once before anything retires.
A fresh Store object reads each version back, as another process would."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dyngen.difficulty.observe import DifficultySettings, round_difficulty
from dyngen.difficulty.record import FOLDER, LINEAGE_KEY, DifficultyBook
from dyngen.round.context import RoundContext, Trigger
from dyngen.round.inbox import pending_batch_ends
from dyngen.round.rollouts import RolloutsPolicy
from dyngen.store import Store
from dyngen.store.keys import prompt_key
from tests.rows import verl_row, verl_rows

SETTINGS = DifficultySettings(retire_min_samples=16, retire_window_steps=8,
                              broken_reward_min_groups=4)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "store")
    store.create("ds", verl_rows(6, source="sums"))
    return store


def group(step: int, row: int, passed: int, samples: int = 8, source: str = "sums"
          ) -> list[dict[str, Any]]:
    """A trainer's group of `samples` completions of row `row`, `passed` of them right."""
    prompt = verl_row(row, source)["prompt"]
    return [{"prompt": prompt, "score": 1.0 if i < passed else 0.0} for i in range(samples)]


def round_at(store: Store, step: int, groups: list[list[dict[str, Any]]],
             kept: list[dict[str, Any]] = (), metrics: dict[str, float] | None = None
             ) -> dict[str, Any] | None:
    """A batch end at `step` written into the inbox, then one round's difficulty entry over
    what is pending, committed with `kept` (another row when none)."""
    store.write_batch_end("ds", "run", step, metrics or {},
                          [r for g in groups for r in g] or None)
    parent = store.head("ds")
    ends = pending_batch_ends(store, "ds", parent.version, RolloutsPolicy())
    context = RoundContext("ds", parent.version + 1, parent.version, Trigger(step=step),
                           batch_ends=ends)
    entry = round_difficulty(store, SETTINGS, context, parent, list(kept), None)
    store.append("ds", list(kept) or verl_rows(1, start=100 + step),
                 covers=[e.key for e in ends], lineage={LINEAGE_KEY: entry} if entry else {})
    return entry


def fresh_book(store: Store, version: int | None = None) -> DifficultyBook:
    again = Store(store.root)  # another process's view
    return DifficultyBook.at(again, "ds", again.head_version("ds") if version is None
                             else version)


def test_a_rounds_observations_are_part_of_its_version_and_fold_up_to_each_version(
        store: Store) -> None:
    first = round_at(store, 2, [group(2, 0, 3), group(2, 1, 8)])
    assert first is not None and first["observations"]["count"] == 2
    assert first["observations"]["path"].startswith(f"{FOLDER}/")
    round_at(store, 4, [group(4, 0, 5)])
    k0 = prompt_key(verl_row(0, "sums")["prompt"])
    at1, at2 = fresh_book(store, 1), fresh_book(store)
    assert [(e.step, e.passed, e.samples) for e in at1.evidence[k0]] == [(2, 3, 8)]
    assert [(e.step, e.passed) for e in at2.evidence[k0]] == [(2, 3), (4, 5)]
    assert at2.now == 4 and at2.estimate(k0, 4).samples == 16
    assert fresh_book(store, 0).evidence == {}  # version 0 observed nothing


def test_rollouts_of_prompts_that_are_no_row_are_not_observations(store: Store) -> None:
    stranger = [{"prompt": [{"role": "user", "content": "not in the dataset"}], "score": 1.0}
                for _ in range(4)]
    assert round_at(store, 1, [stranger]) is None
    assert fresh_book(store).evidence == {}


def test_the_bands_measurement_of_a_kept_row_is_its_first_observation(store: Store) -> None:
    row = verl_row(50, "sums")
    row["extra_info"] = {**row["extra_info"], "solve_rate": {
        "passed": 3, "samples": 8, "model": "m", "version": "m"}}
    entry = round_at(store, 3, [], kept=[row])
    assert entry is not None
    book = fresh_book(store)
    [e] = book.evidence[prompt_key(row["prompt"])]
    assert (e.step, e.passed, e.samples) == (3, 3, 8)
    assert book.band[prompt_key(row["prompt"])] == e


def test_a_row_always_right_is_retired_with_its_evidence_and_a_later_version_can_revive(
        store: Store) -> None:
    k1, k2 = (prompt_key(verl_row(i, "sums")["prompt"]) for i in (1, 2))
    assert round_at(store, 2, [group(2, 1, 8), group(2, 2, 0), group(2, 3, 4)])["retired"] == []
    entry = round_at(store, 4, [group(4, 1, 8), group(4, 2, 0), group(4, 3, 4)])
    retired = {r["key"]: r for r in entry["retired"]}
    assert set(retired) == {f"{k1:016x}", f"{k2:016x}"}  # 16 of 16 right; 0 of 16
    assert (retired[f"{k1:016x}"]["why"], retired[f"{k1:016x}"]["samples"]) == ("all_right", 16)
    assert retired[f"{k2:016x}"]["why"] == "all_wrong"
    book = fresh_book(store)
    assert set(book.retired) == {k1, k2}
    assert set(fresh_book(store, book.version - 1).retired) == set()  # restorable by version
    # The rows stay stored: the version's rows are every row, retired or not.
    assert len(Store(store.root).load("ds")) == 8
    # The source's pass rate rises (rows 3 and 4 now mostly right): the too-hard row returns.
    entry = round_at(store, 6, [group(6, 3, 8), group(6, 4, 7), group(6, 5, 8)])
    assert [r["key"] for r in entry["revived"]] == [f"{k2:016x}"]
    book = fresh_book(store)
    assert k1 in book.retired and k2 not in book.retired


def test_a_broken_reward_is_warned_about_once_and_retires_nothing_as_too_hard(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="dyngen")
    metrics = {"rewards/format_reward/mean": 0.0}
    wrong = [group(2, i, 0) for i in range(5)]
    first = round_at(store, 2, wrong, metrics=metrics)
    [warning] = first["warnings"]
    assert (warning["source"], warning["rewards"], warning["all_wrong"]) == (
        "sums", ["format_reward"], 5)
    assert "'sums'" in caplog.text and "format_reward" in caplog.text
    caplog.clear()
    second = round_at(store, 4, [group(4, i, 0) for i in range(5)], metrics=metrics)
    assert second["warnings"] == [] and "format_reward" not in caplog.text  # once
    assert second["retired"] == []  # 16 of 16 wrong, but the reward is suspect
    assert fresh_book(store).warned == {"sums"}


def test_dyngen_show_gives_each_rows_difficulty_as_of_the_version(store: Store) -> None:
    import json

    from typer.testing import CliRunner

    from dyngen.cli import app

    round_at(store, 2, [group(2, 0, 3), group(2, 1, 8)])
    round_at(store, 4, [group(4, 1, 8)])
    runner = CliRunner()
    out = runner.invoke(app, ["--root", str(store.root), "show", "ds", "--json"])
    assert out.exit_code == 0, out.output
    shown = [json.loads(line)["_dyngen_difficulty"] for line in out.output.splitlines()]
    w = 0.5 ** (2 / 4)  # step 2's evidence, two steps before the newest (4): half-life 4
    assert shown[0] == {"pass_rate": round((1 + 3 * w) / (2 + 8 * w), 4), "samples": 8,
                        "last_step": 2, "retired": None}
    assert shown[1]["retired"] == "all_right" and shown[1]["samples"] == 16
    assert shown[2] is None  # never observed
    older = runner.invoke(app, ["--root", str(store.root), "show", "ds", "--version", "1",
                                "--json"])
    assert json.loads(older.output.splitlines()[1])["_dyngen_difficulty"]["retired"] is None
    table = runner.invoke(app, ["--root", str(store.root), "show", "ds"])
    assert "retired (all_right)" in table.output and "p≈0.41 n=8 @2" in table.output


@pytest.mark.parametrize(("override", "says"), [
    ("round.difficulty.half_life_steps=0", "half_life_steps: expected a number of steps > 0"),
    ("round.difficulty.retire_min_samples=0", "retire_min_samples: expected an integer >= 1"),
    ("round.difficulty.broken_reward_share=1.5", "broken_reward_share: expected a share"),
])
def test_bad_difficulty_settings_are_refused_saying_what_to_set(override: str,
                                                                 says: str) -> None:
    from dyngen.config import load_config
    from dyngen.errors import ConfigError

    with pytest.raises(ConfigError, match=says):
        load_config(overrides=[override])
    cfg = load_config(overrides=["round.difficulty.retire_window_steps=3"])
    assert DifficultySettings.from_config(cfg).retire_window_steps == 3


def test_the_report_shows_the_heads_difficulty_record(store: Store, tmp_path: Path) -> None:
    from dyngen.report import report_html

    assert "No round recorded an observation" in report_html(store, "ds")
    round_at(store, 2, [group(2, 0, 3), group(2, 1, 8)])
    round_at(store, 4, [group(4, 1, 8), group(4, 2, 4)])
    page = report_html(Store(store.root), "ds")
    section = page.split('<section id="difficulty">')[1].split("</section>")[0]
    assert "3 row(s) observed; 1 retired as always right, 0 as never right" in section
    assert "newest step observed: 4" in section


def test_a_triggers_own_rollouts_file_is_observed_at_its_step(store: Store,
                                                              tmp_path: Path) -> None:
    import json

    path = tmp_path / "rollouts" / "step-5.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(r) + "\n" for r in group(5, 2, 6)))
    parent = store.head("ds")
    context = RoundContext("ds", parent.version + 1, parent.version,
                           Trigger(step=5, rollouts=str(path)),
                           rollouts_policy=RolloutsPolicy((str(path.parent),)))
    entry = round_difficulty(store, SETTINGS, context, parent, [], None)
    store.append("ds", verl_rows(1, start=500), lineage={LINEAGE_KEY: entry})
    [e] = fresh_book(store).evidence[prompt_key(verl_row(2, "sums")["prompt"])]
    assert (e.step, e.passed, e.samples) == (5, 6, 8)
    # A file outside the allowed folders is not observed, and the round goes on.
    outside = RoundContext("ds", 2, 1, Trigger(step=6, rollouts=str(path)))
    assert round_difficulty(store, SETTINGS, outside, store.head("ds"), [], None) is None


def folded(store: Store, version: int) -> DifficultyBook:
    """Every version's entry folded from version 0, snapshots ignored."""
    book = DifficultyBook()
    book.advance(Store(store.root), "ds", version)
    return book


def same_book(a: DifficultyBook, b: DifficultyBook) -> bool:
    fields = ("evidence", "sources", "band", "retired", "warned", "now", "version")
    return all(getattr(a, f) == getattr(b, f) for f in fields)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rounds=st.lists(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 8)), max_size=4),
                       min_size=1, max_size=9),
       every=st.integers(1, 3))
def test_a_book_read_from_a_snapshot_is_the_book_folded_from_the_start(
        rounds: list[list[tuple[int, int]]], every: int, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """Rounds write a snapshot of the whole book every `every` versions; reading any version
    from its newest snapshot gives what folding every version from 0 gives: observations,
    sources, band measurements, retirements and revivals, warnings."""
    import tempfile

    import dyngen.difficulty.observe as observe

    monkeypatch.setattr(observe, "SNAPSHOT_EVERY", every)
    with tempfile.TemporaryDirectory() as folder:
        store = Store(Path(folder) / "store")
        store.create("ds", verl_rows(6, source="sums"))
        for i, groups in enumerate(rounds):
            step = 2 * (i + 1)
            round_at(store, step, [group(step, row, passed) for row, passed in groups],
                     kept=[verl_row(200 + i, "sums")])
        head = store.head_version("ds")
        entries = {v: store.record("ds", v).lineage.get(LINEAGE_KEY) for v in range(head + 1)}
        snapshots = [v for v, entry in entries.items() if entry and entry.get("snapshot")]
        # The first round that records anything at version >= every - 1 writes one.
        assert bool(snapshots) == any(entry and v + 1 >= every for v, entry in entries.items())
        for version in range(head + 1):
            book = fresh_book(store, version)
            assert same_book(book, folded(store, version)), version
            assert book.snapshot == max((v for v in snapshots if v <= version), default=-1)


def test_a_snapshot_made_before_a_rivals_version_is_passed_over(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A round whose commit was rebased over a rival's version made its snapshot without the
    rival's entry: reading passes over it and folds instead."""
    import dyngen.difficulty.observe as observe

    monkeypatch.setattr(observe, "SNAPSHOT_EVERY", 1)
    round_at(store, 2, [group(2, 1, 4)])
    parent = store.head("ds")
    store.write_batch_end("ds", "run", 4, {}, group(4, 2, 8))
    ends = pending_batch_ends(store, "ds", parent.version, RolloutsPolicy())
    context = RoundContext("ds", parent.version + 1, parent.version, Trigger(step=4),
                           batch_ends=ends)
    late = round_difficulty(store, SETTINGS, context, parent, [], None)
    round_at(store, 6, [group(6, 3, 2)])  # the rival commits first
    store.append("ds", verl_rows(1, start=300), lineage={LINEAGE_KEY: late})
    head = store.head_version("ds")
    assert late["snapshot"]["parent"] == head - 2  # made on the version before the rival's
    book = fresh_book(store)
    assert book.snapshot == head - 1 and same_book(book, folded(store, head))
