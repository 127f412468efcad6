"""``annotate_types``: a pass that writes inferred types into the program text.

The entry function gets a type on every value. A callee gets types too when every call reaches
it with the same argument types (it is monomorphic in this program); a callee called with
different types (e.g. on two devices) keeps what its author wrote, since no single annotation
is right for it. Functions never reached are copied unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from distir.interp.shapes import TypeDomain, infer_types, type_of
from distir.ir.builder import FunctionBuilder
from distir.ir.function import Function, Module
from distir.ir.rewrite import ValueMap, copy_instr
from distir.ir.types import Type
from distir.ir.values import Value


def _typed_copy(fn: Function, types: Mapping[Value, Type]) -> Function:
    vmap = ValueMap(lambda v: Value(v.name, types.get(v, v.type)))
    fb = FunctionBuilder(fn.name)
    for p in fn.params:
        vmap.bind(p, fb.param(p.name, types.get(p, p.type)))
    for instr in fn.body:
        fb.append(copy_instr(instr, vmap))
    return replace(fb.ret(*(vmap(v) for v in fn.outputs)), donated=fn.donated)


def annotate_types(module: Module, concrete: Mapping[str, Any] | None = None) -> Module:
    """A copy of ``module`` with inferred types written on values (see the module docstring)."""
    domain = TypeDomain(record=True)
    _, entry_env = infer_types(module, concrete=concrete, domain=domain)
    out: list[Function] = []
    for fn in module.functions:
        if fn is module.entry:
            out.append(_typed_copy(fn, {v: type_of(x) for v, x in entry_env.items()}))
            continue
        seen = domain.envs.get(fn.name, [])
        # typed only if every call gives every value the same type (results may depend on known
        # argument values, not only on argument types: a callee reshaping to a given shape)
        typings = [{v: type_of(x) for v, x in env.items()} for _, env in seen]
        if typings and all(t == typings[0] for t in typings[1:]):
            out.append(_typed_copy(fn, typings[0]))
        else:
            out.append(fn)
    return Module(tuple(out))
