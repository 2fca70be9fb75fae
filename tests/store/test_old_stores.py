"""A store written by dyngen before the linear log (format 1) keeps working and upgrades.

tests/fixtures/format1_store was written by that code (tests/fixtures/make_format1_store.py)
with every version's rows as it loaded them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dyngen.store import Store, gc, verify
from dyngen.store.keys import prompt_keys
from tests.rows import verl_rows

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "format1_store"


@pytest.fixture
def old(tmp_path: Path) -> Store:
    """A copy of the format-1 store (the fixture itself is never written to)."""
    shutil.copytree(FIXTURE, tmp_path / "store")
    return Store(tmp_path / "store")


def expected(name: str) -> dict[int, dict]:
    data = json.loads((FIXTURE / "expected.json").read_text())[name]
    return {int(v): rows for v, rows in data.items()}


@pytest.mark.parametrize("name", ["old", "old-question"])
def test_every_old_version_loads_as_the_old_code_loaded_it(old: Store, name: str) -> None:
    for version, rows in expected(name).items():
        assert old.load(name, version).to_list() == rows["rows"], version
        assert old.load_rejected(name, version).to_list() == rows["rejected"], version
    assert [r.format for r in old.history(name)] == [1] * len(expected(name))
    assert verify(old, name) == []
    assert gc(old, name, grace_seconds=0) == []


def test_old_lineage_keys_and_generator_state_are_read(old: Store) -> None:
    assert old.find_idempotency_key("old", "event:b").version == 2
    assert old.find_idempotency_key("old", "event:never") is None
    assert old.record("old", 4).lineage == {"restored_from": 1}
    found = old.newest_by_generator("old", "tests.flows.gens.AddNewRows")
    assert found is not None and found.lineage["generator"]["state"] == {"level": 1}


def test_the_next_commit_upgrades_the_log(old: Store) -> None:
    rec = old.append("old", verl_rows(1, start=500), idempotency_key="event:new")
    assert (rec.version, rec.format) == (6, 2)
    base = old.dataset_dir("old")
    # A checkpoint at once, so nothing reads the old full records again, and a marker for
    # every old key, so lookups stop reading the log.
    assert (base / "_checkpoints" / f"{6:020d}.json").exists()
    fresh = Store(old.root)
    log = fresh.log("old")
    assert [log.marked_version(f"event:{k}") for k in "abcd"] == [1, 2, 3, 5]
    assert fresh.load("old").to_list()[:-1] == expected("old")[5]["rows"]
    for version, rows in expected("old").items():  # history still reads
        assert fresh.load("old", version).to_list() == rows["rows"]
    assert fresh.find_idempotency_key("old", "event:c").version == 3
    assert verify(fresh, "old") == []


def test_a_non_default_prompt_key_still_deduplicates_against_old_shards(old: Store) -> None:
    keys = prompt_keys(["What is 1 * 3?", "What is 9 * 3?", "What is 5 * 3?"])
    assert old.contains_prompts("old-question", keys).tolist() == [True, True, False]
    old.append("old-question", [{"question": "What is 5 * 3?", "answer": "15"}])
    assert Store(old.root).contains_prompts("old-question", keys).tolist() == [True] * 3
    assert Store(old.root).head("old-question").prompt_key == "question"


@pytest.mark.usefixtures("prefect_server")
def test_an_old_store_takes_a_generation_round(old: Store) -> None:
    from dyngen.flows.generation_round import generation_round
    from tests.reliability.helpers import round_config

    result = generation_round("old", round_config(old, start=600, n=2), {"event_id": "old-1"})
    assert (result["version"], result["created"]) == (6, True)
    head = Store(old.root).load("old")
    assert [e["index"] for e in head["extra_info"]][-3:] == [7, 600, 601]
    assert Store(old.root).load_rejected("old")["reason"] == ["duplicate", "duplicate"]
    again = generation_round("old", round_config(old, start=600, n=2), {"event_id": "old-1"})
    assert (again["version"], again["created"]) == (6, False)
    assert verify(old, "old") == []
