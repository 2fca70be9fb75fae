"""`dyngen demo`, run as the README says: a real server, a served trigger, real events."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dyngen.store import Store, verify
from tests.browser import render, screenshot
from tests.support import processes_mentioning

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """The demo run once, as the README runs it: its folder and its output."""
    tmp_path = tmp_path_factory.mktemp("demo-run")
    workdir = tmp_path / "demo"
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    env.pop("PREFECT_API_URL", None)
    out = subprocess.run([sys.executable, "-m", "dyngen.cli", "demo", "--workdir", str(workdir)],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    return workdir, out


def test_demo_grows_the_dataset_through_served_rounds_and_leaves_nothing_running(
    demo: tuple[Path, subprocess.CompletedProcess],
) -> None:
    workdir, out = demo
    assert out.returncode == 0, out.stdout + out.stderr
    store = Store(workdir / "store")
    history = store.history("arith-demo")
    assert [r.version for r in history] == [0, 1, 2, 3]
    for rec, step in zip(history[1:], (1, 2, 3), strict=True):
        trigger = rec.lineage["trigger"]
        assert trigger["step"] == step
        assert rec.idempotency_key == f"event:{trigger['event_id']}"
        assert trigger["event_id"][:8] in out.stdout  # the event the demo printed it emitted
        assert rec.lineage["generator"]["name"] == "ArithmeticCurriculum"
        assert rec.lineage["flow_run_id"]
        # the simulated trainer's rollouts and their reward spread reached the round
        assert 0 <= trigger["metrics"]["dyngen/zero_spread_share"] <= 1
        assert Path(trigger["rollouts"]).is_file()
    for row in store.load("arith-demo").to_list():  # every answer is right
        expression = row["prompt"][-1]["content"].removeprefix("What is ").rstrip("?")
        assert int(row["reward_model"]["ground_truth"]) == eval(expression)  # noqa: S307
    assert verify(store, "arith-demo") == []
    assert "Prefect UI: http://127.0.0.1:" in out.stdout
    ui_line = next(ln for ln in out.stdout.splitlines() if ln.startswith("Prefect UI:"))
    assert "--keep-server" in ui_line  # beside the link that stops working when the demo ends
    assert processes_mentioning(str(workdir)) == [], "the demo left processes running"


def test_the_demos_report_renders_in_a_browser_with_its_charts(
    demo: tuple[Path, subprocess.CompletedProcess], tmp_path: Path,
) -> None:
    workdir, out = demo
    assert out.returncode == 0, out.stdout + out.stderr
    report = workdir / "report.html"
    assert f"report: {report}" in out.stdout  # the demo's last words name the page
    # no network at view time: every host name fails to resolve in this browser
    offline = ("--host-resolver-rules=MAP * ~NOTFOUND",)
    dom = render(report.as_uri(), tmp_path / "r", ["arith-demo"], flags=offline)
    charts = dict(re.findall(r'<figure class="chart" data-chart="(\w+)"><svg[^>]*>(.*?)</svg>',
                             dom, flags=re.S))
    assert sorted(charts) == ["counts", "effective", "metrics", "rows", "state", "timings"], \
        dom[:3000]
    assert "Is the data helping?" in dom
    assert all("<path" in svg for svg in charts.values())  # each chart drew something
    assert ">score<" in charts["metrics"] and ">level<" in charts["state"]
    # The simulated trainer's groups (its rollouts files) became each row's record.
    record = dom.split('<section id="difficulty">')[1].split("</section>")[0]
    assert re.search(r"[1-9][0-9]* row\(s\) observed", record), record
    shot = screenshot(report.as_uri(), tmp_path / "s", "demo-report.png", size="1200,2600")
    assert shot.stat().st_size > 50_000  # a page of charts, not a blank one
