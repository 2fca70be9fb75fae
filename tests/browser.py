"""Headless Chromium for the tests that check what a person would see in a browser."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
VIRTUAL_MS = 20000
# Screenshots the tests keep for a person to look at (listed in .gitignore).
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


def chromium() -> str:
    """The Chromium executable; fails saying how to install it."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "Chromium is not installed: `apt-get install chromium` (.ci/run does it)"
    return found


def render(url: str, profile: Path, expect: list[str], attempts: int = 3,
           flags: tuple[str, ...] = ()) -> str:
    """The DOM of `url` as headless Chromium renders it, once it shows all of `expect`.

    The UI loads its data after the page; on a busy machine one render can end before
    the API answered, so a render that misses the text is tried again, given twice the
    time each try (a page's second request waits on its first).
    """
    dom = ""
    for attempt in range(attempts):
        budget = f"--virtual-time-budget={VIRTUAL_MS * 2 ** attempt}"
        out = subprocess.run([chromium(), *CHROMIUM_FLAGS, budget, "--window-size=1400,1000",
                              *flags, f"--user-data-dir={profile}{attempt}", "--dump-dom", url],
                             capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stderr[-2000:]
        dom = out.stdout
        if all(text in dom for text in expect):
            break
    return dom


def screenshot(url: str, profile: Path, name: str, size: str = "1400,1000") -> Path:
    """A PNG of `url` as headless Chromium shows it, kept under tests/artifacts/."""
    ARTIFACTS.mkdir(exist_ok=True)
    out = ARTIFACTS / name
    out.unlink(missing_ok=True)
    ran = subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--virtual-time-budget={VIRTUAL_MS}",
                          f"--window-size={size}",
                          f"--user-data-dir={profile}", f"--screenshot={out}", url],
                         capture_output=True, text=True, timeout=180)
    assert ran.returncode == 0 and out.is_file(), ran.stderr[-2000:]
    print(f"screenshot: {out}")  # shown with -s / -rA; kept after the run
    return out
