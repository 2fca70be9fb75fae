"""Mirrors of a dataset's versions in a format other engines read (Delta Lake)."""

from __future__ import annotations

import os
from typing import Any

from dyngen.mirror.delta import MirrorResult, commit_metadata, mirror_delta
from dyngen.progress import QUIET, Bar
from dyngen.store import Store
from dyngen.store.location import split_url

__all__ = ["MirrorResult", "commit_metadata", "dataset_dest", "mirror_dataset", "mirror_delta"]


def mirror_dataset(store: Store, name: str, mirror: Any = None, *,
                   dest: str | os.PathLike[str] | None = None, up_to: int | None = None,
                   progress: Bar = QUIET) -> MirrorResult:
    """Bring dataset `name`'s mirror up to date, as a config's `mirror` section says.

    `mirror` is a config's `mirror` section (or a mapping of its keys); `dest` (the table
    itself) replaces `<mirror.dest>/<name>`. The mirror's fsspec options are
    `mirror.storage_options`, else the store's when the mirror is on the store's scheme.
    """
    section = _plain(mirror)
    where = os.fspath(dest) if dest is not None else dataset_dest(section.get("dest"), name)
    options = dict(section.get("storage_options") or {})
    if not options and _scheme(where) == _scheme(str(store.root)):
        # The filesystem the store opened knows how to reach that scheme (endpoint, keys).
        options = dict(getattr(getattr(store.backend, "fs", None), "storage_options", None)
                       or {})
    return mirror_delta(store, name, where, storage_options=options or None,
                        delta_options=section.get("delta_options") or None, up_to=up_to,
                        progress=progress)


def dataset_dest(dest: Any, name: str) -> str:
    """Where dataset `name` is mirrored: `<dest>/<name>`, or `dest` with `{dataset}` in it
    replaced by the name (e.g. `s3://bucket/{dataset}/delta`)."""
    if not isinstance(dest, (str, os.PathLike)) or not os.fspath(dest).strip():
        raise _no_dest(dest)
    where = os.fspath(dest)
    if "{dataset}" in where:
        return where.replace("{dataset}", name)
    return f"{where.rstrip('/')}/{name}"


def _no_dest(found: Any) -> Exception:
    from dyngen.errors import ConfigError

    return ConfigError(f"mirror.dest: expected a folder or URL to mirror datasets under, found "
                       f"{found!r}. Set it, e.g. mirror.dest=s3://bucket/mirrors.")


def _plain(section: Any) -> dict[str, Any]:
    from omegaconf import OmegaConf

    if OmegaConf.is_config(section):
        return dict(OmegaConf.to_container(section, resolve=True))  # type: ignore[arg-type]
    return dict(section or {})


def _scheme(where: str) -> str:
    parts = split_url(where)
    return "file" if parts is None else parts[0]
