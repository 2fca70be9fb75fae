"""Build the API reference: one page per module of dyngen's packages, and their nav.

Run by mkdocs-gen-files at build time. It walks the packages' folders, so a module that
is added, moved or removed needs no edit here: the pages and SUMMARY.md follow the tree.
mkdocstrings reads the source statically (griffe), so modules whose optional
dependencies (torch, ray, trl, verl) are not installed still get their page.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dyngen",)
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

# The public API: the names `from dyngen import ...` gives, and only those (dyngen's
# `_public_api` table, read from the source so the page cannot drift from it).
public = ast.literal_eval(next(
    node.value for node in ast.parse((ROOT / "dyngen" / "__init__.py").read_text()).body
    if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "_public_api"))
with mkdocs_gen_files.open(OUT / "index.md", "w") as fd:
    fd.write("# API reference\n\nThe public API is what `from dyngen import ...` gives:\n\n"
             "```python\nfrom dyngen import (" + ", ".join(public) + ")\n```\n\n"
             "Everything else is free to move. The modules' own pages follow in the "
             "navigation; the import direction is `dyngen.flows → dyngen.tasks → the rest "
             "of dyngen`.\n\n")
    for name, module in public.items():
        fd.write(f"## `{name}`\n\n::: {module}.{name}\n    options:\n"
                 "      show_root_heading: false\n\n")

with mkdocs_gen_files.open(OUT / "SUMMARY.md", "w") as fd:
    fd.write("* [Overview](index.md)\n")
    fd.writelines(nav.build_literate_nav())
