"""The `dyngen` app's command group: one error handler mapping exceptions to exit codes
and one-line messages, global options accepted after the command, and a "did you mean"
for a misspelt command or dataset."""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from typing import Any

import typer
from typer.core import TyperGroup

from dyngen.cli.support import State, make_console
from dyngen.errors import DatasetNotFoundError, DyngenError
from dyngen.locations import ROOT_ENV
from dyngen.text import closest, did_you_mean

DEBUG_ENV = "DYNGEN_DEBUG"
EXIT_PROBLEMS = 1
EXIT_USER_ERROR = 2
EXIT_UNEXPECTED = 3
# Exceptions typer uses for its own control flow (usage errors, --help, Exit(n)).
_TYPER_FLOW = (typer.Exit, typer.Abort, typer.TyperException)


class DyngenGroup(TyperGroup):
    """Runs every command inside the one error handler that maps exceptions to exit codes;
    takes the global options after the command too, and suggests a misspelt command."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, hoist_global_options(self, ctx, list(args)))

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            ctx.fail(f"No such command {name!r}.{did_you_mean(name, self.list_commands(ctx))}"
                     " `dyngen --help` lists them.")
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except _TYPER_FLOW:
            raise
        except BrokenPipeError:
            # The reader (`| head`) stopped listening: nothing is wrong, stop quietly.
            _silence_stdout()
            raise typer.Exit(0) from None
        except (DyngenError, OSError) as exc:
            _fail(ctx, _describe(exc), getattr(exc, "exit_code", EXIT_USER_ERROR),
                  hint=_root_hint(ctx, exc))
        except Exception as exc:
            status = getattr(getattr(exc, "response", None), "status_code", None)
            if status in (401, 403):  # a Prefect server with basic auth (README: Security)
                from dyngen.server.auth import AUTH_HINT

                _fail(ctx, f"the Prefect server refused the request (HTTP {status}): {exc}",
                      EXIT_USER_ERROR, hint=AUTH_HINT)
            _fail(ctx, f"unexpected {type(exc).__name__}: {exc}", EXIT_UNEXPECTED,
                  hint="this is a bug or an environment problem; rerun with --debug for "
                       "the traceback")


def _silence_stdout() -> None:
    # Not a real file (a test runner's buffer) means nothing will flush at exit either.
    with contextlib.suppress(OSError, ValueError, AttributeError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and not isinstance(exc, DyngenError) and exc.strerror:
        where = f" {exc.filename}" if exc.filename else ""
        return f"cannot access{where}: {exc.strerror}"
    return str(exc)


def _root_hint(ctx: Any, exc: BaseException) -> str | None:
    if not isinstance(exc, DatasetNotFoundError):
        return None
    state = ctx.obj
    store = getattr(exc, "store", None) or (state._store if isinstance(state, State) else None)
    if store is None:
        return None
    near = _near_dataset(store, getattr(exc, "dataset", None))
    return f"{near}store root is {store.root} (set it with --root or ${ROOT_ENV})"


def _near_dataset(store: Any, name: str | None) -> str:
    """"did you mean 'x'? " when a dataset under the root has a name like the missing one."""
    if not name:
        return ""
    try:
        near = closest(name, store.list_datasets())
    except (DyngenError, OSError):
        return ""
    return f"did you mean {near!r}? " if near else ""


# Options of the app itself (the callback's), and whether each takes a value.
GLOBAL_OPTIONS = {"--root": True, "--config": True, "--debug": False}


def hoist_global_options(group: Any, ctx: Any, args: list[str]) -> list[str]:
    """`dyngen log ds --root DIR` as `dyngen --root DIR log ds`: global options typed after
    the command move before it, unless that command has an option of the same name."""
    start = _command_index(group, ctx, args)
    if start is None:
        return args
    command = group.get_command(ctx, args[start])
    own = {opt for param in getattr(command, "params", []) for opt in param.opts}
    head, rest, moved = args[: start + 1], args[start + 1:], []
    kept: list[str] = []
    i = 0
    while i < len(rest):
        token = rest[i]
        if token == "--":
            kept.extend(rest[i:])
            break
        option, sep, _ = token.partition("=")
        if option in GLOBAL_OPTIONS and option not in own:
            takes_value = GLOBAL_OPTIONS[option] and not sep
            moved.extend(rest[i:i + 2] if takes_value else [token])
            i += 2 if takes_value else 1
            continue
        kept.append(token)
        i += 1
    return head[:start] + moved + head[start:] + kept


def _command_index(group: Any, ctx: Any, args: list[str]) -> int | None:
    """Where the command's name is in `args` (after the global options and their values)."""
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--":
            return None
        if token.startswith("-"):
            i += 2 if GLOBAL_OPTIONS.get(token.partition("=")[0]) and "=" not in token else 1
            continue
        return i if group.get_command(ctx, token) is not None else None
    return None


def _fail(ctx: Any, message: str, code: int, hint: str | None = None) -> None:
    err = make_console(stderr=True)
    err.soft_wrap = True
    if ctx.params.get("debug"):
        err.print(traceback.format_exc(), markup=False, end="")
    err.print(f"error: {message}", style="red", markup=False)
    if hint:
        err.print(hint, style="dim", markup=False)
    raise typer.Exit(code)
