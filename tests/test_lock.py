"""The lock (constraints/*.txt, made by `bash scripts/lock.sh`) still fits pyproject.toml.

Each file pins every package of one environment the scripts build, and scripts/install.sh
passes it to every install into that environment as --constraint. A dependency added to
pyproject.toml (in the base or in an extra the environment installs) that the lock does not
pin, or a range that leaves the pinned version out, fails here: refresh the lock (`bash
scripts/lock.sh`, docs/contributing.md). Offline and without a resolver: pyproject.toml
with tomllib, the lock and the requirements with `packaging`.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the lock is for 3.11

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / "constraints"
# The scripts that build environments, each naming its lock (LOCK=...) for scripts/install.sh.
SCRIPTS = [ROOT / "scripts" / "setup.sh", ROOT / "scripts" / "setup-verl.sh"]
_HEADER = re.compile(r"^# (python|extras|requirements|no-deps): (.*)$")
_RESOLVED_ON = re.compile(r"resolved on CPython (\d+\.\d+\.\d+)")


@dataclass(frozen=True)
class Lock:
    """One constraints file: what its header says it covers, and its pins."""

    path: Path
    python: str  # "3.11"
    python_full: str | None  # the interpreter it was resolved on, "3.11.7"
    extras: tuple[str, ...]
    requirements: tuple[str, ...]  # what the set-up script installs beside the extras
    no_deps: tuple[str, ...]  # installed with --no-deps
    pins: dict[str, Version]

    @property
    def name(self) -> str:
        return self.path.stem


def read_lock(path: Path) -> Lock:
    header: dict[str, str] = {}
    pins: dict[str, Version] = {}
    for line in path.read_text().splitlines():
        if match := _HEADER.match(line):
            header.setdefault(match[1], match[2])
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        req = Requirement(text)
        (spec,) = req.specifier  # one `name==version` a line
        assert spec.operator == "==", f"{path.name}: {line!r} is not a pin"
        name = canonicalize_name(req.name)
        assert name not in pins, f"{path.name}: {name} is pinned twice"
        pins[name] = Version(spec.version)
    missing = {"python", "extras", "requirements", "no-deps"} - set(header)
    assert not missing, f"{path.name}: its header lacks {sorted(missing)}; run bash scripts/lock.sh"

    def listed(value: str, sep: str | None = None) -> tuple[str, ...]:
        return () if value == "(none)" else tuple(v for v in value.split(sep) if v)

    full = _RESOLVED_ON.search(header["python"])
    return Lock(path, header["python"].split()[0], full[1] if full else None,
                listed(header["extras"], ","), listed(header["requirements"]),
                listed(header["no-deps"]), pins)


def all_locks() -> list[Lock]:
    return [read_lock(path) for path in sorted(LOCKS.glob("*.txt"))]


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirements_of(project: dict, extras: tuple[str, ...]) -> list[Requirement]:
    """The base dependencies and those of `extras` (an extra naming dyngen[...] expands)."""
    name = canonicalize_name(project["name"])
    optional = project.get("optional-dependencies", {})
    found: list[Requirement] = []
    todo: list[str | None] = [None, *extras]  # None: the base dependencies
    seen: set[str | None] = set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        assert extra is None or extra in optional, f"pyproject.toml has no extra {extra!r}"
        for text in project.get("dependencies", []) if extra is None else optional[extra]:
            req = Requirement(text)
            if canonicalize_name(req.name) == name:
                todo += sorted(req.extras)
            else:
                found.append(req)
    return found


def problems(lock: Lock, project: dict) -> list[str]:
    """Each requirement the environment installs that its lock does not pin, or pins outside
    the requirement's range."""
    env = {str(k): str(v) for k, v in default_environment().items()}
    env.update(python_version=lock.python, python_full_version=lock.python_full
               or f"{lock.python}.0", sys_platform="linux", platform_system="Linux",
               platform_machine="x86_64", os_name="posix", implementation_name="cpython",
               platform_python_implementation="CPython", extra="")
    wanted = [(req, "pyproject.toml") for req in requirements_of(project, lock.extras)]
    wanted += [(Requirement(r), "the set-up script") for r in lock.requirements + lock.no_deps]
    found = []
    for req, origin in wanted:
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = canonicalize_name(req.name)
        pinned = lock.pins.get(name)
        if pinned is None:
            found.append(f"{lock.path.name} does not pin {name} ({origin}: {req})")
        elif not req.specifier.contains(pinned, prereleases=True):
            found.append(f"{lock.path.name} pins {name}=={pinned}, outside {origin}'s {req}")
    return found


