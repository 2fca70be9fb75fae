"""`dyngen pending`: the batch ends in a dataset's inbox that no version covers yet."""

from __future__ import annotations

import json

import typer

from dyngen.cli.support import JsonOpt, Name, add_row, get_state, make_table
from dyngen.errors import DatasetNotFoundError


def pending(ctx: typer.Context, name: Name, as_json: JsonOpt = False) -> None:
    """List the batch ends trainers wrote that no version covers yet: the next round
    covers them all."""
    state = get_state(ctx)
    store = state.store()
    if not store.dataset_exists(name):  # a typo is a user error, not an empty inbox
        raise DatasetNotFoundError(
            f"dataset {name!r} does not exist; `dyngen datasets` lists them.")
    entries = store.pending(name)
    if as_json:
        for entry in entries:
            typer.echo(json.dumps({
                "run": entry.run, "step": entry.step, "written_at": entry.written_at,
                "event_id": entry.event_id, "metrics": dict(entry.metrics),
                "rollouts": None if entry.rollouts is None else entry.rollouts.rows,
            }, ensure_ascii=False))
        return
    head = store.head_version(name)
    at = "" if head is None else f" at v{head}"
    if not entries:
        state.out.print(f"{name}: nothing pending{at}: every batch end in its inbox is "
                        "covered by a version", markup=False)
        return
    table = make_table(f"{name}: {len(entries)} batch end(s) pending{at}", "run", "step",
                       "written (UTC)", "metrics", "rollouts")
    for entry in entries:
        add_row(table, entry.run, str(entry.step), entry.written_at[:19].replace("T", " "),
                str(len(entry.metrics)),
                "-" if entry.rollouts is None else str(entry.rollouts.rows))
    state.out.print(table)


def register(app: typer.Typer) -> None:
    """Add the inbox commands to `app`."""
    app.command("pending")(pending)
