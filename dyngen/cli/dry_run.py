"""`dyngen round --dry-run`: the round's load, generate and filter stages, here and now.

The same stage functions a round's flow runs (dyngen.tasks: load, the generate fan-out,
the filter chain), called as plain functions (dyngen.tasks.direct): no Prefect server, no
flow or task run, no event; nothing is written to the store. It prints the rows the round
would keep and those it would reject, each with its reason, and their counts.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rich.console import Console

from dyngen.text import clip, parse_json, prompt_text

# Rows printed per list (kept, rejected); the counts always cover them all.
SHOWN = 50


def dry_run(name: str, params: dict[str, Any], trigger: dict[str, Any] | None,
            out: Console, shown: int = SHOWN) -> dict[str, Any]:
    """Run generate and filter on the head of `name`, print the outcome, commit nothing."""
    from prefect.logging import disable_run_logger

    from dyngen.round.admission import admitted
    from dyngen.round.inbox import covers_text
    from dyngen.round.stages import timed
    from dyngen.round.top_up import TopUp
    from dyngen.tasks.direct import direct_calls
    from dyngen.tasks.filter import filter_generated
    from dyngen.tasks.load import load_dataset
    from dyngen.tasks.partitions import generate_all

    started = time.perf_counter()
    # Stages that log through Prefect's run logger get a silent one (no run to log to).
    with disable_run_logger(), direct_calls(), admitted(name, params, trigger) as rnd:
        if rnd.committed is not None:
            say(out, f"dry run: this trigger already committed version "
                     f"{rnd.committed.version} of {name!r}; a round would commit nothing.")
            return {"committed": rnd.committed.version}
        with timed(rnd.timings, "load"):
            data, parent, batch_ends = load_dataset.fn(rnd.where, name, rnd.rollouts)
        asked = TopUp.of(rnd.cfg, rnd.context(parent, batch_ends))  # as the round asks
        while (context := asked.next_context()) is not None:
            with timed(rnd.timings, "generate"):
                rows = asked.add(*generate_all(rnd.cfg, data, context))
            with timed(rnd.timings, "filter"):
                outcome = asked.filtered(filter_generated.fn(rnd.cfg, parent, rows, context,
                                                             asked.outcome))
        generator = asked.generator
    rejected = outcome.rejected_by_reason
    kept = list(outcome.kept)
    say(out, f"dry run of {name!r} on version {parent.version} ({parent.rows} rows), "
             f"generator {generator.get('name')}: generated {len(rows)}, kept {len(kept)}, "
             f"rejected {sum(rejected.values())} {rejected}; nothing committed "
             f"({time.perf_counter() - started:.1f} s).")
    if (short := asked.message()) is not None or len(asked.kept) > 1:
        say(out, short or f"the generator was asked {len(asked.kept)} times for the "
                          f"{asked.wanted} rows wanted (round.top_up)")
    if batch_ends:
        say(out, f"a round now would cover the pending batch ends "
                 f"{covers_text([b.key for b in batch_ends])}")
    for entry in batch_ends:
        if entry.rollouts_error:
            say(out, f"  step {entry.step} of {entry.run}: without its rollouts: "
                     f"{entry.rollouts_error}")
    say(out, f"kept ({len(kept)}):")
    for row in kept[:shown]:
        say(out, f"  + {row_text(row)}")
    _more(out, len(kept), shown)
    say(out, f"rejected ({len(outcome.rejected)}):")
    for item in outcome.rejected[:shown]:
        detail = clip(str(item.get("detail") or ""), 100)
        say(out, f"  - {item.get('reason')}: {detail} | {row_text(parse_json(item.get('row')))}")
    _more(out, len(outcome.rejected), shown)
    return {"generated": len(rows), "kept": len(kept), "rejected": rejected}


def row_text(row: Any) -> str:
    """A row on one line: its prompt's last user message and its answer."""
    if not isinstance(row, Mapping):
        return clip(repr(row), 100)
    answer = row.get("reward_model")
    truth = answer.get("ground_truth") if isinstance(answer, Mapping) else None
    text = prompt_text(row.get("prompt"), 90) or "(no prompt)"
    return text if truth is None else f"{text} → {clip(str(truth), 30)}"


def say(out: Console, text: str) -> None:
    """One line of user data, printed as it is (never parsed as markup)."""
    out.print(text, markup=False, soft_wrap=True)


def _more(out: Console, count: int, shown: int) -> None:
    if count > shown:
        say(out, f"  … and {count - shown} more")
