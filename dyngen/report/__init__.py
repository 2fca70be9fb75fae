"""`dyngen report`: a dataset's history drawn as one self-contained HTML page.

    from dyngen.report import write_report
    write_report(Store("dyngen_store"), "gsm8k-dyn", "report.html")

Long histories: the page draws the newest `newest` versions (1,000 by default; 0 or None
for all), read through `Store.history(name, newest=...)`.
"""

from __future__ import annotations

import os
from pathlib import Path

from dyngen.progress import QUIET, Bar
from dyngen.report.history import History, history_of
from dyngen.store import Store

DEFAULT_NEWEST = 1000

__all__ = ["DEFAULT_NEWEST", "History", "history_of", "report_html", "write_report"]


def report_html(store: Store, name: str, newest: int | None = DEFAULT_NEWEST,
                progress: Bar = QUIET) -> str:
    """The report of dataset `name` as HTML text."""
    from dyngen.report.page import render_page  # matplotlib loads only when drawing

    progress.stage(f"reading the history of {name}")
    head = store.head(name)
    records = store.history(name, newest=newest or None)
    progress.stage("drawing charts")
    return render_page(store, history_of(records, head.version + 1), records)


def write_report(store: Store, name: str, out: str | os.PathLike[str] = "report.html",
                 newest: int | None = DEFAULT_NEWEST, progress: Bar = QUIET) -> Path:
    """Write the report of dataset `name` to `out` (atomically); return its path."""
    page = report_html(store, name, newest, progress)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, path)
    return path
