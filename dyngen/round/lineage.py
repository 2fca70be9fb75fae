"""A round's lineage: the typed record a round writes, and every way dyngen shows one.

`RoundLineage` is what a generation round stores in its version record (`lineage`). The
renderers read any version's lineage leniently (imports, restores and compactions write
other keys): the `dyngen log` table, the Prefect markdown note and history row, and the
round's log line.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from rich import box
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from dyngen.plugins import MODULE_PREFIX
from dyngen.round.context import RoundContext, Trigger
from dyngen.round.inbox import covers_lineage, covers_text, rollouts_errors
from dyngen.store import LogEntry, Store, VersionRecord

if TYPE_CHECKING:  # the CLI imports this module; datasets (via the filters) stays unloaded
    from dyngen.filters.base import FilterOutcome

LOG_CHUNK = 500  # versions per table of `dyngen log --all`


@dataclass(frozen=True)
class RoundCounts:
    """How many rows the generator made, how many were kept, and why the others were not."""

    generated: int
    kept: int
    rejected: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RoundLineage:
    """What a generation round records with the version it commits."""

    round: int
    generator: dict[str, Any]  # class, name, path, config_hash, state, stats
    trigger: Trigger
    counts: RoundCounts
    flow_run_id: str | None = None
    flow_run_name: str | None = None
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage
    partitions: dict[str, Any] | None = None  # the fan-out, when the round had one
    # What filters recorded beyond their counts, by key (`solve_rate`: the policy's grading)
    filters: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The batch ends it covers, short: per training run, its steps (the record's `covers`
    # is the durable list), and those whose rollouts it could not use, with why.
    batch_ends: dict[str, list[int]] = field(default_factory=dict)
    rollouts_errors: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The lineage as the version record stores it (plain JSON data)."""
        out = {"round": self.round, "generator": self.generator,
               "trigger": {"event_id": self.trigger.event_id, "step": self.trigger.step,
                           "metrics": dict(self.trigger.metrics),
                           "rollouts": self.trigger.rollouts},
               "counts": asdict(self.counts), "flow_run_id": self.flow_run_id,
               "flow_run_name": self.flow_run_name, "timings": dict(self.timings)}
        if self.trigger.run is not None:
            out["trigger"]["run"] = self.trigger.run
        if self.batch_ends:
            out["batch_ends"] = {run: list(steps) for run, steps in self.batch_ends.items()}
        if self.rollouts_errors:
            out["rollouts_errors"] = list(self.rollouts_errors)
        if self.partitions:
            out["partitions"] = self.partitions
        for key, record in self.filters.items():
            if key in out:  # a filter's lineage_key must not hide the round's own records
                raise ValueError(f"a filter's lineage_key {key!r} is one of the round's own "
                                 "lineage keys; give the filter another lineage_key.")
            if record:
                out[key] = record
        return out


def round_lineage(context: RoundContext, generator: dict[str, Any], generated: int,
                  outcome: FilterOutcome, timings: Mapping[str, float], *,
                  run_id: Any = None, run_name: str | None = None,
                  partitions: dict[str, Any] | None = None) -> RoundLineage:
    """The lineage of the round `context` describes, from what its stages returned."""
    counts = RoundCounts(generated=generated, kept=len(outcome.kept),
                         rejected=outcome.rejected_by_reason)
    return RoundLineage(round=context.round, generator=generator, trigger=context.trigger,
                        counts=counts, flow_run_id=str(run_id) if run_id else None,
                        flow_run_name=run_name, timings=dict(timings), partitions=partitions,
                        filters=dict(outcome.records),
                        batch_ends=covers_lineage(context.batch_ends),
                        rollouts_errors=rollouts_errors(context.batch_ends))


# ---- the round's log line ---------------------------------------------------------------
def log_line(record: VersionRecord) -> str:
    """One line for the run's log: parent → version, kept of generated, rejections."""
    counts = as_dict(record.lineage.get("counts"))
    return (f"{record.dataset}: v{record.parent} → v{record.version}, kept "
            f"{counts.get('kept', '?')} of {counts.get('generated', '?')}, rejected "
            f"{as_dict(counts.get('rejected'))}")


