"""The import graph of the project's sources: no cycle, and each layer imports only the
layers below it: the CLI and the package's public API → runtime (how rounds are run) →
flows → tasks → the core.

Every import counts, the lazy ones inside functions included: a cycle hidden in a
function body still ties two modules together.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dyngen",)
# Top down. The CLI and the package root (its lazy public API) start rounds on the user's
# behalf; the runtime runs the round's flow; flows orchestrate; tasks wrap one stage each.
LAYERS = (("dyngen", "dyngen.cli"), ("dyngen.runtime",), ("dyngen.flows",), ("dyngen.tasks",))


def module_name(path: Path) -> str:
    """`dyngen/store/log.py` → `dyngen.store.log`; a package's `__init__` is the package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, Path]:
    """Every module of the project's packages, by dotted name."""
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `path` imports, anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import mod` imports the module pkg.mod where there is one.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
            # Importing pkg.mod first runs pkg's __init__: an edge to each package above the
            # target, but its own (Python is already inside those when this module loads).
            parent = target.rpartition(".")[0]
            while parent:
                if parent in known and not f"{name}.".startswith(f"{parent}."):
                    found.add(parent)
                parent = parent.rpartition(".")[0]
    return found


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node that may run, at import or later: all but `if TYPE_CHECKING:` blocks,
    which only a type checker reads."""
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def import_graph() -> dict[str, set[str]]:
    """Module → the project modules it imports."""
    modules = sources()
    return {name: imports_of(name, path, set(modules)) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def test_the_graph_sees_lazy_imports() -> None:
    graph = import_graph()
    # cli_rounds imports flows only inside its commands: the graph must still see it.
    assert "dyngen.runtime.in_process" in graph["dyngen.cli.rounds"]


def test_the_graph_sees_the_package_a_submodule_import_runs() -> None:
    graph = import_graph()
    # flows import dyngen.store.location: that runs dyngen/store/__init__.py too.
    assert "dyngen.store" in graph["dyngen.flows.generation_round"]


def test_find_cycle_reports_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def _within_store(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The edges between modules of dyngen/store/, and only those."""
    inside = [m for m in graph if m.startswith("dyngen.store")]
    return {m: {t for t in graph[m] if t.startswith("dyngen.store")} for m in inside}


def test_no_import_cycle() -> None:
    graph = import_graph()
    store = _within_store(graph)
    # The store's own edges are judged by the test below (another branch owns dyngen/store).
    outside = {m: targets - store.get(m, set()) for m, targets in graph.items()}
    cycle = find_cycle(outside)
    assert cycle is None, "import cycle: " + " → ".join(cycle or [])


def test_no_import_cycle_inside_the_store() -> None:
    cycle = find_cycle(_within_store(import_graph()))
    assert cycle is None, "import cycle: " + " → ".join(cycle or [])


def layer_of(module: str) -> int:
    """0 for the CLI and the package root, then runtime, flows, tasks; the core is last."""
    for depth, prefixes in enumerate(LAYERS):
        if any(module == p if p == "dyngen" else module == p or module.startswith(p + ".")
               for p in prefixes):
            return depth
    return len(LAYERS)


def test_layers_import_only_below_them() -> None:
    assert layer_of("dyngen.cli.rounds") < layer_of("dyngen.runtime.in_process") \
        < layer_of("dyngen.flows.generation_round") < layer_of("dyngen.tasks.filter") \
        < layer_of("dyngen.round.admission") == layer_of("dyngen.store")
    graph = import_graph()
    upward = {module: sorted(t for t in targets if layer_of(t) < layer_of(module))
              for module, targets in graph.items()}
    assert {m: t for m, t in upward.items() if t} == {}
