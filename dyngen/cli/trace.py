"""`dyngen show NAME --row N`: a row, and the rows it was augmented from, back to the first."""

from __future__ import annotations

import json

import typer

from dyngen.cli.support import State, add_row, make_table
from dyngen.text import clip, prompt_text


def show_trace(state: State, name: str, version: int, index: int, as_json: bool) -> None:
    """Print row `index` of `version` and each source it was made from, newest first."""
    from dyngen.generators.augment.provenance import trace_row
    from dyngen.store.shards import GENERATOR_COLUMN, VERSION_COLUMN

    steps = trace_row(state.store(), name, version, index)
    if as_json:
        for step in steps:
            typer.echo(json.dumps({"version": step.version, "index": step.index,
                                   "method": step.method, "row": step.row},
                                  ensure_ascii=False, default=str))
        return
    prompt_key = str(state.config().data.prompt_key)
    table = make_table(f"{name} v{version} row {index}: made from {len(steps) - 1} source "
                       f"row{'s' if len(steps) != 2 else ''}", "version", "#", "added in",
                       "generator", "made by", "label", "prompt")
    for step in steps:
        row = step.row
        truth = (row.get("reward_model") or {}).get("ground_truth")
        add_row(table, f"v{step.version}", str(step.index), f"v{row.get(VERSION_COLUMN)}",
                str(row.get(GENERATOR_COLUMN) or "-"),
                f"{step.method} of the row below" if step.method else "-",
                clip(str(truth), 30), prompt_text(row.get(prompt_key, row.get("prompt"))))
    state.out.print(table)
