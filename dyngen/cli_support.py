"""What every `dyngen` command module shares: the global state, options and formatting."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from dyngen.store import LogEntry, Store

if TYPE_CHECKING:
    from omegaconf import DictConfig  # imported when a command needs the config

ROOT_ENV = "DYNGEN_STORE_ROOT"
LOG_CHUNK = 500  # versions per table of `dyngen log --all`


@dataclass
class State:
    """What the global options resolve to, shared by every command."""

    root: str | None  # a folder or a URL (a Path would turn s3://b into s3:/b)
    config_path: Path | None
    debug: bool
    # Consoles are made per invocation so they see the streams and COLUMNS of that run.
    out: Console = field(default_factory=lambda: make_console())
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
            from dyngen.store.location import store_settings

            # --root names the store; how to reach it (store.*) comes from the config.
            settings = store_settings(self.config().store)
            if self.root is not None:
                settings["root"] = self.root
            self._store = Store.from_config(settings)
        return self._store


def make_console(stderr: bool = False) -> Console:
    # Rich wraps to 80 columns when not on a terminal; piped tables stay readable wider.
    stream = sys.stderr if stderr else sys.stdout
    piped = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(stderr=stderr, highlight=False, width=160 if piped else None)



Name = Annotated[str, typer.Argument(help="Dataset name.")]
VersionOpt = Annotated[int | None, typer.Option("--version", "-v",
                                                 help="Version number (default: head).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON lines for scripts.")]


def get_state(ctx: typer.Context) -> State:
    """The State the global options made."""
    return ctx.find_object(State)  # type: ignore[return-value]


def history_table(store: Store, name: str, limit: int | None = 20) -> Table:
    """The newest `limit` versions (all if None), newest first, with lineage columns."""
    return next(log_tables(store, name, limit, chunk=None))


def log_tables(store: Store, name: str, limit: int | None,
               chunk: int | None = LOG_CHUNK) -> Iterator[Table]:
    """The log newest first as tables of `chunk` versions each: memory stays bounded."""
    head = store.head_version(name)
    if head is None:
        store.head(name)  # refuses a missing dataset by name
        return
    entries = store.entries(name, limit=limit)
    shown = head + 1 if limit is None else min(limit, head + 1)
    title = f"{name} (newest {shown} of {head + 1} versions)"
    table = _log_table(title)
    child = None
    for entry in entries:
        if child is not None:
            _log_row(table, child, entry.rows)
            if chunk is not None and table.row_count >= chunk:
                yield table
                table = _log_table(None)
        child = entry
    if child is not None:  # the oldest shown: its parent is one more record to read
        parent = child.parent
        parent_rows = store.log(name).entry(parent).rows if parent is not None else None
        _log_row(table, child, parent_rows)
    yield table


def _log_table(title: str | None) -> Table:
    table = Table(title=escape(title) if title else None, show_header=title is not None)
    for col in ("version", "parent", "operation", "rows", "created", "generator", "trigger",
                "counts", "run"):
        table.add_column(col, justify="right" if col in ("version", "parent", "rows") else "left")
    return table


def _log_row(table: Table, entry: LogEntry, parent_rows: int | None) -> None:
    delta = "" if parent_rows is None else f" ({entry.rows - parent_rows:+d})"
    add_row(
        table, str(entry.version), "-" if entry.parent is None else str(entry.parent),
        operation_text(entry), f"{entry.rows}{delta}", entry.created_at[:19].replace("T", " "),
        *lineage_cells(entry.lineage),
    )


def make_table(title: str, *columns: str) -> Table:
    """A table with a title and folding columns."""
    table = Table(title=escape(title))
    for col in columns:
        table.add_column(col, overflow="fold")
    return table


def add_row(table: Table, *cells: str) -> None:
    """Add cells as plain text: user data is never parsed as rich markup."""
    table.add_row(*(Text(cell) for cell in cells))


def operation_text(rec: LogEntry) -> str:
    """The operation, with what it did where that fits in a few words."""
    compaction = as_dict(rec.lineage.get("compaction"))
    if rec.operation == "compact" and compaction:
        return (f"compact ({compaction.get('shards_in', '?')} → "
                f"{compaction.get('shards_out', '?')} shards)")
    retention = as_dict(rec.lineage.get("retention"))
    if rec.operation == "vacuum" and retention.get("expired_before"):
        return f"vacuum (< v{retention['expired_before']} expired)"
    restored = rec.lineage.get("restored_from")
    if rec.operation == "restore" and restored is not None:
        return f"restore v{restored}"
    imported = rec.lineage.get("imported_from")
    if isinstance(imported, list) and imported:
        return f"import ({len(imported)} file{'s' if len(imported) > 1 else ''})"
    return rec.operation


def lineage_cells(lineage: dict[str, Any]) -> tuple[str, str, str, str]:
    """Generator, trigger, counts and run id, compact; lineage is free-form, so be lenient."""
    generator = as_dict(lineage.get("generator")).get("class") or ""
    trigger = as_dict(lineage.get("trigger"))
    parts = [f"step {trigger['step']}"] if trigger.get("step") is not None else []
    if trigger.get("event_id"):
        parts.append(short(trigger["event_id"]))
    counts = as_dict(lineage.get("counts"))
    count_text = ""
    if counts:
        count_text = f"kept {counts.get('kept', '?')}/{counts.get('generated', '?')}"
        reasons = as_dict(counts.get("rejected"))
        if reasons:
            count_text += " · " + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items()))
    run = lineage.get("flow_run_id")
    return (str(generator).rsplit(".", 1)[-1], " · ".join(parts), count_text,
            short(run) if run else "")


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def short(value: Any, n: int = 8) -> str:
    return "-" if value is None else str(value)[:n]
