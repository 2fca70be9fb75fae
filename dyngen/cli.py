"""The `dyngen` command: inspect, import, export and repair versioned datasets.

Exit codes: 0 ok, 1 `verify` found problems, 2 a user error (any DyngenError, a bad
path, a usage mistake), 3 an unexpected exception (rerun with --debug for the traceback).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from omegaconf import DictConfig
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from dyngen.cli_trainers import emit_command, follow_command
from dyngen.errors import DatasetNotFoundError, DyngenError
from dyngen.progress import progress_bar
from dyngen.store import Store, VersionRecord, gc, verify
from dyngen.store.shards import GENERATOR_COLUMN, ROUND_COLUMN, VERSION_COLUMN
from dyngen.text import clip, parse_json, prompt_text
from dyngen.verl_format import export_version, import_files

EXIT_PROBLEMS = 1
EXIT_USER_ERROR = 2
EXIT_UNEXPECTED = 3
ROOT_ENV = "DYNGEN_STORE_ROOT"
# Exceptions typer uses for its own control flow (usage errors, --help, Exit(n)).
_TYPER_FLOW = (typer.Exit, typer.Abort, typer.TyperException)


@dataclass
class State:
    """What the global options resolve to, shared by every command."""

    root: Path | None
    config_path: Path | None
    debug: bool
    # Consoles are made per invocation so they see the streams and COLUMNS of that run.
    out: Console = field(default_factory=lambda: _console())
    _config: DictConfig | None = None
    _store: Store | None = None

    def config(self) -> DictConfig:
        """The OmegaConf config (defaults plus --config), loaded once on first use."""
        if self._config is None:
            from dyngen.config import load_config

            self._config = load_config(self.config_path)
        return self._config

    def store(self) -> Store:
        """The store at --root, else $DYNGEN_STORE_ROOT, else the config's store.root."""
        if self._store is None:
            root = self.root if self.root is not None else Path(self.config().store.root)
            self._store = Store(root)
        return self._store


class _Group(TyperGroup):
    """Runs every command inside the one error handler that maps exceptions to exit codes."""

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
            _fail(ctx, _describe(exc), EXIT_USER_ERROR, hint=_root_hint(ctx, exc))
        except Exception as exc:
            status = getattr(getattr(exc, "response", None), "status_code", None)
            if status in (401, 403):  # a Prefect server with basic auth (README: Security)
                from dyngen.server_auth import AUTH_HINT

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
    state = ctx.obj
    if isinstance(exc, DatasetNotFoundError) and isinstance(state, State) and state._store:
        return f"store root is {state._store.root} (set it with --root or ${ROOT_ENV})"
    return None


def _console(stderr: bool = False) -> Console:
    # Rich wraps to 80 columns when not on a terminal; piped tables stay readable wider.
    stream = sys.stderr if stderr else sys.stdout
    piped = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(stderr=stderr, highlight=False, width=160 if piped else None)


def _fail(ctx: Any, message: str, code: int, hint: str | None = None) -> None:
    err = _console(stderr=True)
    err.soft_wrap = True
    if ctx.params.get("debug"):
        err.print(traceback.format_exc(), markup=False, end="")
    err.print(f"error: {message}", style="red", markup=False)
    if hint:
        err.print(hint, style="dim", markup=False)
    raise typer.Exit(code)


app = typer.Typer(
    cls=_Group, no_args_is_help=True, add_completion=False,
    help="Inspect and maintain dyngen's versioned datasets.",
    context_settings={"help_option_names": ["-h", "--help"]},
)

Name = Annotated[str, typer.Argument(help="Dataset name.")]
VersionOpt = Annotated[int | None, typer.Option("--version", "-v",
                                                 help="Version number (default: head).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON lines for scripts.")]


