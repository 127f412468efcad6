"""Alpha-equivalence of modules, for round-trip tests.

Two modules are structurally equal when they have the same functions in the same order, and
corresponding functions have the same name, parameter/result counts and declared types, the same
instructions (op name and attributes, or callee) reading the same data-flow positions, and the
same returns. Values are matched positionally (by definition order), never by identity; name
hints are compared after the printer's uniquification (``Namer``), so ``Value("a b")`` matches
a parsed ``%a_b``.

Attributes are compared strictly: recursively type-exact (``1``, ``1.0`` and ``True`` differ,
also inside lists) and float-exact by ``repr`` (``nan`` matches ``nan``, ``-0.0`` differs from
``0.0``) -- stronger than ``Attrs.__eq__``, which is checked as well.
"""

from __future__ import annotations

import math

from distir.ir import Call, Function, Module, Op, Value
from distir.ir.printer import Namer
from distir.ir.values import Attrs, AttrValue


def attr_identical(a: AttrValue, b: AttrValue) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple):
        assert isinstance(b, tuple)
        return len(a) == len(b) and all(attr_identical(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return repr(a) == repr(b)
    return a == b


def _has_nan(v: AttrValue) -> bool:
    if isinstance(v, tuple):
        return any(_has_nan(x) for x in v)
    return isinstance(v, float) and math.isnan(v)


def attrs_diff(a: Attrs, b: Attrs) -> str | None:
    ka, kb = [k for k, _ in a.items_in_order()], [k for k, _ in b.items_in_order()]
    if ka != kb:
        return f"attribute names {ka} != {kb}"
    for k in ka:
        if not attr_identical(a[k], b[k]):
            return f"attribute {k}: {a[k]!r} != {b[k]!r}"
    if a != b and not any(_has_nan(v) for v in a.values()):
        return f"Attrs equality disagrees: {a!r} != {b!r}"
    return None


def _print_order(fn: Function) -> list[Value]:
    """Values in the order the printer names them: parameters, then each instruction's results."""
    vals = list(fn.params)
    for instr in fn.body:
        vals.extend(instr.outputs)
    return vals


def function_diff(fa: Function, fb: Function) -> str | None:
    where = f"@{fa.name}"
    if fa.name != fb.name:
        return f"function name {fa.name!r} != {fb.name!r}"
    if len(fa.params) != len(fb.params):
        return f"{where}: {len(fa.params)} params != {len(fb.params)}"
    if len(fa.body) != len(fb.body):
        return f"{where}: {len(fa.body)} instructions != {len(fb.body)}"
    va, vb = _print_order(fa), _print_order(fb)
    if len(va) != len(vb):
        return f"{where}: {len(va)} defined values != {len(vb)}"
    pos_a = {v: i for i, v in reversed(list(enumerate(va)))}
    pos_b = {v: i for i, v in reversed(list(enumerate(vb)))}
    na, nb = Namer(), Namer()
    for i, (x, y) in enumerate(zip(va, vb, strict=True)):
        if na(x) != nb(y):
            return f"{where}: value {i} is named %{na(x)} vs %{nb(y)}"
        if x.type != y.type:
            return f"{where}: %{na(x)} has type {x.type} vs {y.type}"

    def flow(vals: tuple[Value, ...], pos: dict[Value, int]) -> list[int | None]:
        return [pos.get(v) for v in vals]

    for j, (ia, ib) in enumerate(zip(fa.body, fb.body, strict=True)):
        at = f"{where}, instruction {j}"
        if type(ia) is not type(ib):
            return f"{at}: {type(ia).__name__} vs {type(ib).__name__}"
        if isinstance(ia, Op):
            assert isinstance(ib, Op)
            if ia.name != ib.name:
                return f"{at}: op {ia.name} vs {ib.name}"
            d = attrs_diff(ia.attrs, ib.attrs)
            if d is not None:
                return f"{at} ({ia.name}): {d}"
        else:
            assert isinstance(ia, Call) and isinstance(ib, Call)
            if ia.callee != ib.callee:
                return f"{at}: call of @{ia.callee} vs @{ib.callee}"
        if flow(ia.inputs, pos_a) != flow(ib.inputs, pos_b):
            return f"{at}: inputs {flow(ia.inputs, pos_a)} vs {flow(ib.inputs, pos_b)}"
        if flow(ia.outputs, pos_a) != flow(ib.outputs, pos_b):
            return f"{at}: results {flow(ia.outputs, pos_a)} vs {flow(ib.outputs, pos_b)}"
    if flow(fa.outputs, pos_a) != flow(fb.outputs, pos_b):
        return f"{where}: returns {flow(fa.outputs, pos_a)} vs {flow(fb.outputs, pos_b)}"
    return None


def structural_diff(a: Module, b: Module) -> str | None:
    """The first structural difference between ``a`` and ``b``, or None if they are equal."""
    names_a = [f.name for f in a.functions]
    names_b = [f.name for f in b.functions]
    if names_a != names_b:
        return f"functions {names_a} != {names_b}"
    for fa, fb in zip(a.functions, b.functions, strict=True):
        d = function_diff(fa, fb)
        if d is not None:
            return d
    return None


def structurally_equal(a: Module, b: Module) -> bool:
    return structural_diff(a, b) is None
