"""The report page: one self-contained HTML file (inline SVG and CSS, no script, no link)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from dyngen.report import charts
from dyngen.report.history import History
from dyngen.store import Store, VersionRecord
from dyngen.text import clip, parse_json, prompt_text

SAMPLE_ROWS = 20
HALF_LIFE = 4.0  # steps: round.difficulty's default, how the report weighs old evidence

CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 2rem auto;
       max-width: 62rem; padding: 0 1rem; color: #1b1f24; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; }
h2 { font-size: 1.15rem; margin: 2rem 0 .4rem; border-bottom: 1px solid #d0d7de; }
.sub { color: #57606a; margin-top: 0; }
table { border-collapse: collapse; font-size: .85rem; margin: .5rem 0; }
th, td { border: 1px solid #d0d7de; padding: .25rem .5rem; text-align: left;
         vertical-align: top; }
th { background: #f6f8fa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: .5rem 0; }
figure svg { max-width: 100%; height: auto; }
.none { color: #57606a; font-style: italic; }
footer { margin-top: 3rem; color: #57606a; font-size: .8rem; }
"""

# (id, heading, chart function, what the chart shows, what it means when there is none)
SECTIONS = (
    ("rows", "Rows per version", charts.rows_chart,
     "Rows in each version; dots mark the versions not made by appending (restores, "
     "compactions, vacuums), one colour per operation.",
     "no versions"),
    ("counts", "Kept and rejected per round", charts.counts_chart,
     "Rows each round kept, and rejected by reason (rejected rows are quarantined).",
     "no generation rounds in these versions"),
    ("metrics", "Trigger metrics by step", charts.metrics_chart,
     "The metrics the training batch-end event carried, by training step.",
     "no round carried trigger metrics"),
    ("state", "Generator state over rounds", charts.state_chart,
     "The numeric fields the generator recorded as its state (e.g. a curriculum's level).",
     "no generator recorded a numeric state"),
    ("levels", "Curriculum levels by task family", charts.levels_chart,
     "Each task family's level (the generator state's `levels`, e.g. ReasoningGymCurriculum's "
     "reasoning-gym families) after each round.", "no generator recorded levels per family"),
    ("solve_rate", "Pass rates against the policy", charts.solve_rate_chart,
     "Each round's candidates by the policy's pass rate (dot area: rows at that rate), and "
     "the band round.solve_rate kept (dashed); outside it rows went as too_easy / too_hard.",
     "no round measured a solve rate"),
    ("effective", "Is the data helping?", charts.effective_chart,
     "Per version: the effective-prompt share (prompts whose rewards differed, so they gave "
     "a gradient) the trainer reported of the batch that asked for it, and the share of the "
     "round's candidates inside the solve-rate band. A falling effective share: tighten the "
     "band, raise the curriculum, or sample more (see the docs' \"Is the data helping?\").",
     "no trainer reported a reward spread (dyngen/zero_spread_share) and no round measured a "
     "solve rate"),
    ("timings", "Stage timings", charts.timings_chart,
     "Seconds each round spent per stage.", "no round recorded timings"),
)


def render_page(store: Store, history: History, records: Sequence[VersionRecord]) -> str:
    """The whole report as HTML text."""
    head = records[-1]
    parts = [f"<h1>{_e(history.dataset)}</h1>",
             f'<p class="sub">dyngen report · written {_now()} · store {_e(str(store.root))}</p>',
             _summary(history, head)]
    for key, heading, chart, caption, none in SECTIONS:
        svg = chart(history)
        parts.append(f'<section id="{key}"><h2>{heading}</h2>')
        if svg is None:
            parts.append(f'<p class="none">Nothing to draw: {none}.</p>')
        else:
            parts.append(f'<figure class="chart" data-chart="{key}">{svg}'
                         f"<figcaption>{_e(caption)}</figcaption></figure>")
        parts.append("</section>")
    parts.append(_difficulty_section(store, head))
    parts.append(_rejected_section(store, records))
    parts.append("<footer>Written by <code>dyngen report</code>. Self-contained: no scripts, "
                 "no network; charts drawn with matplotlib.</footer>")
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>dyngen report: {_e(history.dataset)}</title><style>{CSS}</style></head>"
            f"<body>\n{body}\n</body></html>\n")