# ---- Prefect: the round's markdown note and a history table row -------------------------
def round_markdown(rec: VersionRecord) -> str:
    """The per-round audit note: parent → version, generator, counts, reasons, trigger."""
    lin = rec.lineage
    gen, counts = as_dict(lin.get("generator")), as_dict(lin.get("counts"))
    trig = as_dict(lin.get("trigger"))
    reasons = as_dict(counts.get("rejected"))
    metrics = ", ".join(f"{k}={v:g}" for k, v in as_dict(trig.get("metrics")).items())
    timings = ", ".join(f"{k} {v:.2f}" for k, v in as_dict(lin.get("timings")).items())
    lines = [
        f"# {rec.dataset}: v{rec.parent} → v{rec.version}",
        "",
        "| field | value |",
        "|---|---|",
        f"| rows | {rec.rows} |",
        f"| generator | `{shown_class(gen)}` from `{gen.get('path', '')}` |",
        f"| generator config hash | `{str(gen.get('config_hash', ''))[:16]}` |",
        f"| generated / kept | {counts.get('generated', 0)} / {counts.get('kept', 0)} |",
        f"| rejected | {', '.join(f'{k}: {v}' for k, v in reasons.items()) or 'none'} |",
        f"| trigger event | {trig.get('event_id') or '-'} |",
        f"| training step | {trig.get('step') if trig.get('step') is not None else '-'} |",
        f"| metrics | {metrics or '-'} |",
        f"| covers | {_md(covered(rec)) or '-'} |",
        f"| flow run | {lin.get('flow_run_id', '-')} |",
        f"| idempotency key | {rec.idempotency_key or '-'} |",
        f"| timings (s) | {timings} |",
    ]
    solve = as_dict(lin.get("solve_rate"))
    if solve:
        keep = solve.get("keep") or ["?", "?"]
        lines.append(
            f"| solve rate | {solve.get('graded', 0)} graded × {solve.get('samples', '?')} "
            f"samples by `{solve.get('model') or '-'}` at {solve.get('endpoint') or '-'}, band "
            f"[{keep[0]}, {keep[-1]}]: kept {solve.get('kept', 0)}, too_easy "
            f"{solve.get('too_easy', 0)}, too_hard {solve.get('too_hard', 0)}, model_error "
            f"{solve.get('model_error', 0)}; pass counts {solve.get('histogram', [])} |")
    return "\n".join(lines) + "\n"


def history_row(rec: VersionRecord) -> dict[str, Any]:
    """One row of the Prefect history table."""
    lin = rec.lineage
    counts, trigger = as_dict(lin.get("counts")), as_dict(lin.get("trigger"))
    return {
        "version": rec.version, "parent": rec.parent, "operation": rec.operation,
        "rows": rec.rows, "generator": as_dict(lin.get("generator")).get("name", ""),
        "step": trigger.get("step"), "event_id": trigger.get("event_id"),
        "generated": counts.get("generated"), "kept": counts.get("kept"),
        "rejected": sum(as_dict(counts.get("rejected")).values()) if counts else None,
        "flow_run_id": lin.get("flow_run_id"), "created_at": rec.created_at,
        "covers": covered(rec) or None,
    }


# ---- `dyngen log`: the history as rich tables -------------------------------------------
def history_table(store: Store, name: str, limit: int | None = 20) -> Table:
    """The newest `limit` versions (all if None), newest first, with lineage columns."""
    return next(log_tables(store, name, limit, chunk=None))


def log_tables(store: Store, name: str, limit: int | None,
               chunk: int | None = LOG_CHUNK, wide: bool = True) -> Iterator[Table]:
    """The log newest first as tables of `chunk` versions each: memory stays bounded.

    Not `wide`: the few columns that fit an 80-column terminal (see `_narrow_row`).
    """
    head = store.head_version(name)
    if head is None:
        store.head(name)  # refuses a missing dataset by name
        return
    entries = store.entries(name, limit=limit)
    shown = head + 1 if limit is None else min(limit, head + 1)
    title = f"{name} (newest {shown} of {head + 1} versions)"
    make, add = (_log_table, _log_row) if wide else (_narrow_table, _narrow_row)
    table = make(title)
    child = None
    for entry in entries:
        if child is not None:
            add(table, child, entry.rows)
            if chunk is not None and table.row_count >= chunk:
                yield table
                table = make(None)
        child = entry
    if child is not None:  # the oldest shown: its parent is one more record to read
        parent = child.parent
        parent_rows = store.log(name).entry(parent).rows if parent is not None else None
        add(table, child, parent_rows)
    yield table