@app.callback()
def _global(
    ctx: typer.Context,
    root: Annotated[Path | None, typer.Option(
        envvar=ROOT_ENV, help="Store root (default: $DYNGEN_STORE_ROOT, else store.root "
                              "of the config).")] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", help="OmegaConf YAML config file.")] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
) -> None:
    ctx.obj = State(root=root, config_path=config, debug=debug)


def _state(ctx: typer.Context) -> State:
    return ctx.find_object(State)  # type: ignore[return-value]


# ---- commands ------------------------------------------------------------------------
@app.command("import")
def import_(
    ctx: typer.Context, name: Name,
    files: Annotated[list[Path], typer.Argument(help="verl .parquet or .jsonl files.")],
    prompt_key: Annotated[str, typer.Option(help="Column holding the chat prompt.")] = "prompt",
) -> None:
    """Create a dataset at version 0 from verl-format files."""
    state = _state(ctx)
    with progress_bar() as bar:
        rec = import_files(state.store(), name, files, prompt_key=prompt_key, progress=bar)
    state.out.print(f"imported {rec.rows} rows from {len(files)} file(s) into {name!r} "
                    f"as version {rec.version}")


@app.command("log")
def log(ctx: typer.Context, name: Name, as_json: JsonOpt = False) -> None:
    """Show the version history with each round's lineage."""
    state = _state(ctx)
    history = state.store().history(name)
    if as_json:
        for rec in history:
            typer.echo(json.dumps(asdict(rec), ensure_ascii=False))
        return
    state.out.print(history_table(state.store(), name, history))


def history_table(store: Store, name: str, history: list[VersionRecord] | None = None) -> Table:
    """The history of a dataset as a rich table with lineage columns."""
    history = store.history(name) if history is None else history
    rows_of = {r.version: r.rows for r in history}
    table = Table(title=f"{name} ({len(history)} versions)")
    for col in ("version", "parent", "operation", "rows", "created", "generator", "trigger",
                "counts", "run"):
        table.add_column(col, justify="right" if col in ("version", "parent", "rows") else "left")
    for rec in history:
        delta = "" if rec.parent not in rows_of else f" ({rec.rows - rows_of[rec.parent]:+d})"
        _add_row(
            table, str(rec.version), "-" if rec.parent is None else str(rec.parent),
            _operation(rec), f"{rec.rows}{delta}", rec.created_at[:19].replace("T", " "),
            *_lineage_cells(rec.lineage),
        )
    return table


