"""The store's behaviour on every backend: a local folder, `memory://`, S3 (moto) and GCS
(fake-gcs-server).

Together with tests/store/test_store.py (whose API tests take the same parametrized
`store`), this is the behaviour suite on each backend: create, append, idempotency,
conflict and rebase, time travel, verify, gc, and the long-run log (checkpoints,
compaction, vacuum). Races of several processes stay local (tests/store/test_store.py):
moto's conditional put is not atomic under a real race, so the remote conflict path is shown
with two writers on one parent, one after the other.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dyngen.errors import CommitConflictError, ConfigError, StoreError, VersionVacuumedError
from dyngen.store import CompactionPolicy, Store, gc, verify
from dyngen.store.log import VersionLog
from dyngen.store.shards import file_sha256
from tests.rows import verl_rows


def indices(ds) -> list[int]:
    return [e["index"] for e in ds["extra_info"]]


def grow(store: Store, versions: int) -> None:
    """Version 0 of 3 rows, then one row per version, each with key `event:<v>`."""
    store.create("ds", verl_rows(3))
    for v in range(1, versions):
        store.append("ds", verl_rows(1, start=2 + v), idempotency_key=f"event:{v}")


def test_exclusive_create_keeps_the_first_file(store: Store) -> None:
    store.backend.write_new("ds/_versions/x.json", b"first")
    with pytest.raises(FileExistsError):
        store.backend.write_new("ds/_versions/x.json", b"second")
    assert store.backend.read_bytes("ds/_versions/x.json") == b"first"
    assert store.backend.create_exclusive("ds/_keys/k.json", b"1") is True
    assert store.backend.create_exclusive("ds/_keys/k.json", b"2") is False
    assert store.backend.read_bytes("ds/_keys/k.json") == b"1"


def test_a_writer_that_loses_the_record_creation_conflicts_and_rebases(
        open_store, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = open_store(), open_store()
    a.create("ds", verl_rows(1))
    pending_b = b.prepare_append("ds", verl_rows(1, start=2), idempotency_key="b")
    a.append("ds", verl_rows(1, start=1))
    # B read the head just before A committed: only the exclusive create stops it now.
    with monkeypatch.context() as m:
        m.setattr(VersionLog, "head_version", lambda self: 0)
        with pytest.raises(CommitConflictError, match="expected parent 0"):
            b.commit(pending_b)
    rec = b.commit_with_rebase(b.rebase(pending_b))
    assert (rec.version, rec.parent) == (2, 1)
    fresh = open_store()
    assert indices(fresh.load("ds")) == [0, 1, 2]
    assert fresh.load("ds", 1)["_dyngen_version"] == [0, 1]
    assert fresh.find_idempotency_key("ds", "b").version == 2
    assert verify(fresh, "ds") == [] and gc(fresh, "ds", grace_seconds=0) == []


def test_checkpoints_time_travel_and_keys_from_a_fresh_store(open_store) -> None:
    grow(open_store(checkpoint_interval=5), 13)
    fresh = open_store(checkpoint_interval=5)
    assert fresh.log("ds").checkpoint_versions() == [5, 10]
    assert fresh.head_version("ds") == 12
    for v in (0, 4, 5, 6, 12):
        assert indices(fresh.load("ds", v)) == list(range(3 + v))
    assert fresh.find_idempotency_key("ds", "event:7").version == 7
    assert fresh.find_idempotency_key("ds", "event:99") is None
    assert verify(fresh, "ds") == []


def test_compaction_keeps_rows_and_a_racing_round_rebases(open_store) -> None:
    store = open_store()
    store.create("ds", verl_rows(2))
    for r in range(9):
        store.append("ds", verl_rows(1, start=2 + r))
    racing = open_store().prepare_append("ds", verl_rows(1, start=100))
    made = store.compact("ds", CompactionPolicy(max_small_shards=4, fan_in=4))
    assert made and all(r.operation == "compact" for r in made)
    rec = open_store().commit_with_rebase(racing)
    assert rec.parent == made[-1].version
    fresh = open_store()
    assert indices(fresh.load("ds")) == [*range(11), 100]
    assert len(fresh.state("ds").shards) < 11
    assert verify(fresh, "ds") == [] and gc(fresh, "ds", grace_seconds=0) == []


def test_vacuum_deletes_only_what_no_kept_version_names(open_store) -> None:
    store = open_store()
    store.create("ds", verl_rows(2))
    for r in range(5):
        store.append("ds", verl_rows(1, start=2 + r))
    store.compact("ds", full=True)
    before = set(store.backend.list("ds/data"))
    result = store.vacuum("ds", keep_versions=1, grace_seconds=0)
    assert result.expired_before == 6 and result.removed
    after = set(store.backend.list("ds/data"))
    assert after == before - {f.split("/", 1)[1] for f in result.removed}
    fresh = open_store()
    assert indices(fresh.load("ds")) == list(range(7))
    with pytest.raises(VersionVacuumedError, match="removed by retention"):
        fresh.load("ds", 2)
    assert [r.version for r in fresh.history("ds")] == list(range(8))  # records stay
    assert verify(fresh, "ds") == [] and gc(fresh, "ds", grace_seconds=0) == []


def test_verify_reports_a_shard_deleted_from_the_store_even_if_cached(open_store) -> None:
    store = open_store()
    store.create("ds", verl_rows(2))
    store.append("ds", verl_rows(2, start=2))
    assert store.load("ds").num_rows == 4  # shards cached (remote) or read in place
    victim = store.head("ds").shards[1]
    store.backend.delete(f"ds/{victim.path}")
    problems = verify(open_store(), "ds")
    assert [(p.path, "missing" in p.message) for p in problems] == [(victim.path, True)]


def test_a_deleted_cache_is_refilled(open_remote_store) -> None:
    store = open_remote_store()
    store.create("ds", verl_rows(3))
    first = store.load("ds")
    cache = store.backend.cache.folder
    assert [Path(f["filename"]).parent.parent for f in first.cache_files] == [cache]
    shutil.rmtree(cache)
    again = open_remote_store().load("ds")
    assert indices(again) == [0, 1, 2]
    assert all(Path(f["filename"]).is_file() for f in again.cache_files)


def test_a_cached_copy_whose_hash_differs_is_fetched_again(open_remote_store) -> None:
    store = open_remote_store()
    store.create("ds", verl_rows(3))
    info = store.head("ds").shards[0]
    cached = Path(store.load("ds").cache_files[0]["filename"])
    assert cached.name == f"{info.sha256}.arrow"  # named by its content hash
    cached.write_bytes(b"\0" * info.bytes)  # same size, other content
    assert indices(open_remote_store().load("ds")) == [0, 1, 2]
    assert file_sha256(cached) == info.sha256


def test_credentials_and_endpoint_from_the_environment(
        s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.store.conftest import new_bucket

    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_ENDPOINT_URL": s3_endpoint, "AWS_DEFAULT_REGION": "us-east-1",
                        "DYNGEN_CACHE_DIR": str(tmp_path / "env-cache")}.items():
        monkeypatch.setenv(name, value)
    root = f"s3://{new_bucket(s3_endpoint)}/store"
    Store(root).create("ds", verl_rows(2))
    ds = Store(root).load("ds")
    assert indices(ds) == [0, 1]
    assert ds.cache_files[0]["filename"].startswith(str(tmp_path / "env-cache"))


def test_a_url_root_never_creates_a_local_folder(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"unknown scheme 'nosuch'.*Fix the URL"):
        Store("nosuch://bucket/x")
    # ossfs (Alibaba OSS) is not a dependency of dyngen: its package is named.
    with pytest.raises(ConfigError, match=r"oss:// filesystem's package is not installed.*ossfs"):
        Store("oss://bucket/x")
    assert list(tmp_path.iterdir()) == []


def test_a_backend_without_exclusive_create_writes_only_in_single_writer_mode(
        tmp_path: Path) -> None:
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    class PlainMemory(MemoryFileSystem):
        """The memory filesystem under a scheme dyngen knows no exclusive create for."""

        protocol = ("dyngenplain",)

        @classmethod
        def _strip_protocol(cls, path: str) -> str:
            return super()._strip_protocol(path.replace("dyngenplain://", "memory://", 1))

    fsspec.register_implementation("dyngenplain", PlainMemory, clobber=True)
    root = "dyngenplain://plain-store/x"
    with pytest.raises(StoreError, match=r"no atomic create-if-absent.*store.single_writer"):
        Store(root, cache_dir=tmp_path).create("ds", verl_rows(1))
    assert not Store(root).backend.list("ds/data")  # refused before writing anything
    single = Store(root, single_writer=True, cache_dir=tmp_path)
    single.create("ds", verl_rows(1))
    single.append("ds", verl_rows(1, start=1))
    assert indices(Store(root, cache_dir=tmp_path).load("ds")) == [0, 1]  # reading needs no opt-in
