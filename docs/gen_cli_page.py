"""Append the `dyngen` command's reference, generated from its typer app, to reference/cli.md.

Run by mkdocs-gen-files at build time. The app is found through the `dyngen` console
script's entry point (today `dyngen.cli:main`), and its Markdown comes from typer's own
generator (`typer <module> utils docs`), so a command or option added later, or the app
moved to another module, appears here with no edit.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from importlib.metadata import entry_points

import mkdocs_gen_files
import typer

PAGE = "reference/cli.md"


def app_module() -> str:
    """The module that the `dyngen` console script's entry point names."""
    found = [ep for ep in entry_points(group="console_scripts") if ep.name == "dyngen"]
    if not found:
        raise SystemExit("gen_cli_page: no `dyngen` console script is installed; run "
                         "`pip install -e .` before building the docs.")
    return found[0].value.partition(":")[0]


def app_name(module: str) -> str:
    """The name of the one `typer.Typer` in `module` (typer's own lookup would fall back to
    documenting a plain `main` function as the whole CLI)."""
    loaded = importlib.import_module(module)
    names = [name for name, value in vars(loaded).items() if isinstance(value, typer.Typer)]
    if len(names) != 1:
        raise SystemExit(f"gen_cli_page: expected one typer.Typer app in {module} (the "
                         f"`dyngen` entry point's module), found {names or 'none'}; "
                         "export the app there.")
    return names[0]


def typer_markdown(module: str) -> str:
    """typer's Markdown for the app in `module`, its headings one level down."""
    done = subprocess.run([sys.executable, "-m", "typer", "--app", app_name(module), module,
                           "utils", "docs", "--name", "dyngen"],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"gen_cli_page: `typer {module} utils docs` failed "
                         f"(exit {done.returncode}):\n{done.stderr}")
    lines = []
    for line in done.stdout.splitlines():
        lines.append("#" + line if line.startswith("#") else line)
    return "\n".join(lines) + "\n"


with mkdocs_gen_files.open(PAGE, "a") as page:
    page.write("\n" + typer_markdown(app_module()))
