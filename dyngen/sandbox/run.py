"""run_python: one call of a model-written function in a fresh sandbox, and what came of it."""

from __future__ import annotations

from typing import Any

from dyngen.errors import SandboxInputError, SandboxUnavailableError
from dyngen.sandbox.pool import pool
from dyngen.sandbox.probe import require_bwrap
from dyngen.sandbox.process import REASONS, SandboxBroken, SandboxResult, execute
from dyngen.sandbox.screen import screen
from dyngen.sandbox.values import UnshowableArgumentError, argument_literal, same_value

ISOLATIONS = ("bwrap", "unisolated")
MAX_PROGRAM_CHARS = 100_000


def _check_call(program: str, function: str, timeout_seconds: float, memory_mb: int,
                isolation: str) -> None:
    """Raise SandboxInputError, saying what was expected, for a call that cannot run."""
    if not isinstance(program, str) or len(program) > MAX_PROGRAM_CHARS:
        raise SandboxInputError(f"program: expected a str of at most {MAX_PROGRAM_CHARS} "
                                f"characters; found {type(program).__name__} of "
                                f"{len(program) if isinstance(program, str) else '?'}.")
    if not isinstance(function, str) or not function.isidentifier():
        raise SandboxInputError(f"function: expected a Python name such as 'f'; found "
                                f"{function!r}.")
    if not 0 < timeout_seconds <= 600:
        raise SandboxInputError(f"timeout_seconds: expected 0 < seconds <= 600; found "
                                f"{timeout_seconds!r}.")
    if not 64 <= memory_mb <= 65536:
        raise SandboxInputError(f"memory_mb: expected 64..65536 (the interpreter alone maps "
                                f"~30 MB); found {memory_mb!r}.")
    if isolation not in ISOLATIONS:
        raise SandboxInputError(f"isolation: expected one of {', '.join(ISOLATIONS)}; found "
                                f"{isolation!r}.")


def run_python(program: str, function: str, argument: Any, *, timeout_seconds: float = 5.0,
               memory_mb: int = 512, isolation: str = "bwrap", hash_seed: int = 0,
               max_output_bytes: int = 1 << 20, max_value_chars: int = 10_000,
               screened: bool = True) -> SandboxResult:
    """Run `function(argument)` from `program` in a sandbox; its result as data, never a raise
    for what the program does.

    The run is a fresh child of a warm sandbox (dyngen.sandbox.pool): nothing of an earlier
    run is there.

    `argument` crosses as a literal (repr, read back with ast.literal_eval), the value
    comes back as its repr: no pickle crosses. Data that cannot cross (inf, nan, an int
    too long to print, too deep) is an "error" result; a non-data argument (an object) is
    the caller's mistake: SandboxInputError. `isolation="bwrap"` (bubblewrap, rlimits,
    the process tree killed at the timeout) raises SandboxUnavailableError where bubblewrap
    cannot run; "unisolated" runs with rlimits and the timeout only. `hash_seed` is
    PYTHONHASHSEED (set order depends on it). `screened=False` skips the AST filter, to
    show that the sandbox holds without it.
    """
    _check_call(program, function, timeout_seconds, memory_mb, isolation)
    try:
        literal = argument_literal(argument)
    except UnshowableArgumentError as error:  # hostile data is a result, never a raise
        return SandboxResult.failed("error", str(error))
    if screened and (why := screen(program)):
        return SandboxResult.failed("forbidden", why)
    if isolation == "bwrap":
        require_bwrap()
    try:
        return pool().run(program, function, literal, isolation=isolation,
                          hash_seed=hash_seed, memory_mb=memory_mb,
                          timeout_seconds=timeout_seconds, max_output_bytes=max_output_bytes,
                          max_value_chars=max_value_chars)
    except (SandboxBroken, TimeoutError) as error:
        return SandboxResult.failed("crashed", f"the sandbox did not start: {error}")


def run_deterministic(program: str, function: str, argument: Any, *, runs: int = 2,
                      **options: Any) -> SandboxResult:
    """run_python `runs` times, each with its own hash seed (0, 1, ...): the first run's
    result if every run gives the same value, else "nondeterministic" (a value that depends
    on time, randomness, set order or addresses is no label)."""
    first = run_python(program, function, argument, hash_seed=0, **options)
    for seed in range(1, runs):
        if not first.ok:
            return first
        again = run_python(program, function, argument, hash_seed=seed, **options)
        if not again.ok:
            return again
        if not same_value(again.value or "", first.value or ""):
            return SandboxResult.failed(
                "nondeterministic", f"run 1 gave {first.value[:200]}, run {seed + 1} gave "
                f"{again.value[:200]}", first.seconds + again.seconds)
    return first


__all__ = ["ISOLATIONS", "REASONS", "SandboxResult", "SandboxUnavailableError", "execute",
           "run_deterministic", "run_python"]
