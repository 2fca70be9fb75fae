"""The trend a round's Prefect artifact shows: one sparkline per series, as text.

Text renders in the Prefect UI (checked in headless Chromium) and costs microseconds per
round; drawing an image would load matplotlib in every round's process (~2 s on a
loaded 2-core machine). `dyngen report` draws the full charts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dyngen.report.history import MIN_SPAN_SHARE, History, bins

BLOCKS = "▁▂▃▄▅▆▇█"
WIDTH = 60  # characters per sparkline: longer windows are averaged into this many
SERIES_PER_KIND = 3  # metrics, and state fields, shown per artifact


def sparkline(values: Sequence[float], width: int = WIDTH) -> str:
    """`values` as block characters, lowest ▁ to highest █, averaged down to `width`. A
    series that moves less than MIN_SPAN_SHARE of its size is drawn near the middle, flat
    or nearly: its noise is not stretched into a trend."""
    points = [sum(values[i] for i in group) / len(group) for group in bins(len(values), width)]
    points = [p for p in points if math.isfinite(p)]
    if not points:
        return ""
    low, high = min(points), max(points)
    span = max(high - low, MIN_SPAN_SHARE * max(abs(low), abs(high)))
    if span == 0:
        return BLOCKS[3] * len(points)
    scale = (len(BLOCKS) - 1) / span
    # low at ▁, unless the series is near-constant: then its middle at ▄
    base = low if span == high - low else (low + high) / 2 - 3 / scale
    top = len(BLOCKS) - 1
    return "".join(BLOCKS[min(top, max(0, round((p - base) * scale)))] for p in points)


def trend_markdown(history: History) -> str:
    """A markdown section of sparklines over the window: rows, kept, rejected, the
    trigger's metrics and the generator's state."""
    if not history.versions:
        return ""
    series: list[tuple[str, list[float]]] = [("rows", [float(n) for n in history.rows])]
    if history.rounds:
        series.append(("kept", [float(r.kept) for r in history.rounds]))
        series.append(("rejected", [float(sum(r.rejected.values())) for r in history.rounds]))
    for name in history.metric_names()[:SERIES_PER_KIND]:
        series.append((name, [r.metrics[name] for r in history.rounds if name in r.metrics]))
    for name in history.state_names()[:SERIES_PER_KIND]:
        series.append((f"state.{name}", [r.state[name] for r in history.rounds
                                         if name in r.state]))
    series = [(name, values) for name, values in series if values]
    label_width = max(len(name) for name, _ in series)
    lines = [(name, sparkline(values), _range(values)) for name, values in series]
    line_width = max(len(line) for _, line, _ in lines)
    text = [f"{name:<{label_width}}  {line:<{line_width}}  {span}" for name, line, span in lines]
    first, last, rounds = history.first_version, history.versions[-1], len(history.rounds)
    return "\n".join([f"## Trend, v{first}–v{last} ({rounds} round{'s' * (rounds != 1)})", "",
                      "```text", *text, "```", ""])


def _range(values: Sequence[float]) -> str:
    """First → last value, and the range when it goes outside them."""
    first, last, low, high = values[0], values[-1], min(values), max(values)
    text = f"{_num(first)} → {_num(last)}"
    if low < min(first, last) or high > max(first, last):
        text += f" (min {_num(low)}, max {_num(high)})"
    return text


def _num(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:.3g}"
