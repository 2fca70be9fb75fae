"""Where things are when nobody says: the store (the one place `DYNGEN_STORE_ROOT` is
read), and dyngen's folder in the user's cache."""

from __future__ import annotations

import os
from pathlib import Path

ROOT_ENV = "DYNGEN_STORE_ROOT"
DEFAULT_STORE_ROOT = "dyngen_store"
# The config's default store.root: the same rule, resolved by OmegaConf when read.
STORE_ROOT_INTERPOLATION = f"${{oc.env:{ROOT_ENV},{DEFAULT_STORE_ROOT}}}"


def store_root(root: str | os.PathLike[str] | None = None) -> str:
    """`root` when given, else $DYNGEN_STORE_ROOT, else `dyngen_store` (a folder or a URL:
    kept as text, since a Path would turn s3://bucket into s3:/bucket)."""
    return os.fspath(root or os.environ.get(ROOT_ENV) or DEFAULT_STORE_ROOT)


def user_cache(*parts: str) -> Path:
    """`dyngen/<parts>` in the user's cache folder ($XDG_CACHE_HOME, else ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).joinpath("dyngen", *parts)
