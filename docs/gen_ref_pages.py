"""Build the API reference: one page per module of dyngen's packages, and their nav.

Run by mkdocs-gen-files at build time. It walks the packages' folders, so a module that
is added, moved or removed needs no edit here: the pages and SUMMARY.md follow the tree.
mkdocstrings reads the source statically (griffe), so modules whose optional
dependencies (torch, ray, trl, verl) are not installed still get their page.

Each object is documented once (mkdocs-autorefs needs one primary URL per identifier;
two fail the strict build): the public API's names (`from dyngen import ...`) on the
overview page, every other object on its module's page. A module page leaves its public
names out (a `filters` option) and links to where they are documented.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dyngen",)
OUT = Path("reference", "api")
# mkdocs.yml's handler-wide filters, repeated where a page sets its own (a page's
# `filters` replaces the global list).
FILTERS = ["!^_"]

# The public API: the names `from dyngen import ...` gives, and only those (dyngen's
# `_public_api` table, read from the source so the page cannot drift from it).
public: dict[str, str] = ast.literal_eval(next(
    node.value for node in ast.parse((ROOT / "dyngen" / "__init__.py").read_text()).body
    if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "_public_api"))
public_in: dict[str, list[str]] = defaultdict(list)  # module -> its public names
for name, module in public.items():
    public_in[module].append(name)


def module_page(module: str) -> str:
    """A module's page: everything it defines but the public names, which it links to."""
    text = f"# `{module}`\n\n::: {module}\n"
    names = public_in.get(module)
    if names:
        # A filter matches a member's name at every level; no public name is reused
        # inside its own module (the build would show the gap: a dead cross-reference).
        hidden = "|".join(re.escape(name) for name in names)
        filters = ", ".join(f'"{f}"' for f in [*FILTERS, f"!^({hidden})$"])
        text += f"    options:\n      filters: [{filters}]\n"
        links = ", ".join(f"[`{name}`][{module}.{name}]" for name in names)
        text += (f"\nAlso defined here, and documented with the public API "
                 f"(`from dyngen import ...`): {links}.\n")
    return text


nav = mkdocs_gen_files.Nav()
documented: set[str] = set()
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
        documented.add(".".join(parts))
        with mkdocs_gen_files.open(OUT / page, "w") as fd:
            fd.write(module_page(".".join(parts)))

missing = set(public_in) - documented
if missing:
    raise SystemExit(f"docs/gen_ref_pages.py: dyngen._public_api names modules with no "
                     f"page: {sorted(missing)}")

with mkdocs_gen_files.open(OUT / "index.md", "w") as fd:
    fd.write("# API reference\n\nThe public API is what `from dyngen import ...` gives:\n\n"
             "```python\nfrom dyngen import (" + ", ".join(public) + ")\n```\n\n"
             "These names are documented here, and only here; everything else is free to "
             "move. The modules' own pages follow in the navigation; the import direction "
             "is `dyngen.flows → dyngen.tasks → the rest of dyngen`.\n\n")
    for name, module in public.items():
        fd.write(f"## `{name}`\n\nDefined in [`{module}`][{module}].\n\n"
                 f"::: {module}.{name}\n    options:\n      show_root_heading: false\n\n")

with mkdocs_gen_files.open(OUT / "SUMMARY.md", "w") as fd:
    fd.write("* [Overview](index.md)\n")
    fd.writelines(nav.build_literate_nav())
