"""The code blocks of the documentation site's pages, and what their markup says to do.

A block's fence names its language; an HTML comment on the line just above the fence
(invisible on the site) may say how it is tested instead of running it:

    <!-- docs-test: skip REASON -->            not run; the reason is required
    <!-- docs-test: covered-by TEST [REASON] --> not run here: TEST (tests/x.py::test_y,
                                                  or a test file) runs it, and must exist
    <!-- docs-test: output -->                  a `text` block whose lines the block
                                                  before it must print
    <!-- docs-test: defaults -->                a `yaml` block equal to dyngen's defaults

and one page-level comment, anywhere on a page:

    <!-- docs-test: fixture gsm8k-dyn -->       the page runs in a folder that holds
                                                  ./dyngen_store with the dataset gsm8k-dyn
                                                  (versions 0..3) and ./train.parquet

A `bash` block of plain `dyngen` commands (no shell syntax) can run in-process; any
other needs a shell (`dyngen_commands` tells which).

A fence's `title="path"` (shown on the site as the file's name) makes the block a file
that the page's folder gets before the blocks after it run. `--8<-- "path"` lines are
replaced by that repository file, as the site's pymdownx.snippets does.
"""

from __future__ import annotations

import ast
import re
import shlex
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

PYTHON = {"python", "py"}
SHELL = {"bash", "sh", "shell", "console"}
YAML = {"yaml", "yml"}
JSON = {"json", "jsonl"}
# Not code: output, diagrams, fragments of another program's command line.
INERT = {"text", "toml", "ini", "diff", "html", "markdown", "md"}
KNOWN = PYTHON | SHELL | YAML | JSON | INERT
BLOCK_MARKERS = {"skip", "covered-by", "output", "defaults"}
FIXTURES = {"gsm8k-dyn"}

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_MARKER = re.compile(r"<!--\s*docs-test:\s*(?P<body>.*?)\s*-->")
_TITLE = re.compile(r'title="(?P<title>[^"]*)"')
_SNIPPET = re.compile(r'^(?P<indent>\s*)--8<--\s+"(?P<path>[^"]+)"\s*$')


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: where it is, its language, markup and text."""

    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    title: str | None
    marker: str | None  # the docs-test comment's body just above the fence
    code: str

    @property
    def where(self) -> str:
        """page:line, the page relative to the repository when it is in it."""
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"

    @property
    def kind(self) -> str:
        """What the marker says: run (no marker), skip, covered-by, output or defaults."""
        return self.marker.split()[0] if self.marker else "run"

    @property
    def reason(self) -> str:
        """The marker's words after its keyword (and after the test, for covered-by)."""
        words = (self.marker or "").split()[1:]
        return " ".join(words[1:] if self.kind == "covered-by" else words)


def pages() -> list[Path]:
    """The README and every page of the site's source (generated pages exist only in the
    build)."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def page_fixtures(page: Path) -> set[str]:
    """The fixtures a page names in its page-level docs-test comments."""
    found = set()
    for match in _MARKER.finditer(page.read_text()):
        words = match["body"].split()
        if words and words[0] == "fixture":
            found.update(words[1:])
    return found


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks, in order, with their markup and snippets included."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, info = opening["indent"], opening["fence"], opening["info"].strip()
        end = i + 1
        while end < len(lines) and not (lines[end].strip().startswith(fence)
                                        and set(lines[end].strip()) == {fence[0]}):
            end += 1
        body = [line[len(indent):] if line.startswith(indent) else line.lstrip()
                for line in lines[i + 1:end]]
        title = _TITLE.search(info)
        found.append(Block(page=page, line=i + 1, lang=(info.split() or [""])[0].lower(),
                           title=title["title"] if title else None,
                           marker=_marker_above(lines, i),
                           code=_with_snippets(textwrap.dedent("\n".join(body)) + "\n")))
        i = end + 1
    return found


def _marker_above(lines: list[str], fence: int) -> str | None:
    """The body of a block-level docs-test comment on the line above the fence."""
    above = fence - 1
    if above < 0:
        return None
    match = _MARKER.search(lines[above])
    if not match or match["body"].split()[0] == "fixture":
        return None
    return match["body"]


def _with_snippets(code: str) -> str:
    """`--8<-- "path"` lines replaced by the repository file they name."""
    out = []
    for line in code.splitlines():
        snippet = _SNIPPET.match(line)
        out.append((ROOT / snippet["path"]).read_text().rstrip("\n") if snippet else line)
    return "\n".join(out) + "\n"


def problems(block: Block) -> list[str]:
    """What is wrong with a block's markup (empty when it says how it is tested)."""
    where = block.where
    if not block.lang:
        return [f"{where}: a fence without a language; name it (`text` for output, "
                "diagrams or fragments that are not run)"]
    if block.lang not in KNOWN:
        return [f"{where}: language {block.lang!r} is not one the docs test knows "
                f"({', '.join(sorted(KNOWN))}); use one of them"]
    if block.marker is None:
        return []
    if block.kind not in BLOCK_MARKERS:
        return [f"{where}: docs-test marker {block.kind!r}; expected one of "
                f"{', '.join(sorted(BLOCK_MARKERS))}"]
    if block.kind == "skip" and len(block.reason.split()) < 3:
        return [f"{where}: `skip` needs a reason of a few words, found {block.reason!r}"]
    if block.kind == "covered-by":
        return [f"{where}: {p}" for p in _missing_test((block.marker or "").split()[1:2])]
    if block.kind == "output" and block.lang != "text":
        return [f"{where}: an `output` block must be `text`, found {block.lang!r}"]
    if block.kind == "defaults" and block.lang not in YAML:
        return [f"{where}: a `defaults` block must be `yaml`, found {block.lang!r}"]
    return []


def _missing_test(named: list[str]) -> list[str]:
    """Why `tests/x.py::[Class::]test_y` (or a test file) does not name an existing test."""
    if not named:
        return ["`covered-by` needs a test: tests/x.py::test_y"]
    path, *names = named[0].split("::")
    file = ROOT / path
    if not path.startswith("tests/") or not file.is_file():
        return [f"`covered-by` names {named[0]!r}, but {path} is not a file under tests/"]
    scope: list[ast.stmt] = ast.parse(file.read_text()).body
    for name in names:
        match = [node for node in scope if isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name]
        if not match:
            return [f"`covered-by` names {named[0]!r}, but {path} has no {name!r}"]
        scope = match[0].body if isinstance(match[0], ast.ClassDef) else []
    return []


_SHELL_SYNTAX = re.compile(r"[;|&$<>`(){}*?~]")


def dyngen_commands(code: str) -> list[list[str]] | None:
    """The argv (after `dyngen`) of each command, if the block is only plain `dyngen`
    commands (no shell syntax); else None, and the block needs a shell."""
    joined = re.sub(r"\\\n", " ", code)
    commands = []
    for line in joined.splitlines():
        line = line.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        if _SHELL_SYNTAX.search(line):
            return None
        argv = shlex.split(line)
        if argv[0] != "dyngen":
            return None
        commands.append(argv[1:])
    return commands or None
