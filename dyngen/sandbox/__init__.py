"""Running model-written Python safely: `run_python(program, function, argument)`.

    result = run_python("def f(x):\n    return sorted(x)", "f", [3, 1, 2])
    result.ok, result.value            # True, '[1, 2, 3]'

Layers, outermost first (each holds without the ones inside it):
  bwrap.py   bubblewrap: a read-only view of the interpreter, its standard library and
             the system's shared libraries only, an empty bounded /tmp, its own PID,
             network, IPC and UTS namespaces, a new session, a cleared environment, an
             unprivileged uid;
  runner.py  rlimits set before the program runs: CPU seconds, address space, file size,
             one process (no fork), open files, no core;
  run.py     the wall-clock timeout, after which the sandbox's whole PID namespace is
             killed; output and the value's size bounded; the argument and the value cross
             as Python literals, never pickles;
  screen.py  first, a fast AST filter that refuses imports of os, sys, subprocess, socket,
             ctypes, ... ("forbidden") before anything runs.
`run_deterministic` runs a call twice (two hash seeds) and reports "nondeterministic" when
the values differ (`same_value`: compared as literals, so dict and set order do not count).
`require_bwrap()` raises SandboxUnavailableError where bubblewrap cannot run;
`isolation="unisolated"` runs without it (rlimits and timeout only).
"""

from dyngen.errors import SandboxError, SandboxInputError, SandboxUnavailableError
from dyngen.sandbox.probe import bwrap_available, require_bwrap
from dyngen.sandbox.process import SandboxResult
from dyngen.sandbox.run import ISOLATIONS, REASONS, run_deterministic, run_python
from dyngen.sandbox.screen import screen
from dyngen.sandbox.values import argument_literal, same_value

__all__ = [
    "ISOLATIONS",
    "REASONS",
    "SandboxError",
    "SandboxInputError",
    "SandboxResult",
    "SandboxUnavailableError",
    "argument_literal",
    "bwrap_available",
    "require_bwrap",
    "run_deterministic",
    "run_python",
    "same_value",
    "screen",
]
