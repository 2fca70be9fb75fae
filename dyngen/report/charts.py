"""The report's charts, drawn by matplotlib and returned as inline SVG text.

matplotlib's object API (`Figure`, no pyplot) draws without a display or global state.
Long histories stay readable and small: bar charts group consecutive rounds into at
most MAX_BARS bars, and lines keep at most MAX_POINTS points. Axes are honest: whole-number
axes (versions, steps, rows, levels) tick at whole numbers only, counts and shares are
drawn from 0, and a constant or near-constant line is not zoomed into its last digits.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence

import matplotlib
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, StrMethodFormatter

from dyngen.report.history import MIN_SPAN_SHARE, History, RoundPoint, bins

MAX_BARS = 120
MAX_POINTS = 1500
MAX_REASONS = 7  # then "other"
KEPT_COLOR = "#2ca02c"
REASON_COLORS = ("#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
                 "#7f7f7f")
STAGE_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                "#7f7f7f")
WIDTH_INCHES = 9.0


def rows_chart(history: History) -> str | None:
    """Rows per version, as a line; only versions not made by appending (or creating) have
    a marker, one colour per operation, as the page's caption says."""
    if not history.versions:
        return None
    return _svg(rows_figure(history), f"{history.dataset}-rows")


def rows_figure(history: History) -> Figure:
    """The rows chart's matplotlib figure (the line unmarked, the other versions marked)."""
    fig, ax = _figure(3.0)
    xs, ys = _thin(history.versions, history.rows)
    ax.plot(xs, ys, color="#1f77b4", linewidth=1.5)
    ax.fill_between(xs, ys, alpha=0.15, color="#1f77b4")
    marked = [(v, r, op) for v, r, op in zip(history.versions, history.rows,
                                             history.operations, strict=True)
              if op not in ("append", "create")]
    for op in sorted({m[2] for m in marked}):
        ax.plot([m[0] for m in marked if m[2] == op], [m[1] for m in marked if m[2] == op],
                "o", label=op, markersize=5)
    if marked:
        ax.legend(loc="upper left", fontsize=8)
    _labels(ax, "version", "rows")
    _y_range(ax, ys)
    return fig


def counts_chart(history: History) -> str | None:
    """Kept and rejected rows (by reason) per round, stacked; long histories binned."""
    if not history.rounds:
        return None
    reasons = history.reasons()
    shown = reasons[:MAX_REASONS]
    fig, ax = _figure(3.2)
    groups = _grouped(history.rounds)
    centres, widths = _bar_spans(groups)
    bottom = [0.0] * len(groups)
    layers: list[tuple[str, Callable[[RoundPoint], float], str]] = [
        ("kept", lambda r: r.kept, KEPT_COLOR)]
    layers += [(f"rejected: {reason}", lambda r, reason=reason: r.rejected.get(reason, 0),
                REASON_COLORS[i % len(REASON_COLORS)]) for i, reason in enumerate(shown)]
    if len(reasons) > len(shown):
        rest = set(reasons[len(shown):])
        layers.append(("rejected: other", lambda r: sum(n for k, n in r.rejected.items()
                                                        if k in rest), REASON_COLORS[-1]))
    for label, value, color in layers:
        heights = [float(sum(value(r) for r in g)) for g in groups]
        if any(heights):
            ax.bar(centres, heights, widths, bottom=bottom, label=label, color=color)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    _legend_above(fig, len(layers))
    per = f" (each bar: {len(groups[0])} rounds)" if len(groups[0]) > 1 else ""
    _labels(ax, "version", "rows" + per)
    _whole(ax.yaxis)
    return _svg(fig, f"{history.dataset}-counts")


def metrics_chart(history: History) -> str | None:
    """The trigger's metrics by training step, one small panel per metric."""
    names = history.metric_names()
    series = {}
    for name in names:
        points = [(r.step if r.step is not None else r.version, r.metrics[name])
                  for r in history.rounds if name in r.metrics]
        series[name] = points
    by_step = all(r.step is not None for r in history.rounds)
    return _panels(series, "training step" if by_step else "step (or version)",
                   f"{history.dataset}-metrics", drawstyle="default")


def state_chart(history: History) -> str | None:
    """The generator's recorded state (its numeric fields) over rounds, one panel each."""
    series = {name: [(r.version, r.state[name]) for r in history.rounds if name in r.state]
              for name in history.state_names()}
    return _panels(series, "version", f"{history.dataset}-state", drawstyle="steps-post")


