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


def render(url: str, profile: Path, expect: list[str], attempts: int = 3) -> str:
    """The DOM of `url` as headless Chromium renders it, once it shows all of `expect`.

    The UI loads its data after the page; on a busy machine one render can end before
    the API answered, so a render that misses the text is tried again.
    """
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Chromium is not installed: `apt-get install chromium` (.ci/run does it)"
    dom = ""
    for attempt in range(attempts):
        out = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}{attempt}",
                              "--dump-dom", url], capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stderr[-2000:]
        dom = out.stdout
        if all(text in dom for text in expect):
            break
    return dom


def test_the_ui_shows_the_rounds_lineage_artifact(server: LocalServer, tmp_path: Path) -> None:
    store = seeded(tmp_path, "audited")
    ran = subprocess.run([*DYNGEN, "--root", str(store.root), "round", "audited", "--step", "42",
                          "--event-id", "evt-ui-1"], env=env_for(server), cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    found = httpx.post(f"{server.api_url}/artifacts/filter",
                       json={"artifacts": {"key": {"any_": ["dyngen-audited-round"]}}}).json()
    assert len(found) == 1
    # the markdown artifact, rendered by the UI: parent → version, counts, trigger
    expect = ["audited: v0 → v1", "duplicate: 1", "evt-ui-1"]
    dom = render(f"{server.ui_url}/artifacts/artifact/{found[0]['id']}", tmp_path / "a", expect)
    assert all(text in dom for text in expect), dom[-3000:]
    # the artifact's history under its stable key, linked to the flow run `<dataset>-v<N>`
    history = render(f"{server.ui_url}/artifacts/key/dyngen-audited-round", tmp_path / "h",
                     ["audited-v1"])
    assert "audited-v1" in history, history[-3000:]