def test_there_is_a_lock_for_each_environment_the_scripts_build() -> None:
    names = {lock.name for lock in all_locks()}
    for script in SCRIPTS:
        used = set(re.findall(r"\bLOCK=([\w-]+)", script.read_text()))
        assert used, f"{script.name} names no lock (LOCK=...)"
        assert used <= names, f"{script.name} uses {sorted(used - names)}: not in constraints/"
    assert {"test", "demo", "verl"} <= names


@pytest.mark.parametrize("name", ["test", "demo", "verl"])
def test_the_lock_pins_every_requirement_within_its_range(name: str) -> None:
    (lock,) = [lock for lock in all_locks() if lock.name == name]
    found = problems(lock, pyproject()["project"])
    assert not found, ("\n".join(found) + "\nRefresh the lock: bash scripts/lock.sh "
                       "(docs/contributing.md)")


def _commands(script: Path, command: str) -> list[list[str]]:
    """The arguments of each `command ...` line of a script (continuations joined)."""
    text = script.read_text().replace("\\\n", " ")
    return [shlex.split(line, comments=True)[1:] for line in text.splitlines()
            if line.strip().startswith(command + " ")]


def test_the_lock_headers_cover_what_the_scripts_install() -> None:
    """An extra or a package a set-up script installs is one its lock was made for: a script
    edited without editing scripts/lock.sh (and refreshing) fails here."""
    locks = {lock.name: lock for lock in all_locks()}
    found = []
    for script in SCRIPTS:
        used = [locks[n] for n in re.findall(r"\bLOCK=([\w-]+)", script.read_text())]
        for args in _commands(script, "editable_install"):
            target = re.fullmatch(r"\.(?:\[(.*)\])?", args[-1])
            assert target, f"{script.name}: editable_install {args[-1]!r} is not .[extras]"
            extras = {e for e in (target[1] or "").split(",") if e}
            if not any(extras <= set(lock.extras) for lock in used):
                found.append(f"{script.name} installs .[{','.join(sorted(extras))}]: no lock "
                             f"of {[lock.name for lock in used]} was made for those extras")
        for args in _commands(script, "pip_install"):
            for text in (a for a in args if not a.startswith("-")):
                req = Requirement(text)
                name = canonicalize_name(req.name)
                ours = [lock for lock in used
                        if name in {canonicalize_name(Requirement(r).name)
                                    for r in lock.requirements + lock.no_deps}]
                if not ours:
                    found.append(f"{script.name} installs {text}: not in the requirements or "
                                 "no-deps of its lock's header (scripts/lock.sh)")
                found += [f"{script.name} installs {text}; {lock.path.name} pins "
                          f"{name}=={lock.pins.get(name)}" for lock in ours
                          if not req.specifier.contains(lock.pins.get(name, Version("0")),
                                                        prereleases=True)]
    assert not found, "\n".join(found)


def test_the_demos_lock_holds_no_torch() -> None:
    (demo,) = [lock for lock in all_locks() if lock.name == "demo"]
    heavy = {n for n in demo.pins if n in {"torch", "triton"} or n.startswith("nvidia-")}
    assert not heavy, f"constraints/demo.txt pins {sorted(heavy)}; the demo installs no torch"


def test_the_check_finds_an_unpinned_dependency_and_a_pin_out_of_range() -> None:
    lock = read_lock(LOCKS / "demo.txt")
    project = pyproject()["project"]
    project = {**project, "dependencies": [*project["dependencies"], "not-a-pinned-package>=1",
                                           "prefect>=999"]}
    found = problems(lock, project)
    assert any("does not pin not-a-pinned-package" in p for p in found), found
    assert any("pins prefect==" in p and "outside" in p for p in found), found
