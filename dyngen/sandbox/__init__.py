"""Running model-written Python safely: `run_python(program, function, argument)`.

    result = run_python("def f(x):\n    return sorted(x)", "f", [3, 1, 2])
    result.ok, result.value            # True, '[1, 2, 3]'

Runs are served by warm sandboxes (pool.py, process.py): a long-lived bwrap whose supervisor
(runner.py) forks one child per run from an already started interpreter. Layers, outermost
first (each holds without the ones inside it):
  bwrap.py    bubblewrap: a read-only view of the interpreter, its standard library and the
              system's shared libraries only, `/` and `/dev` read-only, a bounded /tmp, its
              own PID, network, IPC, UTS namespaces, a new session, a cleared environment,
              an unprivileged uid;
  seccomp.py  SysV IPC, keyrings, namespaces, mounts, bpf, io_uring, ptrace, perf and
              userfaultfd fail with EPERM;
  cgroup.py   memory (as the kernel counts it) and pids per sandbox, where one can be made;
  runner.py   per run: every inherited descriptor closed, rlimits (CPU seconds, address
              space, file size, one process, open files, no core), the timeout, the result
              written by the supervisor alone and checked for shape on both sides;
  screen.py   first, a fast AST filter that refuses imports of os, sys, subprocess,
              socket, ctypes, ... ("forbidden") before anything runs.
`run_deterministic` runs a call twice (two hash seeds) and reports "nondeterministic" when
the values differ (`same_value`: compared as literals, so dict and set order do not count).
`require_bwrap()` raises SandboxUnavailableError where bubblewrap cannot run;
`isolation="unisolated"` runs without it (the supervisor's rlimits, timeout, seccomp and
uid switch as root only).
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