def _log_table(title: str | None) -> Table:
    table = Table(title=escape(title) if title else None, show_header=title is not None)
    for col in ("version", "parent", "operation", "rows", "created", "generator", "trigger",
                "counts", "run"):
        table.add_column(col, justify="right" if col in ("version", "parent", "rows") else "left")
    return table


def _log_row(table: Table, entry: LogEntry, parent_rows: int | None) -> None:
    delta = "" if parent_rows is None else f" ({entry.rows - parent_rows:+d})"
    cells = (str(entry.version), "-" if entry.parent is None else str(entry.parent),
             operation_text(entry), f"{entry.rows}{delta}",
             entry.created_at[:19].replace("T", " "), *lineage_cells(entry.lineage))
    covers = covered(entry)
    if covers:  # the trigger column says which batch ends the version covers
        cells = (*cells[:6], " · ".join(filter(None, (cells[6], f"covers {covers}"))),
                 *cells[7:])
    table.add_row(*(Text(cell) for cell in cells))  # user data is never read as markup


def _narrow_table(title: str | None) -> Table:
    table = Table(title=escape(title) if title else None, show_header=title is not None,
                  box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("v", justify="right", no_wrap=True)
    table.add_column("rows", justify="right", no_wrap=True)
    table.add_column("made by", overflow="fold")
    table.add_column("step", justify="right", no_wrap=True)
    table.add_column("kept", overflow="fold")
    table.add_column("created (UTC)", no_wrap=True)
    return table


def _narrow_row(table: Table, entry: LogEntry, parent_rows: int | None) -> None:
    """Version, rows (+ added), what made it (the generator, or the operation), step,
    kept / generated and why not, and when (month-day hour:minute)."""
    delta = "" if parent_rows is None else f" ({entry.rows - parent_rows:+d})"
    generator, _, counts, _ = lineage_cells(entry.lineage)
    made_by = generator if entry.operation == "append" and generator else operation_text(entry)
    step = as_dict(entry.lineage.get("trigger")).get("step")
    if step is None and entry.covers:  # a round no trigger step named: its newest covered
        step = max(s for _, s in entry.covers)
    cells = (str(entry.version), f"{entry.rows}{delta}", made_by,
             "" if step is None else str(step), counts.removeprefix("kept "),
             entry.created_at[5:16].replace("T", " "))
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


def shown_class(generator: Mapping[str, Any]) -> str:
    """A generator's class as people name it: `module.Class`, or, for a class loaded from
    a file (whose module dyngen named `_dyngen_plugin_<file>_<hash>`), the class alone, its
    file beside it in the lineage's `path`. The record keeps the full name, which finds the
    generator's state."""
    full = str(generator.get("class") or "")
    if full.startswith(MODULE_PREFIX):
        return str(generator.get("name") or full.rpartition(".")[2])
    return full


def lineage_cells(lineage: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """Generator, trigger, counts and run id, compact; lineage is free-form, so be lenient."""
    generator = shown_class(as_dict(lineage.get("generator")))
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


def covered(entry: LogEntry) -> str:
    """Which batch ends a version covers, in words (`run-a steps 3–5 · run-b step 1`):
    its record's `covers`, else its lineage's summary; "" for none."""
    return covers_text(entry.covers or as_dict(entry.lineage.get("batch_ends")))


def _md(text: str) -> str:
    """Text for a cell of a Markdown table."""
    return text.replace("|", "\\|").replace("\n", " ")


def as_dict(value: Any) -> dict[str, Any]:
    """`value` if it is a dict, else an empty one (lineage is read leniently)."""
    return value if isinstance(value, dict) else {}


def short(value: Any, n: int = 8) -> str:
    """The first `n` characters of an id, or "-" for none."""
    return "-" if value is None else str(value)[:n]
