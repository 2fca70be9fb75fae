"""The built wheel installs one top-level package, `dyngen`, with its data and nothing else.

A user's own `tasks.py`, `flows.py` or `generators/` sits first on `sys.path` and would
shadow any other top-level name the wheel installed; so the wheel must install none.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What a checkout holds besides its sources (.gitignore's entries, and git's own folder):
# a stale build/ from an older layout, for one, must not reach the wheel under test.
NOT_SOURCES = (".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
               ".ruff_cache", "dyngen_store", ".dyngen", "artifacts")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel pip builds from a copy of this checkout, offline (no build isolation)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_SOURCES))
    out = work / "dist"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "--quiet", "--wheel-dir", str(out), str(source)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (built,) = out.glob("dyngen-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_installs_dyngen_alone(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
    assert wheel.read(top_level).decode().split() == ["dyngen"]
    dist_info = top_level.split("/")[0]
    assert {n.split("/")[0] for n in names} == {"dyngen", dist_info}


def test_the_wheel_holds_the_code_tasks_seeds_and_no_tests_or_benchmarks(
        wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    seeds = [n for n in names if n.startswith("dyngen/generators/code_tasks/")
             and n.endswith(".jsonl")]
    assert seeds, "the code tasks' seed dataset is missing from the wheel"
    assert sorted(Path(n).name for n in seeds) == sorted(
        p.name for p in (ROOT / "dyngen/generators/code_tasks").glob("*.jsonl"))
    for name in names:
        assert not name.startswith(("tests/", "benchmarks/")), name
    assert "dyngen/flows/generation_round.py" in names  # the moved packages are inside
    assert "dyngen/tasks/generate.py" in names


def test_import_dyngen_loads_no_dependency_until_a_public_name_is_used() -> None:
    """The public API is lazy: `import dyngen` (a CLI's, a worker's, a trainer's first line)
    costs nothing until a name is used, and then only what that name needs."""
    probe = """
import sys
import dyngen
heavy = ("prefect", "datasets", "omegaconf", "pyarrow", "torch", "transformers")
print(sorted(m for m in sys.modules if m.split(".")[0] in heavy or m.startswith("dyngen")))
dyngen.RowFilter
print(sorted(m for m in sys.modules if m.split(".")[0] in ("prefect", "torch")))
"""
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True).stdout.splitlines()
    assert out[0] == "['dyngen']"
    assert out[1] == "[]"  # a core name does not pull the Prefect layer in
