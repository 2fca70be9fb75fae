"""Small helpers the test modules share."""

from __future__ import annotations

import textwrap
from pathlib import Path

# The discard port: nothing listens there, so Prefect calls to it fail at once.
UNUSED_API = "http://127.0.0.1:9/api"


def write(path: Path, source: str) -> Path:
    """Write dedented Python source to ``path``, creating its directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path
