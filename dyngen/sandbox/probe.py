"""Whether bubblewrap can run here: tried once per process, with a clear error if not."""

from __future__ import annotations

import functools

from dyngen.errors import SandboxUnavailableError
from dyngen.sandbox.bwrap import bwrap_path
from dyngen.sandbox.process import execute
from dyngen.sandbox.seccomp import seccomp_problem

_ADVICE = ("Code tasks run model-written programs only inside bubblewrap. Install it "
           "(Debian/Ubuntu: apt-get install bubblewrap), or where it cannot run (a container "
           "without user namespaces, AppArmor's unprivileged_userns restriction), set "
           "data.datagen.sandbox=unisolated to run them with rlimits and a timeout only, "
           "without isolation, at your own risk.")


@functools.cache
def bwrap_problem() -> str | None:
    """Why bubblewrap cannot run a trivial program here, or None if it can."""
    if bwrap_path() is None:
        return "bwrap is not on PATH"
    if (problem := seccomp_problem()) is not None:
        return problem
    result = execute("def f(x):\n    return x + 1\n", "f", "41", timeout_seconds=30,
                     memory_mb=256, isolation="bwrap")
    if result.ok and result.value == "42":
        return None
    return f"a trial run in bwrap gave {result.reason}: {result.detail}"


def require_bwrap() -> None:
    """Raise SandboxUnavailableError, saying what to do, unless bubblewrap runs here."""
    if (problem := bwrap_problem()) is not None:
        raise SandboxUnavailableError(f"The sandbox cannot run: {problem}. {_ADVICE}")


def bwrap_available() -> bool:
    """Whether bubblewrap runs here (the first call tries it, later ones remember)."""
    return bwrap_problem() is None
