"""Damage on disk is reported by verify and refused by load; bad names never escape the root."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from dyngen.errors import CorruptionError, DatasetNameError
from dyngen.store import Store, gc, verify
from tests.rows import verl_rows


def _damaged_store(tmp_path: Path) -> tuple[Store, Path]:
    store = Store(tmp_path / "root")
    store.create("ds", verl_rows(20))
    store.append("ds", verl_rows(5, start=20))
    return store, store.dataset_dir("ds")


def _record(base: Path, n: int) -> Path:
    return base / "_versions" / f"{n:020d}.json"


def _newest_shard(base: Path) -> Path:
    data = json.loads(_record(base, 1).read_text())
    return base / data["added"][-1]["path"]


def truncate_record(base: Path) -> None:
    path = _record(base, 1)
    path.write_bytes(path.read_bytes()[:40])


def delete_shard(base: Path) -> None:
    _newest_shard(base).unlink()


def flip_shard_bytes(base: Path) -> None:
    path = _newest_shard(base)
    raw = bytearray(path.read_bytes())
    at = raw.find(b"What is 21")  # alter row data, keeping the size and Arrow framing intact
    raw[at : at + 4] = b"XXXX"
    path.write_bytes(bytes(raw))


def shard_outside_dataset(base: Path) -> None:
    path = _record(base, 1)
    data = json.loads(path.read_text())
    data["added"][-1]["path"] = "../../outside.arrow"
    path.write_text(json.dumps(data))


def delete_prompt_keys(base: Path) -> None:
    data = json.loads(_record(base, 1).read_text())
    (base / data["added"][-1]["keys"]).unlink()


def truncate_shard(base: Path) -> None:
    path = _newest_shard(base)
    path.write_bytes(path.read_bytes()[:100])


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated record": (truncate_record, "not valid JSON"),
    "missing shard": (delete_shard, "is missing"),
    "altered shard bytes": (flip_shard_bytes, "checksum"),
    "shard outside dataset": (shard_outside_dataset, "outside the dataset"),
    "truncated shard": (truncate_shard, "bytes, its record says"),
}


@pytest.mark.parametrize("kind", DAMAGE)
def test_verify_reports_damage_and_load_refuses(tmp_path: Path, kind: str) -> None:
    store, base = _damaged_store(tmp_path)
    assert verify(store, "ds") == []
    damage, wording = DAMAGE[kind]
    damage(base)
    problems = verify(store, "ds")
    assert problems, f"verify missed {kind}"
    assert any(p.version == 1 and wording in p.message for p in problems), problems
    with pytest.raises(CorruptionError, match=wording) as err:
        Store(store.root).load("ds")
    assert "dyngen verify" in str(err.value) and "dyngen restore" in str(err.value)
    # version 0 does not depend on the damage and still loads
    assert Store(store.root).load("ds", 0).num_rows == 20
    assert not (tmp_path / "outside.arrow").exists()


def test_a_damaged_record_is_reported_by_field_and_type_never_by_its_content(
    tmp_path: Path,
) -> None:
    store, base = _damaged_store(tmp_path)
    data = json.loads(_record(base, 1).read_text())
    data["rows"] = "SECRET_TOKEN=sk-live-0123456789abcdef"
    _record(base, 1).write_text(json.dumps(data))
    messages = [p.message for p in verify(store, "ds")]
    assert any("field 'rows' must be int, found str" in m for m in messages), messages
    with pytest.raises(CorruptionError) as err:
        Store(store.root).load("ds")
    assert not any("sk-live" in m for m in [*messages, str(err.value)])


def test_missing_prompt_keys_are_reported_and_dedup_refuses_but_rows_still_load(
    tmp_path: Path,
) -> None:
    store, base = _damaged_store(tmp_path)
    delete_prompt_keys(base)
    assert any("prompt keys" in p.message for p in verify(store, "ds"))
    assert Store(store.root).load("ds").num_rows == 25
    with pytest.raises(CorruptionError, match="prompt keys .* unreadable"):
        Store(store.root).contains_prompts("ds", np.array([1], dtype="<u8"))


def test_gc_refuses_when_a_record_is_unreadable(tmp_path: Path) -> None:
    store, base = _damaged_store(tmp_path)
    truncate_record(base)
    with pytest.raises(CorruptionError):
        gc(store, "ds", grace_seconds=0)
    # shards survive: nothing is deleted on a guess
    assert len(list((base / "data").glob("*.arrow"))) == 2


@pytest.mark.parametrize("kind", ["missing shard", "truncated record"])
def test_restore_recovers_from_a_damaged_head(tmp_path: Path, kind: str) -> None:
    store, base = _damaged_store(tmp_path)
    DAMAGE[kind][0](base)
    rec = Store(store.root).restore("ds", 0)
    assert rec.version == 2
    assert Store(store.root).load("ds").num_rows == 20


BAD_NAMES = ["../escape", "a/b", "..", "/abs", "", "a" * 200, "x/../../y", ".hidden",
             "a\\b", "a\x00b", "-flag", "ok..no", "sp ace"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_dataset_names_never_touch_paths_outside_the_root(tmp_path: Path, name: str) -> None:
    root = tmp_path / "root"
    store = Store(root)
    before = sorted(tmp_path.rglob("*"))
    for call in (
        lambda: store.create(name, verl_rows(1)),
        lambda: store.load(name),
        lambda: store.append(name, verl_rows(1)),
        lambda: verify(store, name),
        lambda: gc(store, name, grace_seconds=0),
    ):
        with pytest.raises(DatasetNameError, match="invalid dataset name|must be a string"):
            call()
    assert sorted(tmp_path.rglob("*")) == before


def test_good_names_are_accepted(tmp_path: Path) -> None:
    store = Store(tmp_path)
    for name in ("gsm8k", "gsm8k-dyn_v2.0", "A1"):
        assert store.create(name, verl_rows(1)).version == 0
    assert store.list_datasets() == ["A1", "gsm8k", "gsm8k-dyn_v2.0"]
