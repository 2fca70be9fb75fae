"""The `dyngen` command: inspect, import, export and repair versioned datasets.

Exit codes: 0 ok, 1 `verify` found problems, 2 a user error (any DyngenError, a bad
path, a usage mistake), 3 an unexpected exception (rerun with --debug for the traceback).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from dyngen.cli import inbox as cli_inbox
from dyngen.cli import maintenance as cli_maintenance
from dyngen.cli import rounds as cli_rounds
from dyngen.cli.group import DEBUG_ENV, EXIT_PROBLEMS, DyngenGroup
from dyngen.cli.support import (
    JsonOpt,
    Name,
    State,
    VersionOpt,
    add_row,
    get_state,
    make_table,
)
from dyngen.cli.trainers import emit_command, follow_command
from dyngen.errors import ConfigError, DatasetNotFoundError, DyngenError
from dyngen.locations import ROOT_ENV
from dyngen.progress import progress_bar
from dyngen.text import clip, parse_json, prompt_text

# Nothing here imports Prefect, datasets or the store at start-up: `dyngen --help` prints
# at once, and each command imports what it uses.
__all__ = ["app", "history_table", "main"]

WIDE_LOG_COLUMNS = 120  # narrower terminals get `dyngen log`'s few columns (--wide: all)


app = typer.Typer(
    cls=DyngenGroup, no_args_is_help=True, add_completion=False,
    help="Inspect and maintain dyngen's versioned datasets.",
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _global(
    ctx: typer.Context,
    root: Annotated[str | None, typer.Option(
        envvar=ROOT_ENV, help="Store root: a folder or a URL such as s3://bucket/path "
                              "(default: $DYNGEN_STORE_ROOT, else store.root of the config)."
    )] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", help="OmegaConf YAML config file.")] = None,
    debug: Annotated[bool, typer.Option(
        "--debug", envvar=DEBUG_ENV,
        help="Show tracebacks, and Prefect's log of a round, on the terminal.")] = False,
) -> None:
    ctx.obj = State(root=root, config_path=config, debug=debug)


# ---- commands ------------------------------------------------------------------------
@app.command("import")
def import_(
    ctx: typer.Context, name: Name,
    files: Annotated[list[Path], typer.Argument(
        help="verl .parquet, .jsonl or .json (one JSON array) files.")],
    prompt_key: Annotated[str, typer.Option(help="Column holding the chat prompt.")] = "prompt",
) -> None:
    """Create a dataset at version 0 from verl-format files."""
    from dyngen.trainers.verl_format import import_files

    state = get_state(ctx)
    with progress_bar() as bar:
        rec = import_files(state.store(), name, files, prompt_key=prompt_key, progress=bar)
    state.out.print(f"imported {rec.rows} rows from {len(files)} file(s) into {name!r} "
                    f"as version {rec.version}")


@app.command("log")
def log(
    ctx: typer.Context, name: Name,
    limit: Annotated[int, typer.Option(min=1, help="How many of the newest versions.")] = 20,
    all_: Annotated[bool, typer.Option("--all", help="Every version (streamed).")] = False,
    as_json: Annotated[bool, typer.Option(
        "--json", help="One record per line as stored, oldest of the shown first.")] = False,
    wide: Annotated[bool, typer.Option(
        "--wide", help="Every column (parent, operation, event id, flow run), however "
                       "narrow the terminal; the default at 120 columns or more.")] = False,
) -> None:
    """Show the newest versions first, with each round's lineage."""
    state = get_state(ctx)
    store = state.store()
    if as_json:
        for entry in store.entries(name, limit=None if all_ else limit, oldest_first=True):
            typer.echo(json.dumps(entry.to_dict(), ensure_ascii=False))
        return
    from dyngen.round.lineage import log_tables

    wide = wide or state.out.width >= WIDE_LOG_COLUMNS
    for table in log_tables(store, name, None if all_ else limit, wide=wide):
        state.out.print(table)


