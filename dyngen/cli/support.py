"""What every `dyngen` command module shares: the global state, options and formatting."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:  # imported when a command needs them: `dyngen --help` stays quick
    from omegaconf import DictConfig

    from dyngen.store import Store



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
            from dyngen.store import Store
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


def make_table(title: str, *columns: str) -> Table:
    """A table with a title and folding columns."""
    table = Table(title=escape(title))
    for col in columns:
        table.add_column(col, overflow="fold")
    return table


def add_row(table: Table, *cells: str) -> None:
    """Add cells as plain text: user data is never parsed as rich markup."""
    table.add_row(*(Text(cell) for cell in cells))
