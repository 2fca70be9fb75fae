"""Build the API reference: one page per module of dyngen's packages, and their nav.

Run by mkdocs-gen-files at build time. It walks the packages' folders, so a module that
is added, moved or removed needs no edit here: the pages and SUMMARY.md follow the tree.
mkdocstrings reads the source statically (griffe), so modules whose optional
dependencies (torch, ray, trl, verl) are not installed still get their page.
"""

from __future__ import annotations

from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dyngen", "generators", "flows", "tasks")
OUT = Path("reference", "api")

nav = mkdocs_gen_files.Nav()
for package in PACKAGES:
    for source in sorted((ROOT / package).rglob("*.py")):
        parts = list(source.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__main__" or any(p.startswith("_") and p != "__init__"
                                          for p in parts):
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
            page = Path(*parts, "index.md")
        else:
            page = Path(*parts).with_suffix(".md")
        nav[tuple(parts)] = page.as_posix()
        with mkdocs_gen_files.open(OUT / page, "w") as fd:
            fd.write(f"# `{'.'.join(parts)}`\n\n::: {'.'.join(parts)}\n")

with mkdocs_gen_files.open(OUT / "index.md", "w") as fd:
    fd.write("# API reference\n\nGenerated from the docstrings, one page per module. The "
             "import direction is `flows → tasks → dyngen, generators`.\n\n")
    fd.writelines(f"- [`{package}`]({package}/index.md)\n" for package in PACKAGES)

with mkdocs_gen_files.open(OUT / "SUMMARY.md", "w") as fd:
    fd.write("* [Overview](index.md)\n")
    fd.writelines(nav.build_literate_nav())
