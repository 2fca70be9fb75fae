"""Compaction: small shards become large ones as a version; rows, order and keys are kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from dyngen.errors import CompactionConflictError, ConfigError, CorruptionError
from dyngen.store import CompactionPolicy, ShardInfo, Store, gc, verify
from dyngen.store.compaction import prepare_compaction
from dyngen.store.keys import prompt_keys
from tests.rows import verl_rows

SMALL = CompactionPolicy(max_small_shards=4, fan_in=4)
REJECT = [{"reason": "duplicate", "detail": "seen", "row": "{}"}]


def indices(ds) -> list[int]:
    return [e["index"] for e in ds["extra_info"]]


def grown(tmp_path: Path, rounds: int = 10) -> Store:
    """Version 0 of 2 rows, then `rounds` appends of 2 rows, every other one with a reject."""
    store = Store(tmp_path)
    store.create("ds", verl_rows(2))
    for r in range(rounds):
        store.append("ds", verl_rows(2, start=2 + 2 * r), generator=f"g{r}", round_id=f"r{r}",
                     rejected=REJECT if r % 2 else None)
    return store


def shards(*rows: int, row_bytes: int = 10) -> list[ShardInfo]:
    """Shards of these row counts (bytes: 2 KB of schema header plus the rows)."""
    return [ShardInfo(f"data/{i}.arrow", n, 2048 + n * row_bytes, "0" * 64)
            for i, n in enumerate(rows)]


@pytest.mark.parametrize(("rows", "runs"), [
    ([10] * 3, []),
    ([10] * 4, [(0, 4)]),
    ([10] * 7, [(0, 4)]),
    # Tiers cascade: four merged shards and the three after them make a run of the next tier.
    ([40, 40, 40, 10, 10, 10, 10], [(0, 7)]),
    ([1000, 10, 10, 10, 10], [(1, 5)]),  # the big shard is a tier of its own
    ([10, 10, 10, 10, 1000], [(0, 4)]),  # ... before the small ones or after them
])
def test_the_policy_merges_fan_in_adjacent_shards_of_a_tier(rows, runs) -> None:
    policy = CompactionPolicy(max_small_shards=0, fan_in=4)
    assert policy.runs(shards(*rows)) == runs


def test_shards_at_the_target_size_are_never_rewritten() -> None:
    policy = CompactionPolicy(max_small_shards=0, fan_in=2, target_bytes=3000)
    assert policy.runs(shards(100, 100, 100)) == []
    assert policy.runs(shards(100, 1, 1, 100, 1, 1)) == [(1, 3), (4, 6)]
    assert policy.runs(shards(100, 1, 100, 1), full=True) == []
    assert policy.runs(shards(1, 1, 1, 100, 1), full=True) == [(0, 3)]


def test_a_row_is_rewritten_a_few_times_not_once_per_compaction() -> None:
    policy = CompactionPolicy(max_small_shards=0, fan_in=8)
    head, rewritten = [], 0
    for _ in range(5000):
        head += shards(10)
        for a, b in reversed(policy.runs(head)):
            rewritten += sum(s.rows for s in head[a:b])
            head[a:b] = shards(sum(s.rows for s in head[a:b]))
    assert rewritten / (5000 * 10) < 5  # ~log_8(5000) tiers
    assert len(head) <= 8 * 5


def test_compaction_keeps_rows_order_provenance_and_prompt_keys(tmp_path: Path) -> None:
    store = grown(tmp_path)
    before = {v: store.load("ds", v).to_list() for v in store.versions("ds")}
    rejected = store.load_rejected("ds").to_list()
    made = store.compact("ds", SMALL)
    assert [r.operation for r in made] == ["compact"]
    rec = made[0]
    assert (rec.version, rec.parent, rec.rows) == (11, 10, 22)
    assert len(rec.shards) < 11 and rec.lineage["compaction"]["shards_in"] >= 8
    after = Store(tmp_path).load("ds")
    assert after.to_list() == before[10]  # the same rows in the same order
    assert after["_dyngen_generator"] == ["import"] * 2 + [f"g{r}" for r in range(10)
                                                           for _ in range(2)]
    assert Store(tmp_path).load_rejected("ds").to_list() == rejected
    for v, rows in before.items():  # older versions still read their own shards
        assert Store(tmp_path).load("ds", v).to_list() == rows
    probes = prompt_keys([r["prompt"] for r in verl_rows(3, start=0)] +
                         [verl_rows(1, start=999)[0]["prompt"]])
    assert Store(tmp_path).contains_prompts("ds", probes).tolist() == [True] * 3 + [False]
    assert verify(store, "ds") == []
    assert gc(store, "ds", grace_seconds=0) == []
    assert store.compact("ds", SMALL) == []  # nothing left to do


def test_full_compaction_merges_every_small_run(tmp_path: Path) -> None:
    store = grown(tmp_path, rounds=3)
    assert store.compact("ds", CompactionPolicy()) == []  # 4 shards: the policy waits
    (rec,) = store.compact("ds", full=True)
    assert len(rec.shards) == 1 and len(store.state("ds").quarantine) == 1
    assert indices(Store(tmp_path).load("ds")) == list(range(8))


def test_a_round_racing_a_compaction_rebases_and_nothing_is_lost_or_doubled(
        tmp_path: Path) -> None:
    store = grown(tmp_path)
    pending_round = store.prepare_append("ds", verl_rows(2, start=100), idempotency_key="k")
    compaction = prepare_compaction(Store(tmp_path), "ds", SMALL)
    assert compaction is not None
    other = Store(tmp_path)
    other.commit(pending_round)  # the round wins the race
    rec = Store(tmp_path).commit_with_rebase(compaction)  # the compaction rebases
    assert (rec.operation, rec.parent) == ("compact", 11)
    assert indices(Store(tmp_path).load("ds")) == [*range(22), 100, 101]
    late = Store(tmp_path).append("ds", verl_rows(1, start=200))  # and a round after it
    assert indices(Store(tmp_path).load("ds")) == [*range(22), 100, 101, 200]
    assert late.rows == 25
    assert verify(store, "ds") == [] and gc(store, "ds", grace_seconds=0) == []


def test_a_compaction_racing_a_compaction_gives_way(tmp_path: Path) -> None:
    store = grown(tmp_path)
    first = prepare_compaction(Store(tmp_path), "ds", SMALL)
    second = prepare_compaction(Store(tmp_path), "ds", SMALL)
    assert first is not None and second is not None
    Store(tmp_path).commit(first)
    with pytest.raises(CompactionConflictError, match="Compact again"):
        Store(tmp_path).commit_with_rebase(second)
    assert indices(Store(tmp_path).load("ds")) == list(range(22))
    assert gc(store, "ds", grace_seconds=0) == []  # the loser's shards were removed
    assert verify(store, "ds") == []


def test_a_damaged_input_is_never_rewritten_into_a_fresh_checksum(tmp_path: Path) -> None:
    store = grown(tmp_path)
    victim = store.dataset_dir("ds") / store.head("ds").shards[3].path
    raw = bytearray(victim.read_bytes())
    at = raw.find(b"What is")
    raw[at:at + 4] = b"XXXX"
    victim.write_bytes(bytes(raw))
    with pytest.raises(CorruptionError, match="checksum"):
        Store(tmp_path).compact("ds", SMALL)
    assert store.head_version("ds") == 10
    assert gc(store, "ds", grace_seconds=0) == []  # its partial output was removed


def test_policy_values_are_checked() -> None:
    with pytest.raises(ConfigError, match="fan_in: expected an integer >= 2"):
        CompactionPolicy(fan_in=1)
    with pytest.raises(ConfigError, match="target_bytes"):
        CompactionPolicy(target_bytes=0)


def test_shards_of_narrower_schemas_are_merged_in_the_head_schema(tmp_path: Path) -> None:
    from tests.rows import verl_row

    store = Store(tmp_path)
    store.create("ds", verl_rows(2))
    wider = verl_row(5)
    wider["extra_info"] = {**wider["extra_info"], "seed_index": 3}  # a field added later
    store.append("ds", [wider])
    store.append("ds", verl_rows(1, start=9))
    before = store.load("ds").to_list()
    (rec,) = store.compact("ds", full=True)
    assert len(rec.shards) == 1
    after = Store(tmp_path).load("ds")
    assert after.to_list() == before
    assert [e["seed_index"] for e in after["extra_info"]] == [None, None, 3, None]
    assert verify(store, "ds") == []


def test_a_compacted_version_extends_its_parents_a_restored_one_does_not(
        tmp_path: Path) -> None:
    store = grown(tmp_path, rounds=3)
    (compacted,) = store.compact("ds", full=True)
    store.append("ds", verl_rows(1, start=50))
    assert store.extends("ds", 1, compacted.version + 1)
    restored = store.restore("ds", 2)
    assert not store.extends("ds", 1, restored.version)
    assert not store.extends("ds", 3, 1)
