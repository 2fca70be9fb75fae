"""Progress bars on long commands: drawn on a terminal, absent from piped output."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from dyngen.progress import QUIET, progress_bar
from tests.rows import verl_rows

REPO = Path(__file__).resolve().parents[1]
DYNGEN = [sys.executable, "-m", "dyngen.cli"]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
BAR = "━"  # rich's bar segments


def on_terminal(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run `args` with stdin, stdout and stderr on a pseudo-terminal; exit code and output."""
    controller, terminal = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm-256color", "COLUMNS": "120"}
    env.pop("FORCE_COLOR", None)
    proc = subprocess.Popen(args, stdin=terminal, stdout=terminal, stderr=terminal, cwd=cwd,
                            env=env, close_fds=True)
    os.close(terminal)
    chunks = []
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the terminal closed: the process is gone
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(controller)
    return proc.wait(timeout=120), ANSI.sub("", b"".join(chunks).decode(errors="replace"))


def piped(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run `args` with output to pipes, as a script or CI log would."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A verl parquet file with several row groups."""
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(verl_rows(3000)), path, row_group_size=1000)
    return path


def commands(root: Path, source: Path, tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """Each long command, with text its progress bar shows (import: the prompts hashed)."""
    base = [*DYNGEN, "--root", str(root)]
    return {
        "import": ([*base, "import", "big", str(source)], "3,000/3,000 rows"),
        "export": ([*base, "export", "big", str(tmp_path / "out.parquet")], "writing out.parquet"),
        "verify": ([*base, "verify", "big"], "verifying big"),
    }


def test_long_commands_draw_progress_bars_on_a_terminal(source: Path, tmp_path: Path) -> None:
    for name, (args, stage) in commands(tmp_path / "store", source, tmp_path).items():
        code, out = on_terminal(args, tmp_path)
        assert code == 0, out
        assert stage in out and BAR in out, f"{name}: no progress bar in {out!r}"


def test_piped_output_has_no_progress_bars(source: Path, tmp_path: Path) -> None:
    for name, (args, stage) in commands(tmp_path / "store", source, tmp_path).items():
        out = piped(args, tmp_path)
        assert out.returncode == 0, out.stdout + out.stderr
        both = out.stdout + out.stderr
        assert stage not in both and BAR not in both and "\x1b[" not in both, f"{name}: {both!r}"
    assert pq.read_table(tmp_path / "out.parquet").num_rows == 3000


def test_progress_bar_is_quiet_off_a_terminal() -> None:
    with progress_bar("work", 10, "items", console=Console(file=io.StringIO())) as bar:
        assert bar is QUIET


def test_progress_bar_counts_stages_on_a_terminal() -> None:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    with progress_bar("reading", 4, "files", console=console) as bar:
        bar.advance(4)
        bar.stage("writing", 10, "rows")
        bar.advance(3)
        console.print("", end="")  # the final refresh happens on exit
    text = ANSI.sub("", screen.getvalue())
    assert "reading" in text and "4/4 files" in text and "writing" in text