@app.command("show")
def show(
    ctx: typer.Context, name: Name, version: VersionOpt = None,
    limit: Annotated[int, typer.Option(min=0, help="Rows to show.")] = 10,
    offset: Annotated[int, typer.Option(min=0, help="First row to show.")] = 0,
    rejected: Annotated[bool, typer.Option(
        "--rejected", help="Show quarantined rows with their reasons instead.")] = False,
    row: Annotated[int | None, typer.Option(
        "--row", min=0, help="Trace row N of the version back to the rows it was augmented "
                             "from (extra_info.augmented_from).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show rows of a version with their provenance (version added, round, generator)."""
    state = get_state(ctx)
    store = state.store()
    rec = store.head(name) if version is None else store.record(name, version)
    if row is not None:
        from dyngen.cli.trace import show_trace

        show_trace(state, name, rec.version, row, as_json)
        return
    ds = store.load_rejected(name, rec.version) if rejected else store.load(name, rec.version)
    stop = min(offset + limit, len(ds))
    rows = ds.select(range(offset, stop)).to_list() if offset < stop else []
    if rejected:
        for row in rows:
            row["row"] = parse_json(row.get("row"))
    from dyngen.difficulty.record import DIFFICULTY_COLUMN, DifficultyBook, shown_text

    book = None if rejected else DifficultyBook.at(store, name, rec.version)
    if book is not None:  # each row's difficulty record, as of this version
        for row in rows:
            row[DIFFICULTY_COLUMN] = book.shown(row.get(rec.prompt_key, row.get("prompt")))
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
    from dyngen.round.lineage import covered, short
    from dyngen.store.shards import GENERATOR_COLUMN, ROUND_COLUMN, VERSION_COLUMN

    if covered(rec):  # the batch ends whose round made this version
        state.out.print(f"{name} v{rec.version} covers {covered(rec)}", markup=False,
                        soft_wrap=True)

    prompt_key = str(state.config().data.prompt_key)
    if rejected:
        table = make_table(title, "#", "reason", "detail", "prompt")
        for i, row in enumerate(rows, offset):
            original = row["row"] if isinstance(row["row"], dict) else {}
            add_row(table, str(i), row.get("reason") or "", clip(row.get("detail") or "", 60),
                          prompt_text(original.get(prompt_key, original.get("prompt"))))
    else:
        table = make_table(title, "#", "added in", "round", "generator", "source",
                           "difficulty", "prompt")
        for i, row in enumerate(rows, offset):
            add_row(table, str(i), f"v{row.get(VERSION_COLUMN)}",
                          short(row.get(ROUND_COLUMN)), row.get(GENERATOR_COLUMN) or "-",
                          str(row.get("data_source", "")), shown_text(row[DIFFICULTY_COLUMN]),
                          prompt_text(row.get(prompt_key, row.get("prompt"))))
    state.out.print(table)


@app.command("export")
def export(
    ctx: typer.Context, name: Name,
    out: Annotated[str, typer.Argument(
        metavar="DEST", help="parquet: the output .parquet file. delta: the Delta table's "
                             "folder or URL (s3://bucket/mirrors/NAME).")],
    version: Annotated[int | None, typer.Option(
        "--version", "-v", help="Version number (default: head); delta: mirror up to it.")]
    = None,
    with_provenance: Annotated[bool, typer.Option(
        "--with-provenance", help="parquet: keep the _dyngen_* provenance columns.")] = False,
    format_: Annotated[str, typer.Option(
        "--format", help="parquet: one file verl's data.train_files reads. delta: a Delta "
                         "Lake mirror, one commit per version, brought up to date each run.")]
    = "parquet",
) -> None:
    """Write a version as one parquet file, or keep a Delta Lake mirror of every version."""
    state = get_state(ctx)
    store = state.store()
    if format_ == "delta":
        _export_delta(state, name, out, version, with_provenance)
        return
    if format_ != "parquet":
        raise ConfigError(f"--format: expected parquet or delta, found {format_!r}.")
    from dyngen.trainers.verl_format import export_version

    rec = store.head(name) if version is None else store.record(name, version)
    with progress_bar() as bar:
        path = export_version(store, name, out, version=rec.version,
                              with_provenance=with_provenance, progress=bar)
    state.out.print(f"exported {rec.rows} rows of {name!r} version {rec.version} to {path}",
                    markup=False)


def _export_delta(state: State, name: str, dest: str, version: int | None,
                  with_provenance: bool) -> None:
    from dyngen.mirror import mirror_dataset

    if with_provenance:
        raise ConfigError("--with-provenance applies to --format parquet: a Delta mirror "
                          "always holds the _dyngen_* columns (its rows are the version's).")
    with progress_bar() as bar:
        done = mirror_dataset(state.store(), name, state.config().mirror, dest=dest,
                              up_to=version, progress=bar)
    if not done.committed:
        state.out.print(f"the Delta mirror {done.dest} of {name!r} is current (version "
                        f"{done.version}); nothing to do", markup=False)
        return
    gone = f"; deleted {done.deleted_files} file(s) retention removed" if done.deleted_files \
        else ""
    state.out.print(f"mirrored {name!r} versions {done.committed[0]}..{done.committed[-1]} to "
                    f"{done.dest} as Delta versions of the same numbers{gone}", markup=False)


@app.command("verify")
def verify_(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Argument(help="Dataset name.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Verify every dataset.")] = False,
) -> None:
    """Check every version record and shard; exit 1 if anything is damaged."""
    state = get_state(ctx)
    store = state.store()
    if (name is None) == (not all_):
        raise typer.BadParameter("give a dataset name or --all, not both and not neither")
    names = store.list_datasets() if all_ else [name or ""]
    if not names:
        state.out.print(f"no datasets under {store.root}", markup=False)
    damaged = False
    for dataset in names:
        if not store.dataset_exists(dataset):
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

    state = get_state(ctx)
    with progress_bar() as bar:
        path = write_report(state.store(), name, out, newest=newest, progress=bar)
    state.out.print(f"wrote the report of {name!r} to {path.resolve()}", markup=False)


@app.command("restore")
def restore(
    ctx: typer.Context, name: Name,
    version: Annotated[int, typer.Argument(help="The version whose rows to restore.")],
) -> None:
    """Commit a new version whose rows are exactly those of an earlier one."""
    state = get_state(ctx)
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
    state = get_state(ctx)
    removed = gc(state.store(), name, grace_seconds=grace_seconds, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for rel in removed:
        state.out.print(f"{verb} {rel}", markup=False)
    state.out.print(f"{verb} {len(removed)} file(s)" if removed else "nothing to remove")


@app.command("datasets")
def datasets_(ctx: typer.Context) -> None:
    """List the datasets under the store root with their head version and rows."""
    state = get_state(ctx)
    store = state.store()
    names = store.list_datasets()
    if not names:
        state.out.print(f"no datasets under {store.root}", markup=False)
        return
    table = make_table(f"datasets in {store.root}", "name", "head", "rows", "created")
    for dataset in names:
        try:
            head = store.head(dataset)
        except DyngenError as exc:
            table.add_row(Text(dataset), Text("damaged", style="red"), "",
                          Text(clip(str(exc), 60)))
            continue
        add_row(table, dataset, f"v{head.version}", str(head.rows),
                 head.created_at[:19].replace("T", " "))
    state.out.print(table)


def gc(*args: Any, **kwargs: Any) -> list[str]:
    """`dyngen.store.gc`, imported when `dyngen gc` runs."""
    from dyngen.store import gc as store_gc

    return store_gc(*args, **kwargs)


def verify(*args: Any, **kwargs: Any) -> list[Any]:
    """`dyngen.store.verify`, imported when `dyngen verify` runs."""
    from dyngen.store import verify as store_verify

    return store_verify(*args, **kwargs)


def __getattr__(name: str) -> Any:
    if name == "history_table":  # kept importable from here, loaded on first use
        from dyngen.round.lineage import history_table

        return history_table
    raise AttributeError(f"module 'dyngen.cli' has no attribute {name!r}")


cli_maintenance.register(app)
cli_inbox.register(app)
cli_rounds.register(app)
# The trainer-facing commands live in their own module; registered here, on this app.
app.command("emit")(emit_command)
app.command("follow")(follow_command)


def main() -> None:
    """Entry point of the `dyngen` console script."""
    from dyngen.runtime.quick_exit import exit_after_cleanup, set_exit_code

    # Ctrl-C on `dyngen serve` must not wait for the interpreter to free Prefect's modules
    # (serve and follow ask for it: dyngen.runtime.quick_exit).
    exit_after_cleanup()
    try:
        app()
    except SystemExit as done:
        set_exit_code(done.code)
        raise
    except BaseException:
        set_exit_code(1)
        raise
