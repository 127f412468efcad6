"""Small building blocks for passes: copying code with a value map, and inlining calls.

Passes are pure: they build new functions and modules and never mutate their input.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from distir.ir.builder import FunctionBuilder
from distir.ir.function import Function, Module
from distir.ir.ops import Call, Instr, Op
from distir.ir.values import Value


class ValueMap:
    """Maps old values to new ones, creating a fresh copy (same hint and type) on first use."""

    __slots__ = ("_fresh", "_map")

    def __init__(self, fresh: Callable[[Value], Value] | None = None) -> None:
        self._map: dict[Value, Value] = {}
        self._fresh = fresh if fresh is not None else (lambda v: Value(v.name, v.type))

    def __call__(self, v: Value) -> Value:
        new = self._map.get(v)
        if new is None:
            new = self._map[v] = self._fresh(v)
        return new

    def bind(self, old: Value, new: Value) -> None:
        self._map[old] = new


def copy_instr(instr: Instr, vmap: Callable[[Value], Value]) -> Instr:
    ins = tuple(vmap(v) for v in instr.inputs)
    outs = tuple(vmap(v) for v in instr.outputs)
    if isinstance(instr, Op):
        return Op(instr.name, ins, outs, instr.attrs)
    return Call(instr.callee, ins, outs)


def inline_calls(
    module: Module,
    fn: Function | None = None,
    should_inline: Callable[[Call], bool] = lambda c: True,
) -> Function:
    """``fn`` (default: entry) with the calls chosen by ``should_inline`` replaced by the callee's
    body, recursively (calls inside inlined bodies are offered to ``should_inline`` too).
    Inlined values get fresh copies with their callee's name hints."""
    fn = fn if fn is not None else module.entry
    fb = FunctionBuilder(fn.name)
    top = ValueMap()
    for p in fn.params:
        top.bind(p, fb.param(p.name, p.type))

    def emit(body: tuple[Instr, ...], vmap: ValueMap) -> None:
        for instr in body:
            if isinstance(instr, Call) and should_inline(instr):
                callee = module[instr.callee]
                inner = ValueMap()
                for p, a in zip(callee.params, instr.inputs, strict=True):
                    inner.bind(p, vmap(a))
                emit(callee.body, inner)
                for out, r in zip(instr.outputs, callee.outputs, strict=True):
                    vmap.bind(out, inner(r))
            else:
                fb.append(copy_instr(instr, vmap))

    emit(fn.body, top)
    return replace(fb.ret(*(top(v) for v in fn.outputs)), donated=fn.donated)


def eliminate_dead_code(fn: Function, keep: Callable[[Instr], bool] = lambda i: False) -> Function:
    """``fn`` without the ops and calls whose results nobody uses (``keep`` spares some, e.g.
    ops with effects). Straight-line code, so one backward sweep finds everything dead."""
    live = set(fn.outputs)
    body: list[Instr] = []
    for instr in reversed(fn.body):
        if keep(instr) or any(v in live for v in instr.outputs) or not instr.outputs:
            body.append(instr)
            live.update(instr.inputs)
    body.reverse()
    return Function(fn.name, fn.params, tuple(body), fn.outputs, fn.donated)
