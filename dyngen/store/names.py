"""Dataset names: one safe path component, never a way out of the store root."""

from __future__ import annotations

import re

from dyngen.errors import DatasetNameError

MAX_NAME_LENGTH = 128
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def validate_name(name: object) -> str:
    """Return `name` if it is a safe dataset name, else raise DatasetNameError."""
    if not isinstance(name, str):
        raise DatasetNameError(f"dataset name must be a string, found {type(name).__name__}.")
    if not 0 < len(name) <= MAX_NAME_LENGTH or not _NAME.fullmatch(name) or ".." in name:
        raise DatasetNameError(
            f"invalid dataset name {name[:200]!r}: expected 1-{MAX_NAME_LENGTH} characters of "
            "letters, digits, '.', '_' or '-', starting with a letter or digit, without '..' "
            "or path separators. Choose a name like 'gsm8k-dyn'."
        )
    return name
