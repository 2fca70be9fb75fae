"""Stores on each backend: a local folder, `memory://` and a real S3 API (moto's server).

`store` and `open_store` are parametrized over the three, so a test written against
them is the store's behaviour on each. One moto server serves the session; every test
gets its own bucket (and its own memory:// folder and shard cache).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dyngen.store import Store

BACKENDS = ("local", "memory", "s3")


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3 API on loopback: moto's threaded server (honours If-None-Match)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def s3_options(endpoint: str) -> dict[str, Any]:
    """storage_options that point s3fs at the moto server."""
    return {"endpoint_url": endpoint, "key": "testing", "secret": "testing",
            "client_kwargs": {"region_name": "us-east-1"}}


def new_bucket(endpoint: str) -> str:
    """Create an empty bucket with a fresh name on the moto server."""
    import boto3

    name = f"dyngen-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                 aws_secret_access_key="testing", region_name="us-east-1"
                 ).create_bucket(Bucket=name)
    return name


def _opener(kind: str, request: pytest.FixtureRequest,
            tmp_path: Path) -> Iterator[Callable[..., Store]]:
    """Yield a function opening new Store objects on one fresh root of backend `kind`."""
    cache = tmp_path / "cache"
    if kind == "local":
        root: str = str(tmp_path / "root")
        options: dict[str, Any] | None = None
    elif kind == "memory":
        root, options = f"memory://dyngen-{uuid.uuid4().hex}/store", None
    else:
        endpoint = request.getfixturevalue("s3_endpoint")
        root, options = f"s3://{new_bucket(endpoint)}/stores/main", s3_options(endpoint)

    def make(**kwargs: Any) -> Store:
        return Store(root, storage_options=options, cache_dir=cache, **kwargs)

    yield make
    if kind == "memory":
        import fsspec

        memory = fsspec.filesystem("memory")
        bucket = root.removeprefix("memory://").split("/")[0]
        if memory.exists(bucket):  # frees this test's files (the filesystem is global)
            memory.rm(bucket, recursive=True)


@pytest.fixture(params=BACKENDS)
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Store]]:
    """Opens new Store objects on one root (per test) of each backend."""
    yield from _opener(request.param, request, tmp_path)


@pytest.fixture(params=BACKENDS[1:])
def open_remote_store(request: pytest.FixtureRequest,
                      tmp_path: Path) -> Iterator[Callable[..., Store]]:
    """Opens new Store objects on one root of each remote backend (memory://, s3://)."""
    yield from _opener(request.param, request, tmp_path)


@pytest.fixture
def store(open_store: Callable[..., Store]) -> Store:
    """A Store on an empty root of each backend."""
    return open_store()