@app.command("show")
def show(
    ctx: typer.Context, name: Name, version: VersionOpt = None,
    limit: Annotated[int, typer.Option(min=0, help="Rows to show.")] = 10,
    offset: Annotated[int, typer.Option(min=0, help="First row to show.")] = 0,
    rejected: Annotated[bool, typer.Option(
        "--rejected", help="Show quarantined rows with their reasons instead.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Show rows of a version with their provenance (version added, round, generator)."""
    state = _state(ctx)
    store = state.store()
    rec = store.head(name) if version is None else store.record(name, version)
    ds = store.load_rejected(name, rec.version) if rejected else store.load(name, rec.version)
    stop = min(offset + limit, len(ds))
    rows = ds.select(range(offset, stop)).to_list() if offset < stop else []
    if rejected:
        for row in rows:
            row["row"] = parse_json(row.get("row"))
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row, ensure_ascii=False, default=str))
        return
    what = "rejected rows" if rejected else "rows"
    title = f"{name} v{rec.version}: {what} {offset}..{max(stop - 1, offset)} of {len(ds)}"
    if not rows:
        state.out.print(f"{name} v{rec.version}: no {what} at offset {offset} "
                        f"(there are {len(ds)})", markup=False)
        return
    prompt_key = str(state.config().data.prompt_key)
    if rejected:
        table = _table(title, "#", "reason", "detail", "prompt")
        for i, row in enumerate(rows, offset):
            original = row["row"] if isinstance(row["row"], dict) else {}
            _add_row(table, str(i), row.get("reason") or "", clip(row.get("detail") or "", 60),
                          prompt_text(original.get(prompt_key, original.get("prompt"))))
    else:
        table = _table(title, "#", "added in", "round", "generator", "source", "prompt")
        for i, row in enumerate(rows, offset):
            _add_row(table, str(i), f"v{row.get(VERSION_COLUMN)}",
                          _short(row.get(ROUND_COLUMN)), row.get(GENERATOR_COLUMN) or "-",
                          str(row.get("data_source", "")),
                          prompt_text(row.get(prompt_key, row.get("prompt"))))
    state.out.print(table)


@app.command("export")
def export(
    ctx: typer.Context, name: Name,
    out: Annotated[Path, typer.Argument(help="Output .parquet file.")],
    version: VersionOpt = None,
    with_provenance: Annotated[bool, typer.Option(
        "--with-provenance", help="Keep the _dyngen_* provenance columns.")] = False,
) -> None:
    """Write a version as one parquet file that verl's data.train_files reads."""
    state = _state(ctx)
    store = state.store()
    rec = store.head(name) if version is None else store.record(name, version)
    with progress_bar() as bar:
        path = export_version(store, name, out, version=rec.version,
                              with_provenance=with_provenance, progress=bar)
    state.out.print(f"exported {rec.rows} rows of {name!r} version {rec.version} to {path}",
                    markup=False)


@app.command("verify")
def verify_(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Argument(help="Dataset name.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Verify every dataset.")] = False,
) -> None:
    """Check every version record and shard; exit 1 if anything is damaged."""
    state = _state(ctx)
    store = state.store()
    if (name is None) == (not all_):
        raise typer.BadParameter("give a dataset name or --all, not both and not neither")
    names = store.list_datasets() if all_ else [name or ""]
    if not names:
        state.out.print(f"no datasets under {store.root}", markup=False)
    damaged = False
    for dataset in names:
        if not store.dataset_dir(dataset).is_dir():
            # A typo is a user error (exit 2), not damage (exit 1).
            raise DatasetNotFoundError(
                f"dataset {dataset!r} does not exist; `dyngen datasets` lists them.")
        with progress_bar() as bar:
            problems = verify(store, dataset, progress=bar)
        damaged = damaged or bool(problems)
        for problem in problems:
            state.out.print(f"{dataset}: {problem}", style="red", markup=False, soft_wrap=True)
        if problems:
            state.out.print(f"{dataset}: {len(problems)} problem(s)", markup=False)
        else:
            head, count = store.head(dataset), len(store.versions(dataset))
            state.out.print(f"ok: {dataset}: {count} versions, head v{head.version} with "
                            f"{head.rows} rows", markup=False)
    if damaged:
        raise typer.Exit(EXIT_PROBLEMS)


@app.command("report")
def report(
    ctx: typer.Context, name: Name,
    out: Annotated[Path, typer.Option("--out", "-o", help="The HTML file to write.")]
    = Path("report.html"),
    newest: Annotated[int, typer.Option(
        min=0, help="Draw the newest N versions (0: all).")] = 1000,
) -> None:
    """Write the dataset's history as one self-contained HTML page of charts."""
    from dyngen.report import write_report

    state = _state(ctx)
    with progress_bar() as bar:
        path = write_report(state.store(), name, out, newest=newest, progress=bar)
    state.out.print(f"wrote the report of {name!r} to {path.resolve()}", markup=False)


@app.command("restore")
def restore(
    ctx: typer.Context, name: Name,
    version: Annotated[int, typer.Argument(help="The version whose rows to restore.")],
) -> None:
    """Commit a new version whose rows are exactly those of an earlier one."""
    state = _state(ctx)
    rec = state.store().restore(name, version)
    state.out.print(f"restored {name!r} version {version} as version {rec.version} "
                    f"({rec.rows} rows)", markup=False)


