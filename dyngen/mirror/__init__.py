"""Mirrors of a dataset's versions in formats other engines read (Delta Lake)."""

from dyngen.mirror.delta import MirrorResult, commit_metadata, mirror_delta

FORMATS = ("delta",)

__all__ = ["FORMATS", "MirrorResult", "commit_metadata", "mirror_delta"]
