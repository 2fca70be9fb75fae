"""A real browser (headless Chromium) finds a round's lineage artifact in the Prefect UI."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx

from dyngen.report.trend import sparkline
from dyngen.server.local import LocalServer
from tests.browser import render, screenshot
from tests.e2e.conftest import DYNGEN, REPO, env_for, seeded


def test_the_ui_shows_the_rounds_lineage_artifact(server: LocalServer, tmp_path: Path) -> None:
    store = seeded(tmp_path, "audited")
    ran = subprocess.run([*DYNGEN, "--root", str(store.root), "round", "audited", "--step", "42",
                          "--event-id", "evt-ui-1"], env=env_for(server), cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    found = httpx.post(f"{server.api_url}/artifacts/filter",
                       json={"artifacts": {"key": {"any_": ["dyngen-audited-round"]}}}).json()
    assert len(found) == 1
    # the markdown artifact, rendered by the UI: parent → version, counts, trigger, and the
    # trend's sparklines (text: the UI renders it as it renders the table)
    rows_line = sparkline([float(r.rows) for r in store.history("audited")])
    expect = ["audited: v0 → v1", "duplicate: 1", "evt-ui-1", "Trend, v0–v1", rows_line]
    url = f"{server.ui_url}/artifacts/artifact/{found[0]['id']}"
    dom = render(url, tmp_path / "a", expect)
    assert all(text in dom for text in expect), dom[-3000:]
    screenshot(url, tmp_path / "shot", "round-artifact.png")
    # the artifact's history under its stable key, linked to the flow run `<dataset>-v<N>`
    history = render(f"{server.ui_url}/artifacts/key/dyngen-audited-round", tmp_path / "h",
                     ["audited-v1"])
    assert "audited-v1" in history, history[-3000:]
