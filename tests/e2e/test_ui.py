"""A real browser (headless Chromium) finds a round's lineage artifact in the Prefect UI."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import httpx

from dyngen.local_server import LocalServer
from tests.e2e.conftest import DYNGEN, REPO, env_for, seeded

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync",
                  "--virtual-time-budget=20000", "--window-size=1400,1000"]


def render(url: str, profile: Path, *extra: str) -> str:
    """The DOM of `url` after its scripts ran, as headless Chromium renders it."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Chromium is not installed: `apt-get install chromium` (.ci/run does it)"
    out = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra,
                          "--dump-dom", url], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_the_ui_shows_the_rounds_lineage_artifact(server: LocalServer, tmp_path: Path) -> None:
    store = seeded(tmp_path, "audited")
    ran = subprocess.run([*DYNGEN, "--root", str(store.root), "round", "audited", "--step", "42",
                          "--event-id", "evt-ui-1"], env=env_for(server), cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    found = httpx.post(f"{server.api_url}/artifacts/filter",
                       json={"artifacts": {"key": {"any_": ["dyngen-audited-round"]}}}).json()
    assert len(found) == 1
    dom = render(f"{server.ui_url}/artifacts/artifact/{found[0]['id']}", tmp_path / "chromium")
    # the markdown artifact, rendered by the UI: parent → version, counts, trigger
    assert "audited: v0 → v1" in dom
    assert "duplicate: 1" in dom
    assert "evt-ui-1" in dom
    history = render(f"{server.ui_url}/artifacts/key/dyngen-audited-round", tmp_path / "c2")
    assert "audited-v1" in history  # the flow run, named after the dataset and round
