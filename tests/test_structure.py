"""The package's structure: no import cycle among distir's modules, no long function.

Imports are read from the source (``ast``), not by importing: an edge ``a -> b`` is an import of
module ``b`` executed when ``a`` is imported (at module level, anywhere in the file, but not
under ``if TYPE_CHECKING:``). ``from distir.x import y`` is an edge to ``distir.x.y`` when that is
a module, else to ``distir.x``. Imports inside functions run later and are not edges; but in the
layers of ``NO_DEFERRED_CYCLES`` they are (a cycle closed by an import deferred into a function is
still a cycle, only hidden: ``hardware.cluster`` <-> ``hardware.clusterfile`` once was one).

Functions are measured from their ``def`` to their last line (decorators excluded, nested
functions inside their enclosing one); the ones over ``MAX_LINES`` are listed in
``LONG_FUNCTIONS`` with the reason each is long, and a listed function that became short (or
vanished) must leave the list.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "distir"
MAX_LINES = 100

# layers where no cycle may pass, even counting imports deferred into functions
NO_DEFERRED_CYCLES = (
    "distir.autodiff",
    "distir.hardware",
    "distir.interp",
    "distir.ops",
    "distir.parallel",
    "distir.sim",
)

# "module:qualified name" -> why it is longer than MAX_LINES
LONG_FUNCTIONS: dict[str, str] = {
    "distir.cli:simulate": "a typer command: one parameter per flag of `distir simulate`, each read once",
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level_imports(tree: ast.Module, deferred: bool = False) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports run when the module is imported: the body, into if/try/with blocks, not into
    functions, classes' methods or ``if TYPE_CHECKING:``; with ``deferred``, also every import
    inside a function or method."""
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if deferred:
                yield from (n for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom))
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                stack.extend(node.body)
            stack.extend(node.orelse)
        elif isinstance(node, ast.Try):
            stack.extend([*node.body, *node.orelse, *node.finalbody])
            for h in node.handlers:
                stack.extend(h.body)
        elif isinstance(node, ast.With | ast.ClassDef):
            stack.extend(node.body)


def import_graph(deferred: bool = False) -> dict[str, set[str]]:
    """distir module -> the distir modules it imports when imported (with ``deferred``: or later,
    from inside a function)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in _module_level_imports(ast.parse(path.read_text(), str(path)), deferred):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:  # relative: from the module's package
                    base = name.split(".")
                    base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                    mod = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    mod = node.module or ""
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod for a in node.names]
            graph[name].update(t for t in targets if t in mods and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_imports() -> None:
    g = import_graph()
    assert "distir.ir.types" in g["distir.ir.function"] or "distir.ir.values" in g["distir.ir.function"]
    assert "distir.sim.plan" in g["distir.sim.simulate"]


def test_cycles_are_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles among distir's modules:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_deferred_imports_close_no_cycle_in_the_listed_layers() -> None:
    def listed(m: str) -> bool:
        return any(m == p or m.startswith(p + ".") for p in NO_DEFERRED_CYCLES)

    found = [c for c in cycles(import_graph(deferred=True)) if any(map(listed, c))]
    assert not found, "import cycles (counting imports inside functions):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_deferred_imports_are_edges_when_asked() -> None:
    tree = ast.parse("def f():\n    if x:\n        from distir.ir import types\n")
    assert [type(n).__name__ for n in _module_level_imports(tree)] == []
    assert [type(n).__name__ for n in _module_level_imports(tree, deferred=True)] == ["ImportFrom"]


def long_functions() -> dict[str, int]:
    """ "module:qualified name" -> lines, for every function over MAX_LINES in distir."""
    out: dict[str, int] = {}
    for name, path in _modules().items():
        tree = ast.parse(path.read_text(), str(path))

        def walk(node: ast.AST, prefix: str, name: str = name) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    q = f"{prefix}{child.name}"
                    n = (child.end_lineno or child.lineno) - child.lineno + 1
                    if n > MAX_LINES:
                        out[f"{name}:{q}"] = n
                    walk(child, q + ".")
                elif isinstance(child, ast.ClassDef):
                    walk(child, f"{prefix}{child.name}.")
                else:
                    walk(child, prefix)

        walk(tree, "")
    return out


def test_no_function_over_the_limit_but_the_listed_ones() -> None:
    got = long_functions()
    unlisted = {k: v for k, v in got.items() if k not in LONG_FUNCTIONS}
    assert not unlisted, (
        f"functions over {MAX_LINES} lines (split them, or list them with a reason): {unlisted}"
    )
    stale = sorted(set(LONG_FUNCTIONS) - set(got))
    assert not stale, f"listed as long but no longer over {MAX_LINES} lines: {stale}"
