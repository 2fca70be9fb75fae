"""A Delta mirror on S3 (moto's server, as the store's own S3 tests use), of a store on S3:
the mirror reaches the bucket with the store's options, and engines read it there."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dyngen.mirror import mirror_dataset
from dyngen.mirror.files import delta_options
from dyngen.store import Store
from tests.mirror.test_delta import NAME, as_multiset, delta_rows, grow, polars_rows
from tests.store.conftest import new_bucket, s3_options


def test_a_store_on_s3_mirrors_to_s3_and_engines_read_every_version(
        s3_endpoint: str, tmp_path) -> None:
    bucket = new_bucket(s3_endpoint)
    options = s3_options(s3_endpoint)
    store = Store(f"s3://{bucket}/stores/main", storage_options=options,
                  cache_dir=tmp_path / "cache")
    versions = grow(store)
    done = mirror_dataset(store, NAME, {"dest": f"s3://{bucket}/mirrors"})
    dest = f"s3://{bucket}/mirrors/{NAME}"
    assert (done.dest, done.version) == (dest, versions["head"])
    reach = {"storage_options": delta_options(dest, options, None)}
    for role in ("first", "second", "grown", "compacted", "restored", "head"):
        expected = as_multiset(store.load(NAME, versions[role]).to_list())
        assert delta_rows(dest, versions[role], **reach) == expected, role
        assert polars_rows(dest, versions[role], **reach) == expected, role

    store.append(NAME, [{**store.load(NAME, 0)[0], "data_source": "late"}])
    assert mirror_dataset(store, NAME, {"dest": f"s3://{bucket}/mirrors"}).committed == \
        (versions["head"] + 1,)
    assert delta_rows(dest, versions["head"] + 1, **reach) == \
        as_multiset(store.load(NAME).to_list())


@pytest.fixture
def fresh_s3_filesystems() -> Iterator[None]:
    """s3fs caches filesystems by their arguments, and an endpoint taken from the
    environment is not one: no other test's filesystem here, and none of ours left."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.mark.usefixtures("fresh_s3_filesystems")
def test_the_command_mirrors_a_store_on_s3_with_credentials_from_the_environment(
        s3_endpoint: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from dyngen.cli import app
    from tests.rows import verl_rows

    for key, value in {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                       "AWS_REGION": "us-east-1", "DYNGEN_CACHE_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(key, value)
    bucket = new_bucket(s3_endpoint)
    root, dest = f"s3://{bucket}/store", f"s3://{bucket}/mirrors/{NAME}"
    store = Store(root)
    store.create(NAME, verl_rows(3))
    store.append(NAME, verl_rows(2, start=3))
    done = CliRunner().invoke(app, ["--root", root, "export", NAME, dest, "--format", "delta"])
    assert done.exit_code == 0, done.output
    assert f"mirrored 'ds' versions 0..1 to {dest}" in done.output
    reach = {"storage_options": {"AWS_ALLOW_HTTP": "true"}}  # the rest from the environment
    assert delta_rows(dest, 1, **reach) == as_multiset(store.load(NAME).to_list())
