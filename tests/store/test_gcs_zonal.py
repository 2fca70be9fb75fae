"""Zonal ("Rapid") GCS buckets: gcsfs uploads there ignore create-only mode, so no commits.

fake-gcs-server makes every bucket regional STANDARD, so a zonal bucket is shown by giving
the store the bucket resource GCS returns for one (`storageClass: RAPID`, `locationType:
zone`, as gcsfs creates them); everything else goes to the emulator.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import fsspec
import pytest

from dyngen.errors import StoreError
from dyngen.store import Store
from dyngen.store.remote import zonal_bucket
from tests.rows import verl_rows
from tests.store.conftest import gcs_options, new_gcs_bucket

ZONAL = {"kind": "storage#bucket", "storageClass": "RAPID", "location": "US-CENTRAL1",
         "locationType": "zone", "customPlacementConfig": {"dataLocations": ["us-central1-a"]},
         "hierarchicalNamespace": {"enabled": True}}


def test_zonal_buckets_are_told_from_their_metadata(gcs_endpoint: str) -> None:
    fs = fsspec.filesystem("gs", **gcs_options(gcs_endpoint))
    standard = fs.info(new_gcs_bucket(gcs_endpoint))  # the emulator's real bucket resource
    assert (standard["storageClass"], standard["locationType"]) == ("STANDARD", "region")
    assert not zonal_bucket(standard)
    assert zonal_bucket(ZONAL)
    assert zonal_bucket({"storageClass": "rapid"}) and zonal_bucket({"locationType": "ZONE"})
    assert not zonal_bucket({"storageClass": "STANDARD", "locationType": "multi-region"})
    assert not zonal_bucket({})  # unreadable metadata: not taken for zonal


def _store_on(gcs_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
              bucket_info: Any, **kwargs: Any) -> tuple[Store, str]:
    """A store in a new emulator bucket whose bucket resource reads as `bucket_info`."""
    bucket = new_gcs_bucket(gcs_endpoint)
    store = Store(f"gs://{bucket}/stores/main", storage_options=gcs_options(gcs_endpoint),
                  cache_dir=tmp_path / "cache", **kwargs)
    fs = store.backend.fs
    real_info = fs.info

    def info(path: str, **kw: Any) -> dict[str, Any]:
        if path.strip("/") == bucket:
            if isinstance(bucket_info, Exception):
                raise bucket_info
            return {**real_info(path, **kw), **bucket_info}
        return real_info(path, **kw)

    monkeypatch.setattr(fs, "info", info)  # the filesystem instance is fsspec's cached one
    return store, bucket


def test_a_store_in_a_zonal_bucket_refuses_to_commit_unless_single_writer(
        gcs_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, bucket = _store_on(gcs_endpoint, tmp_path, monkeypatch, ZONAL)
    with pytest.raises(StoreError) as refused:
        store.create("ds", verl_rows(2))
    message = str(refused.value)
    assert f"GCS bucket {bucket!r}, a zonal (Rapid storage) bucket (storageClass RAPID, " \
           "locationType zone)" in message
    assert "store.single_writer: true" in message
    assert store.backend.fs.find(bucket) == []  # nothing was written

    single, _ = _store_on(gcs_endpoint, tmp_path, monkeypatch, ZONAL, single_writer=True)
    single.create("ds", verl_rows(2))
    single.append("ds", verl_rows(1, start=2))
    assert single.head_version("ds") == 1
    # Single-writer mode there still never overwrites a record: it checks first.
    record = "ds/_versions/00000000000000000001.json"
    before = single.backend.read_bytes(record)
    with pytest.raises(FileExistsError):
        single.backend.write_new(record, b"{}")
    assert single.backend.read_bytes(record) == before


def test_a_bucket_whose_metadata_cannot_be_read_is_written_with_a_warning(
        gcs_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    store, bucket = _store_on(gcs_endpoint, tmp_path, monkeypatch,
                              PermissionError("storage.buckets.get denied"))
    with caplog.at_level(logging.WARNING, logger="dyngen.store.remote"):
        store.create("ds", verl_rows(2))
    assert store.head_version("ds") == 0
    assert f"could not read the metadata of GCS bucket {bucket!r}" in caplog.text
    assert "storage.buckets.get denied" in caplog.text
