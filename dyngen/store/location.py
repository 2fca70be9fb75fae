"""Where a store lives: a local folder, or a URL of an fsspec filesystem.

A root without `scheme://` is a local path; `file://` is one too. Any other scheme is
looked up in fsspec's registry: an unknown one, or one whose package is missing, is
refused with what to install, and nothing is created locally.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dyngen.errors import ConfigError
from dyngen.store.backend import Backend, LocalBackend

# What a task takes to open a store: a root, or `store_settings` (plain data, no objects).
StoreSpec = str | Mapping[str, Any]
_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)", re.DOTALL)
# Extras of dyngen that install a scheme's filesystem package.
_EXTRA = {"s3": "dyngen[s3]", "s3a": "dyngen[s3]", "gs": "dyngen[gcs]", "gcs": "dyngen[gcs]"}
# Listing caches would hide a version another writer just committed.
_NO_LISTINGS_CACHE = frozenset({"s3", "s3a", "gs", "gcs"})


def split_url(root: str | os.PathLike[str]) -> tuple[str, str] | None:
    """(scheme, rest) of a URL root, lowercase scheme; None for a local path."""
    if not isinstance(root, str):
        return None
    found = _URL.fullmatch(root)
    if found is None:
        return None
    return found.group(1).lower(), found.group(2)


def local_path(root: str | os.PathLike[str]) -> Path | None:
    """The folder a local root (a path or file://) names, as given; None for a URL root."""
    parts = split_url(root)
    if parts is None:
        return Path(root)
    return Path(parts[1]) if parts[0] == "file" else None


def absolute_root(root: str | os.PathLike[str]) -> str:
    """`root` as other processes can use it: a resolved local path, or the URL unchanged."""
    local = local_path(root)
    return str(root) if local is None else str(local.resolve())


def local_folder_for(root: str | os.PathLike[str]) -> Path:
    """A local folder standing for `root` where local files are needed (rollouts).

    A local root is itself (as given); a URL root maps to
    `<user data folder>/dyngen/<scheme>/<rest>` ($XDG_DATA_HOME, else ~/.local/share),
    the same for every process of one machine.
    """
    local = local_path(root)
    if local is not None:
        return local
    parts = split_url(root)
    assert parts is not None  # local_path is None only for a URL
    scheme, rest = parts
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    clean = [p for p in rest.split("/") if p not in ("", ".", "..")]
    return Path(base) / "dyngen" / scheme / Path(*clean) if clean else \
        Path(base) / "dyngen" / scheme


def store_settings(store: Any) -> dict[str, Any]:
    """Plain keyword arguments of `Store` from a root, a dict, or a config `store` section.

    Plain data, so a Prefect task can take it as a parameter in place of a root.
    """
    if isinstance(store, (str, os.PathLike)):
        return {"root": os.fspath(store)}
    get = store.get if isinstance(store, Mapping) else (lambda key: getattr(store, key, None))
    root = get("root")
    if not isinstance(root, (str, os.PathLike)):
        raise ConfigError(f"store.root: expected a local folder or a URL, found {root!r}.")
    options = get("storage_options")
    from omegaconf import OmegaConf

    if OmegaConf.is_config(options):
        options = OmegaConf.to_container(options, resolve=True)
    if options is not None and not isinstance(options, Mapping):
        raise ConfigError(f"store.storage_options: expected a mapping of options for the "
                          f"filesystem, found {type(options).__name__}.")
    cache_dir = get("cache_dir")
    return {"root": os.fspath(root), "storage_options": dict(options or {}) or None,
            "single_writer": bool(get("single_writer") or False),
            "cache_dir": os.fspath(cache_dir) if cache_dir else None}


def open_backend(root: str | os.PathLike[str], *,
                 storage_options: Mapping[str, Any] | None = None,
                 single_writer: bool = False,
                 cache_dir: str | os.PathLike[str] | None = None) -> Backend:
    """The backend for a store root: LocalBackend for paths and file://, else fsspec."""
    local = local_path(root)
    if local is not None:
        if isinstance(root, str) and not root.strip():
            raise ConfigError("store root is empty; expected a local folder or a URL such as "
                              "s3://bucket/stores/main. Set store.root or --root.")
        return LocalBackend(local.resolve())
    parts = split_url(root)
    assert parts is not None  # local_path is None only for a URL
    scheme, rest = parts
    fs_class = _filesystem_class(str(root), scheme)
    options = dict(storage_options or {})
    if scheme in _NO_LISTINGS_CACHE:
        options.setdefault("use_listings_cache", False)
    if not rest.strip("/"):
        raise ConfigError(f"store root {root!r} names no bucket or folder; expected e.g. "
                          f"{scheme}://bucket/stores/main.")
    try:
        fs = fs_class(**options)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"store root {root!r}: the {scheme}:// filesystem refused "
                          f"store.storage_options ({exc}). Expected the options of "
                          f"{fs_class.__module__}.{fs_class.__name__}; fix or remove them."
                          ) from exc
    from dyngen.store.cache import ShardCache
    from dyngen.store.remote import FsspecBackend

    path = fs._strip_protocol(str(root))
    return FsspecBackend(fs, path, str(root), scheme, ShardCache(cache_dir),
                         single_writer=single_writer)


def _filesystem_class(root: str, scheme: str) -> Any:
    """fsspec's filesystem class for `scheme`, or ConfigError saying what to install."""
    try:
        import fsspec
    except ImportError:
        raise ConfigError(f"store root {root!r} is a URL, which needs fsspec: "
                          "pip install fsspec (and the scheme's package).") from None
    try:
        return fsspec.get_filesystem_class(scheme)
    except ValueError:
        known = ", ".join(sorted(fsspec.available_protocols())[:40])
        raise ConfigError(
            f"store root {root!r}: unknown scheme {scheme!r}. Expected a local path, file://, "
            f"s3://, gs://, memory:// or another fsspec protocol ({known}, …). Fix the URL."
        ) from None
    except ImportError as exc:
        extra = _EXTRA.get(scheme)
        hint = f"pip install '{extra}'" if extra else "pip install the package it names"
        raise ConfigError(
            f"store root {root!r}: the {scheme}:// filesystem's package is not installed "
            f"(fsspec: {str(exc).rstrip('.')}). To use this root: {hint}."
        ) from None