def levels_chart(history: History) -> str | None:
    """Each task family's curriculum level over versions, one line per family."""
    families = history.level_names()
    if not families:
        return None
    fig, ax = _figure(3.2)
    for i, family in enumerate(families):
        points = [(r.version, r.levels[family]) for r in history.rounds if family in r.levels]
        xs, ys = _thin([p[0] for p in points], [p[1] for p in points])
        ax.plot(xs, ys, drawstyle="steps-post", label=family, linewidth=1.5,
                color=STAGE_COLORS[i % len(STAGE_COLORS)],
                linestyle=("-", "--", ":", "-.")[i // len(STAGE_COLORS) % 4])
    _legend_above(fig, len(families))
    _labels(ax, "version", "level")
    _y_range(ax, [r.levels[f] for r in history.rounds for f in families if f in r.levels])
    return _svg(fig, f"{history.dataset}-levels")


def timings_chart(history: History) -> str | None:
    """Seconds per stage of each round, stacked; long histories binned (mean per round)."""
    stages = history.stage_names()
    if not stages:
        return None
    fig, ax = _figure(3.0)
    groups = _grouped(history.rounds)
    centres, widths = _bar_spans(groups)
    bottom = [0.0] * len(groups)
    for i, stage in enumerate(stages):
        heights = [sum(r.timings.get(stage, 0.0) for r in g) / len(g) for g in groups]
        ax.bar(centres, heights, widths, bottom=bottom, label=stage,
               color=STAGE_COLORS[i % len(STAGE_COLORS)])
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    _legend_above(fig, len(stages))
    per = " (mean of each bar's rounds)" if len(groups[0]) > 1 else ""
    _labels(ax, "version", "seconds" + per)
    return _svg(fig, f"{history.dataset}-timings")


def solve_rate_chart(history: History) -> str | None:
    """Each round's pass rates against the policy (a dot per rate, its area the rows at it),
    and the band's cuts; the newest MAX_BARS rounds that measured one."""
    rounds = [r for r in history.rounds if r.solve_rate is not None][-MAX_BARS:]
    if not rounds:
        return None
    fig, ax = _figure(3.2)
    most = max(max(r.solve_rate.histogram) for r in rounds if r.solve_rate) or 1
    for inside, color, label in ((True, KEPT_COLOR, "inside the band (kept)"),
                                 (False, REASON_COLORS[0], "outside (too easy / too hard)")):
        xs, ys, sizes = [], [], []
        for r in rounds:
            sr = r.solve_rate
            assert sr is not None
            for k, count in enumerate(sr.histogram):
                rate = k / sr.samples
                if count and (sr.keep[0] <= rate <= sr.keep[1]) == inside:
                    xs.append(r.version)
                    ys.append(rate)
                    sizes.append(12 + 240 * count / most)
        if xs:
            ax.scatter(xs, ys, s=sizes, color=color, alpha=0.6, label=label)
    versions = [r.version for r in rounds]
    for end in (0, 1):
        cut = [r.solve_rate.keep[end] for r in rounds if r.solve_rate]
        ax.step(versions, cut, where="mid", color="#57606a", linestyle="--", linewidth=1,
                label="the band's cuts" if end == 0 else None)
    ax.set_ylim(-0.05, 1.05)
    _legend_above(fig, 3)
    _labels(ax, "version", "pass rate of the policy")
    return _svg(fig, f"{history.dataset}-solve-rate")


def effective_chart(history: History) -> str | None:
    """Per version: the effective-prompt share the trainer reported at the step that asked
    for it, beside the share of the round's candidates its solve-rate band kept."""
    rounds = [r for r in history.rounds if r.effective_share is not None
              or (r.solve_rate is not None and r.solve_rate.kept_share is not None)]
    if not rounds:
        return None
    fig, ax = _figure(3.2)
    series = (
        ("effective-prompt share the trainer reported", KEPT_COLOR,
         [(r.version, r.effective_share) for r in rounds]),
        ("share of candidates the band kept", "#1f77b4",
         [(r.version, r.solve_rate.kept_share if r.solve_rate else None) for r in rounds]))
    for label, color, points in series:
        known = [(v, y) for v, y in points if y is not None]
        if known:
            xs, ys = _thin([p[0] for p in known], [p[1] for p in known])
            ax.plot(xs, ys, marker="." if len(xs) <= 60 else None, color=color,
                    linewidth=1.5, label=label)
    ax.set_ylim(-0.05, 1.05)
    _legend_above(fig, 2)
    _labels(ax, "version", "share")
    return _svg(fig, f"{history.dataset}-effective")


# ---- helpers ---------------------------------------------------------------------------
def _figure(height: float, rows: int = 1, cols: int = 1) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(WIDTH_INCHES, height), layout="constrained")
    return fig, fig.subplots(rows, cols, squeeze=False)[0][0]


def _panels(series: dict[str, list[tuple[float, float]]], xlabel: str, salt: str,
            drawstyle: str) -> str | None:
    """One small line chart per named series, two to a row."""
    series = {name: points for name, points in series.items() if points}
    if not series:
        return None
    cols = 1 if len(series) == 1 else 2
    rows = -(-len(series) // cols)
    fig = Figure(figsize=(WIDTH_INCHES, 2.4 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).flatten()
    for i, (ax, (name, points)) in enumerate(zip(axes, series.items(), strict=False)):
        xs, ys = _thin([p[0] for p in points], [p[1] for p in points])
        ax.plot(xs, ys, drawstyle=drawstyle, marker="." if len(xs) <= 60 else None,
                color=STAGE_COLORS[i % len(STAGE_COLORS)], linewidth=1.5)
        ax.set_title(name, fontsize=10)
        _labels(ax, xlabel, None)
        _y_range(ax, ys)
    for ax in axes[len(series):]:
        ax.set_visible(False)
    return _svg(fig, salt)


def _legend_above(fig: Figure, entries: int) -> None:
    """The legend in a row above the plot, where it hides no bar."""
    fig.legend(loc="outside upper center", fontsize=8, ncols=min(5, entries), frameon=False)


def _bar_spans(groups: Sequence[Sequence[RoundPoint]]) -> tuple[list[float], list[float]]:
    """Each bar centred on the versions of its rounds, as wide as they span."""
    centres = [(g[0].version + g[-1].version) / 2 for g in groups]
    widths = [(g[-1].version - g[0].version + 1) * 0.85 for g in groups]
    return centres, widths


def _grouped(rounds: Sequence[RoundPoint]) -> list[list[RoundPoint]]:
    return [[rounds[i] for i in group] for group in bins(len(rounds), MAX_BARS)]


def _thin(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    """At most MAX_POINTS evenly spaced points, always keeping the last."""
    if len(xs) <= MAX_POINTS:
        return list(xs), list(ys)
    stride = -(-len(xs) // MAX_POINTS)
    keep = list(range(0, len(xs), stride))
    if keep[-1] != len(xs) - 1:
        keep.append(len(xs) - 1)
    return [xs[i] for i in keep], [ys[i] for i in keep]


def _labels(ax: Axes, xlabel: str, ylabel: str | None) -> None:
    """Axis labels and grid; the x axis (versions or steps) is whole-numbered."""
    ax.set_xlabel(xlabel, fontsize=9)
    if ylabel:
        ax.set_ylabel(ylabel, fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    _whole(ax.xaxis)


def _whole(axis: Axis) -> None:
    """Ticks at whole numbers only, even when the view holds a single one (matplotlib's own
    `integer=True` falls back to 0.96, 0.98, ... there), written out in full (10,000)."""
    axis.set_major_locator(MaxNLocator(nbins="auto", steps=[1, 2, 5, 10], integer=True,
                                       min_n_ticks=1))
    axis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))


def _y_range(ax: Axes, values: Sequence[float]) -> None:
    """An honest y-axis for a line of `values`: whole numbers tick as such; counts (whole,
    not negative) and shares (within [0, 1]) are drawn from 0 (shares up to 1); any other
    line spans at least MIN_SPAN_SHARE of its size, so noise is not drawn as a trend."""
    ys = [float(v) for v in values if math.isfinite(v)]
    if not ys:
        return
    low, high = min(ys), max(ys)
    whole = all(y.is_integer() for y in ys)
    if low >= 0 and high <= 1:  # a share, or 0/1 (a constant 0 drawn on 0–1, not 0–0.5)
        ax.set_ylim(-0.05, 1.05)
    elif whole and low >= 0:
        _whole(ax.yaxis)
        ax.set_ylim(0, high + max(0.5, 0.05 * high))
    else:
        if whole:
            _whole(ax.yaxis)
        span = max(high - low, MIN_SPAN_SHARE * max(abs(low), abs(high)))
        if span > high - low:  # near-constant: centred in a span of its size
            middle = (low + high) / 2
            ax.set_ylim(middle - 0.55 * span, middle + 0.55 * span)


def _svg(fig: Figure, salt: str) -> str:
    """The figure as an inline `<svg>` element (text kept as text, ids unique per chart)."""
    buf = io.StringIO()
    # Several SVGs share one page: a salt per chart keeps their clip-path ids apart.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]
