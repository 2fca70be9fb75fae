"""`dyngen report`: the history drawn from any lineage a version may carry, as one page."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dyngen.cli import app
from dyngen.report import report_html, write_report
from dyngen.report.history import history_of
from dyngen.report.trend import sparkline, trend_markdown
from dyngen.store import Store
from tests.rows import verl_row, verl_rows

REPO = Path(__file__).resolve().parents[1]
CHARTS = ("rows", "counts", "metrics", "state", "timings")


def round_lineage(step: int, kept: int, rejected: dict[str, int], **extra: Any) -> dict:
    """A generation round's lineage, as dyngen/flows/generation_round.py records it."""
    return {"counts": {"generated": kept + sum(rejected.values()), "kept": kept,
                       "rejected": rejected},
            "trigger": {"event_id": f"e{step}", "step": step, "metrics": {"score": step / 10}},
            "generator": {"name": "Curriculum", "state": {"level": step // 2}},
            "timings": {"load": 0.1, "generate": 0.5, "filter": 0.2, "concat": 0.1}, **extra}


def rejected_rows(reason: str, prompt: str, n: int = 1) -> list[dict[str, str]]:
    """Quarantined rows as a round writes them: the original row kept as JSON."""
    row = json.dumps(verl_row(0, content=prompt))
    return [{"reason": reason, "detail": f"{reason} <b>detail</b>", "row": row}] * n


@pytest.fixture
def grown(tmp_path: Path) -> Store:
    """Version 0 imported, six rounds (some rejecting rows), then a restore."""
    store = Store(tmp_path / "store")
    store.create("grown", verl_rows(8))
    for step in range(1, 7):
        reasons = {"duplicate": step % 3, "overlong_prompt": 1} if step % 2 else {}
        rejected = [r for reason, n in reasons.items()
                    for r in rejected_rows(reason, f"<script>alert({step})</script>", n)]
        store.commit(store.prepare_append(
            "grown", verl_rows(2, start=100 * step), rejected=rejected or None,
            lineage=round_lineage(step, 2, {k: v for k, v in reasons.items() if v})))
    store.restore("grown", 3)
    return store


def charts_in(page: str) -> list[str]:
    """The charts a page draws, by name, in order."""
    return re.findall(r'<figure class="chart" data-chart="(\w+)"><svg', page)


def test_the_page_draws_every_chart_and_the_newest_rejected_rows(grown: Store) -> None:
    page = report_html(grown, "grown")
    assert charts_in(page) == list(CHARTS)
    assert page.count("<svg") == len(CHARTS)
    # the newest round that rejected rows (v5; v6 rejected none, v7 is a restore)
    assert "Round v5 (v7, the head, rejected none): 3 rejected row(s)" in page
    assert "overlong_prompt" in page and "duplicate" in page
    # user data is text, never markup
    assert "<script>alert" not in page and "&lt;script&gt;alert(5)&lt;/script&gt;" in page
    # 6 rounds kept 2 each; steps 1, 3, 5 rejected 2, 1 and 3
    assert "generated / kept / rejected</th><td>18 / 12 / 6<" in page
    # charts keep their text as text: panel titles are the metric's and the state's names
    assert re.search(r"<text[^>]*>score</text>", page) and re.search(
        r"<text[^>]*>level</text>", page)


def test_the_page_is_self_contained(grown: Store) -> None:
    page = report_html(grown, "grown")
    assert "<script" not in page and "<link" not in page and "@import" not in page
    assert not re.search(r'(src|href)="(https?:)?//', page)
    assert not re.search(r"url\((https?:)?//", page)


def test_a_dataset_without_rounds_has_its_rows_and_says_what_is_missing(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("plain", verl_rows(3))
    store.append("plain", verl_rows(2, start=3))  # no round lineage at all
    page = report_html(store, "plain")
    assert charts_in(page) == ["rows"]
    assert "Nothing to draw: no generation rounds in these versions." in page
    assert "No round in these versions rejected a row." in page


def test_lineage_of_any_shape_is_drawn_leniently(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("odd", verl_rows(2))
    odd = [
        {"counts": "not a mapping"},
        {"counts": {"kept": "3", "rejected": {"x": float("nan")}}, "trigger": [1, 2]},
        {"counts": {"kept": 1, "generated": 1}, "trigger": {"step": "7", "metrics": {
            "score": "high", "loss": float("inf"), "ok": True, "acc": 0.5}},
         "generator": {"state": {"level": {"digits": 2, "ops": ["+"]}, "name": "hard"}},
         "timings": {"generate": "slow"}},
    ]
    for i, lineage in enumerate(odd):
        store.append("odd", verl_rows(1, start=10 + i), lineage=lineage)
    history = history_of(store.history("odd"))
    assert [r.version for r in history.rounds] == [2, 3]
    assert history.rounds[0].kept == 0 and history.rounds[0].rejected == {}
    assert history.metric_names() == ["acc"]
    assert history.state_names() == ["level.digits"]
    assert charts_in(report_html(store, "odd")) == ["rows", "counts", "metrics", "state"]


def test_newest_caps_the_versions_drawn(grown: Store) -> None:
    page = report_html(grown, "grown", newest=3)
    assert "newest 3 of 8 (v5–v7)" in page
    history = history_of(grown.history("grown", newest=3), 8)
    assert history.versions == [5, 6, 7]


def test_the_round_artifact_trend_is_one_sparkline_per_series(grown: Store) -> None:
    text = trend_markdown(history_of(grown.history("grown")))
    assert text.startswith("## Trend, v0–v7 (6 rounds)")
    lines = {line.split()[0]: line for line in text.splitlines()[3:-1]}
    assert set(lines) == {"rows", "kept", "rejected", "score", "state.level"}
    assert sparkline([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]) in lines["score"]
    assert lines["score"].endswith("0.1 → 0.6")
    assert sparkline([1, 8]) == "▁█" and sparkline([5, 5]) == "▄▄"
    long = sparkline(list(range(1000)), width=60)  # averaged down, still rising
    assert 50 <= len(long) <= 60 and long[0] == "▁" and long[-1] == "█"


def test_cli_writes_the_report_and_prints_its_path(grown: Store, tmp_path: Path) -> None:
    out = tmp_path / "pages" / "grown.html"
    ran = subprocess.run([sys.executable, "-m", "dyngen.cli", "--root", str(grown.root),
                          "report", "grown", "--out", str(out)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert ran.returncode == 0, ran.stderr
    assert str(out) in ran.stdout
    assert charts_in(out.read_text()) == list(CHARTS)


def test_cli_report_of_a_missing_dataset_is_a_user_error(grown: Store, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    missing = CliRunner().invoke(app, ["--root", str(grown.root), "report", "nope"])
    assert missing.exit_code == 2
    assert "dataset 'nope' has no committed version" in missing.output
    assert not (tmp_path / "report.html").exists()


def test_write_report_replaces_the_file_whole(grown: Store, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    out.write_text("old")
    assert write_report(grown, "grown", out) == out
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_curriculums_levels_are_drawn_one_line_per_family(tmp_path: Path) -> None:
    """ReasoningGymCurriculum records `levels` per family in its state: one chart draws them."""
    store = Store(tmp_path)
    store.create("rg", verl_rows(2))
    trajectory = [{"chain_sum": 0, "leg_counting": 0}, {"chain_sum": 1, "leg_counting": 1},
                  {"chain_sum": 1, "leg_counting": 2}]
    for i, levels in enumerate(trajectory):
        store.append("rg", verl_rows(1, start=10 + i), lineage=round_lineage(
            i + 1, 1, {}, generator={"name": "ReasoningGymCurriculum",
                                     "state": {"levels": levels, "memory": {}}}))
    history = history_of(store.history("rg"))
    assert [r.levels for r in history.rounds] == trajectory
    page = report_html(store, "rg")
    assert charts_in(page) == ["rows", "counts", "metrics", "state", "levels", "timings"]
    levels = page[page.index('data-chart="levels"'):page.index('data-chart="timings"')]
    assert re.search(r"<text[^>]*>chain_sum</text>", levels)
    assert re.search(r"<text[^>]*>leg_counting</text>", levels)
    plain = Store(tmp_path / "plain")
    plain.create("plain", verl_rows(1))
    plain.append("plain", verl_rows(1, start=5), lineage=round_lineage(1, 1, {}))
    assert "Nothing to draw: no generator recorded levels per family." in report_html(
        plain, "plain")


def test_each_rounds_pass_rates_and_band_are_drawn(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("graded", verl_rows(2))
    stages = [{"samples": 4, "keep": [0.25, 0.75], "histogram": [3, 1, 0, 2, 5]},
              {"samples": 8, "keep": [0.125, 0.875], "histogram": [1, 0, 0, 0, 2, 0, 0, 0, 4]},
              {"samples": 4, "keep": [0.25], "histogram": [1, 2]}]  # unsound: not drawn
    for i, stage in enumerate(stages):
        store.append("graded", verl_rows(1, start=10 + i),
                     lineage=round_lineage(i + 1, 1, {"too_easy": 1}, solve_rate=stage))
    history = history_of(store.history("graded"))
    points = [r.solve_rate for r in history.rounds]
    assert points[0] is not None and points[0].histogram == (3, 1, 0, 2, 5)
    assert points[1] is not None and points[1].keep == (0.125, 0.875) and points[2] is None
    page = report_html(store, "graded")
    assert charts_in(page) == ["rows", "counts", "metrics", "state", "solve_rate", "effective",
                               "timings"]
    assert "Pass rates against the policy" in page


def test_each_version_draws_the_trainers_effective_share_beside_the_bands_kept_share(
        tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("helping", verl_rows(2))
    band = {"samples": 4, "keep": [0.25, 0.75]}
    lineages = [  # what the trainer reported at each round's step, and what the band kept
        round_lineage(1, 1, {}, solve_rate={**band, "histogram": [6, 1, 1, 0, 2],
                                            "policy_step": 0}),
        round_lineage(2, 1, {}, solve_rate={**band, "histogram": [2, 2, 2, 2, 2],
                                            "policy_step": 2}),
        round_lineage(3, 1, {}),  # no band: the trainer's share alone
    ]
    for lineage, zero in zip(lineages, (0.75, 0.25, 0.5), strict=True):
        lineage["trigger"]["metrics"]["dyngen/zero_spread_share"] = zero
    lineages.append(round_lineage(4, 1, {}))  # neither
    for i, lineage in enumerate(lineages):
        store.append("helping", verl_rows(1, start=10 + i), lineage=lineage)
    rounds = history_of(store.history("helping")).rounds
    assert [r.effective_share for r in rounds] == [0.25, 0.75, 0.5, None]
    shares = [r.solve_rate.kept_share if r.solve_rate else None for r in rounds]
    assert shares == [0.2, 0.6, None, None]
    assert [r.solve_rate.policy_step if r.solve_rate else None for r in rounds] == [0, 2, None,
                                                                                   None]
    page = report_html(store, "helping")
    assert "effective" in charts_in(page) and "Is the data helping?" in page
    assert "Nothing to draw: no trainer reported" in report_html(grown_plain(tmp_path), "plain")


def grown_plain(tmp_path: Path) -> Store:
    """A dataset of rounds whose trainer reported no spread and that measured no band."""
    store = Store(tmp_path / "plain")
    store.create("plain", verl_rows(1))
    store.append("plain", verl_rows(1, start=5), lineage=round_lineage(1, 1, {}))
    return store


def test_the_rows_chart_marks_only_versions_not_made_by_appending(grown: Store) -> None:
    """The caption says dots mark versions not made by appending: no other point has one."""
    import matplotlib.pyplot as plt

    from dyngen.report import charts
    from dyngen.report.history import History

    appends = History("grown", 7, versions=list(range(7)), rows=[8 + 2 * v for v in range(7)],
                      operations=["create"] + ["append"] * 6)
    with_restore = History("grown", 8, versions=list(range(8)),
                           rows=[*appends.rows, 14], operations=[*appends.operations, "restore"])
    for history, expected in ((appends, []), (with_restore, [(7, 14)])):
        figure = charts.rows_figure(history)
        points = [(x, y) for line in figure.axes[0].get_lines()
                  if line.get_marker() not in (None, "None", "", " ")
                  for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True)]
        assert points == expected
        plt.close(figure)


def ticks(svg: str) -> dict[str, list[str]]:
    """The tick labels a chart's SVG shows, by axis (x, y), as the reader sees them."""
    found: dict[str, list[str]] = {"x": [], "y": []}
    for axis, label in re.findall(r'<g id="([xy])tick_\d+">.*?<text[^>]*>([^<]*)</text>', svg,
                                  flags=re.S):
        found[axis].append(label.replace("\u2212", "-"))
    return found


def chart_of(page: str, key: str) -> str:
    start = page.index(f'data-chart="{key}"')
    return page[start:page.index("</figure>", start)]


def number(label: str) -> float:
    return float(label.replace(",", ""))


def test_whole_number_axes_tick_at_whole_numbers_and_flat_lines_stay_flat(
        tmp_path: Path) -> None:
    """One round (a single version and step on its axes) and a constant score: matplotlib
    alone ticks 0.96, 0.98, ... for version 1 and zooms 0.5 to 0.496 ... 0.504."""
    store = Store(tmp_path)
    store.create("one", verl_rows(9_998))
    lineage = round_lineage(1, 2, {})
    lineage["trigger"]["metrics"] = {"score": 0.5, "loss": 2.3}
    store.append("one", verl_rows(2, start=20_000), lineage=lineage)
    for step in (2, 3, 4):  # near-constant: a loss moving in its fourth digit
        lineage = round_lineage(step, 2, {})
        lineage["trigger"]["metrics"] = {"score": 0.5, "loss": 2.3 + step * 1e-4}
        store.append("one", verl_rows(2, start=20_000 + 10 * step), lineage=lineage)
    page = report_html(store, "one")
    for key in ("rows", "counts", "metrics", "state", "timings"):
        shown = ticks(chart_of(page, key))
        assert shown["x"] and all(number(x).is_integer() for x in shown["x"]), (key, shown)
    for key in ("rows", "counts", "state"):  # rows, kept rows, the level: whole numbers
        shown = ticks(chart_of(page, key))
        assert all(number(y).is_integer() for y in shown["y"]), (key, shown)
    assert "10,000" in ticks(chart_of(page, "rows"))["y"]  # written out, no 1e4 offset
    assert number(ticks(chart_of(page, "rows"))["y"][0]) == 0  # a count from 0
    metrics = chart_of(page, "metrics")
    ys = [number(y) for y in ticks(metrics)["y"]]
    loss = [y for y in ys if y > 1.5]
    assert max(loss) - min(loss) > 0.15, loss  # about a tenth of 2.3, not 0.0006
    share = [y for y in ys if y <= 1.5]
    assert min(share) <= 0 and max(share) >= 1, share  # a value in [0, 1]: drawn on 0..1


def test_a_near_constant_sparkline_is_flat() -> None:
    assert sparkline([0.5, 0.5001, 0.4999, 0.5]) == "▄▄▄▄"
    assert sparkline([10_000, 10_001, 10_002]) == "▄▄▄"
    assert sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == "▁▂▃▄▅▆▇█"  # a real trend keeps its range
    assert sparkline([0.0, 1.0]) == "▁█"
