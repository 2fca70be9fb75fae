"""Every script under scripts/ answers `--help` with its usage and does nothing else: no
virtualenv, no install, no file (`scripts/setup.sh --help` once ran the whole install)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def tree(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")}


@pytest.mark.parametrize("script", sorted(p.name for p in SCRIPTS.glob("*.sh")))
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_usage_and_does_nothing(script: str, flag: str, tmp_path: Path) -> None:
    # A checkout of the scripts alone: whatever a script would make lands beside them.
    shutil.copytree(SCRIPTS, tmp_path / "scripts")
    (tmp_path / "home").mkdir()
    before = tree(tmp_path)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"),
           "VENV": str(tmp_path / "venv"), "LOCK": "none"}
    done = subprocess.run(["bash", f"scripts/{script}", flag], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("usage: ") and script in first, done.stdout
    assert len(done.stdout.splitlines()) > 1, "the usage line alone; the header says more"
    assert tree(tmp_path) == before
