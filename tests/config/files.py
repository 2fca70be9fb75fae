"""Config files for the config tests."""

from __future__ import annotations

from pathlib import Path


def write_yaml(tmp_path: Path, text: str, name: str = "dyngen.yaml") -> Path:
    """Write a YAML config file and return its path."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path