def _summary(history: History, head: VersionRecord) -> str:
    shown = len(history.versions)
    window = (f"all {shown}" if shown == history.total_versions
              else f"newest {shown} of {history.total_versions} (v{history.first_version}"
                   f"–v{head.version})")
    generated = sum(r.generated for r in history.rounds)
    kept = sum(r.kept for r in history.rounds)
    rejected = sum(sum(r.rejected.values()) for r in history.rounds)
    generators = sorted({r.generator for r in history.rounds if r.generator})
    rows = [("head", f"v{head.version}, {head.rows:,} rows, created {head.created_at[:19]}"),
            ("versions drawn", window),
            ("generation rounds drawn", f"{len(history.rounds):,}"),
            ("generated / kept / rejected", f"{generated:,} / {kept:,} / {rejected:,}"),
            ("generators", ", ".join(generators) or "-")]
    cells = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    return f'<table class="summary">{cells}</table>'


def _difficulty_section(store: Store, head: VersionRecord) -> str:
    """The head's difficulty record: rows observed by estimated pass rate, retired, warned."""
    from dyngen.difficulty.record import DifficultyBook

    book = DifficultyBook.at(store, head.dataset, head.version)
    out = ['<section id="difficulty"><h2>Difficulty record</h2>']
    if not book.evidence:
        out.append('<p class="none">No round recorded an observation of a row yet (the band\'s '
                   "measurement, or a trainer's groups in its batch ends' rollouts).</p>")
        return "\n".join([*out, "</section>"])
    bins = [0] * 5
    for key in book.evidence:
        if key not in book.retired:
            bins[min(4, int(book.estimate(key, HALF_LIFE).mean * 5))] += 1
    why = [str(r.get("why")) for r in book.retired.values()]
    out.append(f"<p>As of v{head.version} (newest step observed: {book.now}): "
               f"{len(book.evidence):,} row(s) observed; {why.count('all_right'):,} retired "
               f"as always right, {why.count('all_wrong'):,} as never right. Rows in "
               "play by their estimated pass rate (what the frontier sampler weighs):</p>")
    cells = "".join(f"<th>{i / 5:.1f}–{(i + 1) / 5:.1f}</th>" for i in range(5))
    counts = "".join(f'<td class="num">{n:,}</td>' for n in bins)
    out.append(f'<table class="difficulty"><tr>{cells}</tr><tr>{counts}</tr></table>')
    for source in sorted(book.warned):
        out.append(f"<p>Warned: data source {_e(source or '(none)')} came back nearly all "
                   "wrong (a broken reward?); its rows are not retired as too hard.</p>")
    return "\n".join([*out, "</section>"])


def _rejected_section(store: Store, records: Sequence[VersionRecord]) -> str:
    """A sample of the newest round's quarantined rows (the newest round that had any)."""
    out = ['<section id="rejected"><h2>Rejected rows of the newest round</h2>']
    source = next((r for r in reversed(records) if r.rejected), None)
    if source is None:
        out.append('<p class="none">No round in these versions rejected a row.</p></section>')
        return "\n".join(out)
    rows = store.load_rejected(source.dataset, source.version, round_only=True)
    total = len(rows)
    sample = rows.select(range(min(total, SAMPLE_ROWS))).to_list()
    note = "" if source.version == records[-1].version else (
        f" (v{records[-1].version}, the head, rejected none)")
    out.append(f"<p>Round v{source.version}{_e(note)}: {total:,} rejected row(s)"
               f"{f', the first {len(sample)} shown' if total > len(sample) else ''}.</p>")
    out.append('<table class="rejected"><tr><th>#</th><th>reason</th><th>detail</th>'
               "<th>prompt</th></tr>")
    for i, row in enumerate(sample):
        original = parse_json(row.get("row"))
        prompt = _prompt_of(original, source.prompt_key)
        out.append(f'<tr><td class="num">{i}</td><td>{_e(row.get("reason") or "")}</td>'
                   f'<td>{_e(clip(row.get("detail") or "", 160))}</td>'
                   f"<td>{_e(prompt)}</td></tr>")
    out.append("</table></section>")
    return "\n".join(out)


def _prompt_of(original: Any, prompt_key: str) -> str:
    if isinstance(original, dict):
        return prompt_text(original.get(prompt_key, original.get("prompt")), 200)
    return clip(str(original), 200)  # a row that was not even a mapping


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
