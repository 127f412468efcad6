"""No op name hard-coded outside its family: outside ``src/distir/ops/``, no code dispatches on an
op's name written as a string (``op.name == "Redistribute"``, ``op.name in ("AllReduce", ...)``,
a module-level table of op names); it asks the registry (an ``OpDef`` property: ``kind``,
``cost_class``, ``fusion``, ...) or names the op through its family's ``OpDef``
(``distir.ops.dist.REDISTRIBUTE.name``).

Read from the source (``ast``): a string equal to a registered op name is reported when it is an
operand of a comparison (or an element of a literal compared with), or an element or key of a
tuple, list, set or dict literal assigned at module or class level. Building an op by name
(``fb.op("MatMul", ...)``) is no dispatch and is allowed. Docstrings and f-strings are not read.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import distir

SRC = Path(__file__).resolve().parents[1] / "src" / "distir"

# path under src/distir (a folder ends with "/") -> why it may name ops in its tables
ALLOWED: dict[str, str] = {
    "frontends/onnx_import/": "translates ONNX graphs: the ONNX op names are its input",
    "frontends/torch_import/": "translates aten calls to the distir ops they become",
    "backend/microbench.py": "the calibration's case table: the ops it times and their inputs",
    "backend/dispatch.py": "the calibration's synthetic chain: the ops it runs through the rank worker",
}

_COLLECTIONS = (ast.Tuple, ast.List, ast.Set)


def _strings(node: ast.AST) -> Iterator[ast.Constant]:
    """The string constants of ``node`` itself or, for a literal collection, of its elements."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, _COLLECTIONS):
        for e in node.elts:
            yield from _strings(e)
    elif isinstance(node, ast.Dict):
        for k in node.keys:
            if k is not None:
                yield from _strings(k)
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("frozenset", "set")
    ):
        for a in node.args:
            yield from _strings(a)


def op_name_uses(tree: ast.Module, names: set[str]) -> Iterator[tuple[int, str]]:
    """(line, op name) of every dispatch on an op name written as a string (module docstring)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                yield from ((c.lineno, c.value) for c in _strings(operand) if c.value in names)
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))]:
        for stmt in scope.body:
            if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
                yield from ((c.lineno, c.value) for c in _strings(stmt.value) if c.value in names)


def _allowed(rel: str) -> bool:
    return any(rel == a or (a.endswith("/") and rel.startswith(a)) for a in ALLOWED)


def test_the_check_sees_dispatch_and_allows_building() -> None:
    names = {"MatMul", "Redistribute", "AllReduce"}
    src = """
X = ("AllReduce", "Relu")
def f(op, fb):
    fb.op("MatMul", op)
    if op.name == "Redistribute" or op.name in {"AllReduce"}:
        return "MatMul"
"""
    assert sorted(op_name_uses(ast.parse(src), names)) == [
        (2, "AllReduce"),
        (5, "AllReduce"),
        (5, "Redistribute"),
    ]


def test_no_op_name_is_hard_coded_outside_the_ops() -> None:
    names = {d.name for d in distir.REGISTRY}
    quoted = re.compile("|".join(f"[\"']{re.escape(n)}[\"']" for n in sorted(names)))
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        text = path.read_text()
        if rel.startswith("ops/") or _allowed(rel) or not quoted.search(text):
            continue
        tree = ast.parse(text, str(path))
        found += [f"src/distir/{rel}:{line}: {name!r}" for line, name in op_name_uses(tree, names)]
    assert not found, "op names hard-coded outside src/distir/ops/ (ask the registry):\n" + "\n".join(found)


def test_every_allowed_path_exists() -> None:
    assert all((SRC / a).exists() for a in ALLOWED)