@app.command("gc")
def gc_(
    ctx: typer.Context, name: Name,
    grace_seconds: Annotated[float, typer.Option(
        min=0, help="Keep unreferenced files younger than this (a round may be in flight).")]
    = 3600.0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List, do not delete.")] = False,
) -> None:
    """Remove shards and temp files that no version names."""
    state = _state(ctx)
    removed = gc(state.store(), name, grace_seconds=grace_seconds, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for rel in removed:
        state.out.print(f"{verb} {rel}", markup=False)
    state.out.print(f"{verb} {len(removed)} file(s)" if removed else "nothing to remove")


@app.command("round")
def round_(
    ctx: typer.Context, name: Name,
    overrides: Annotated[list[str] | None, typer.Argument(
        help="Config overrides as verl users type them, e.g. data.max_prompt_length=512.")] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", help="OmegaConf YAML config file (overrides the global --config).")] = None,
    step: Annotated[int | None, typer.Option(help="Training step that triggers the round.")] = None,
    event_id: Annotated[str | None, typer.Option(
        help="Trigger id; a round with an id already committed commits nothing.")] = None,
    rollouts: Annotated[Path | None, typer.Option(
        help="The batch's rollouts file (JSONL of prompt and score) for the generator; its "
             "folder is allowed for this run.")] = None,
) -> None:
    """Run one generation round now, as a Prefect flow run, and print what it committed."""
    from omegaconf import OmegaConf

    from dyngen.config import load_config
    from dyngen.local_server import ensure_prefect_api
    from flows.in_process import run_round

    state = _state(ctx)
    cfg = load_config(config or state.config_path, overrides or [])
    if state.root is not None:
        cfg.store.root = str(state.root)
    ensure_prefect_api()  # a temporary server, if any, starts now, patiently and announced
    if rollouts is not None:
        # The user at this shell names the file, not an event: its folder is allowed for
        # this one run (the size bound still holds).
        rollouts = rollouts.resolve()
        cfg.round.rollouts_dirs = [*cfg.round.rollouts_dirs, str(rollouts.parent)]
    given = {"step": step, "event_id": event_id,
             "rollouts": str(rollouts) if rollouts else None}
    trigger = {k: v for k, v in given.items() if v is not None}
    result = run_round(name, config=OmegaConf.to_container(cfg, resolve=True),
                       trigger=trigger or None)
    counts = result["counts"]
    if result["created"]:
        state.out.print(f"committed {name!r} version {result['version']} (parent "
                        f"{result['parent']}): {result['rows']} rows, kept {counts.get('kept')} "
                        f"of {counts.get('generated')}, rejected {counts.get('rejected') or {}}",
                        markup=False)
    else:
        state.out.print(f"already committed as version {result['version']}; nothing new",
                        markup=False)


@app.command("serve")
def serve_(
    ctx: typer.Context,
    dataset: Annotated[str | None, typer.Option(
        help="Only rounds of this dataset (default: every dataset's batch-end events).")] = None,
    overrides: Annotated[list[str] | None, typer.Argument(
        help="Config overrides passed to every round, e.g. data.max_prompt_length=512.")] = None,
    every_n_batches: Annotated[int, typer.Option(
        min=1, help="Run a round every N batch-end events.")] = 1,
    isolation: Annotated[str, typer.Option(
        help="fork: each round in a process forked from a warm one (imports nothing); "
             "process: Prefect's runner, a fresh interpreter per round (imports everything "
             "again, so it picks up changed code).")] = "fork",
    poll_seconds: Annotated[float, typer.Option(
        min=0.01, help="How often to look for rounds to start.")] = 0.2,
    max_round_seconds: Annotated[float | None, typer.Option(
        min=1, help="fork: kill a round running longer, its run TimedOut (default: "
                    "(round.retries + 1) x round.timeout_seconds + 300).")] = None,
) -> None:
    """Serve the generation round with its batch-end event trigger until interrupted."""
    from omegaconf import OmegaConf

    from dyngen.config import load_config
    from dyngen.rollouts import absolute_dirs
    from flows.serve import serve_rounds

    state = _state(ctx)
    cfg = load_config(state.config_path, overrides or [])
    if state.root is not None:
        cfg.store.root = str(state.root)
    cfg.store.root = str(Path(cfg.store.root).resolve())  # runs start in other folders
    cfg.round.rollouts_dirs = absolute_dirs(cfg.round.rollouts_dirs)
    serve_rounds(dataset, OmegaConf.to_container(cfg, resolve=True), every_n_batches,
                 isolation=isolation, poll_seconds=poll_seconds,
                 max_round_seconds=max_round_seconds)


@app.command("demo")
def demo(
    ctx: typer.Context,
    workdir: Annotated[Path, typer.Option(help="Folder for the demo's server, store and logs.")]
    = Path(".dyngen/demo"),
    batches: Annotated[int, typer.Option(min=1, help="Simulated training batches.")] = 3,
    keep_server: Annotated[bool, typer.Option(
        "--keep-server", help="Leave the Prefect server and the serve process running.")] = False,
) -> None:
    """Start a local Prefect server, serve the round, train, and watch rounds commit."""
    from dyngen.demo import run_demo

    run_demo(workdir, _state(ctx).out, batches=batches, keep_server=keep_server)


@app.command("datasets")
def datasets_(ctx: typer.Context) -> None:
    """List the datasets under the store root with their head version and rows."""
    state = _state(ctx)
    store = state.store()
    names = store.list_datasets()
    if not names:
        state.out.print(f"no datasets under {store.root}", markup=False)
        return
    table = _table(f"datasets in {store.root}", "name", "head", "rows", "created")
    for dataset in names:
        try:
            head = store.head(dataset)
        except DyngenError as exc:
            table.add_row(Text(dataset), Text("damaged", style="red"), "",
                          Text(clip(str(exc), 60)))
            continue
        _add_row(table, dataset, f"v{head.version}", str(head.rows),
                 head.created_at[:19].replace("T", " "))
    state.out.print(table)


# The trainer-facing commands live in their own module; registered here, on this app.
app.command("emit")(emit_command)
app.command("follow")(follow_command)


# ---- formatting ----------------------------------------------------------------------
def _table(title: str, *columns: str) -> Table:
    table = Table(title=escape(title))
    for col in columns:
        table.add_column(col, overflow="fold")
    return table


def _add_row(table: Table, *cells: str) -> None:
    """Add cells as plain text: user data is never parsed as rich markup."""
    table.add_row(*(Text(cell) for cell in cells))


def _operation(rec: VersionRecord) -> str:
    restored = rec.lineage.get("restored_from")
    if rec.operation == "restore" and restored is not None:
        return f"restore v{restored}"
    imported = rec.lineage.get("imported_from")
    if isinstance(imported, list) and imported:
        return f"import ({len(imported)} file{'s' if len(imported) > 1 else ''})"
    return rec.operation


def _lineage_cells(lineage: dict[str, Any]) -> tuple[str, str, str, str]:
    """Generator, trigger, counts and run id, compact; lineage is free-form, so be lenient."""
    generator = _dict(lineage.get("generator")).get("class") or ""
    trigger = _dict(lineage.get("trigger"))
    parts = [f"step {trigger['step']}"] if trigger.get("step") is not None else []
    if trigger.get("event_id"):
        parts.append(_short(trigger["event_id"]))
    counts = _dict(lineage.get("counts"))
    count_text = ""
    if counts:
        count_text = f"kept {counts.get('kept', '?')}/{counts.get('generated', '?')}"
        reasons = _dict(counts.get("rejected"))
        if reasons:
            count_text += " · " + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items()))
    run = lineage.get("flow_run_id")
    return (str(generator).rsplit(".", 1)[-1], " · ".join(parts), count_text,
            _short(run) if run else "")


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _short(value: Any, n: int = 8) -> str:
    return "-" if value is None else str(value)[:n]


def main() -> None:
    """Entry point of the `dyngen` console script."""
    app()


if __name__ == "__main__":
    main()
