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


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def test_a_store_on_s3_mirrors_to_s3_and_engines_read_every_version(
        endpoint: str, tmp_path) -> None:
    bucket = new_bucket(endpoint)
    options = s3_options(endpoint)
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
