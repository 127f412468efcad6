"""The reference executor: run a (global) DistIR program sequentially on numpy.

Every op computes with its registry reference implementation; collectives get their sequential
meaning (AllGather concatenates, Reduce sums onto the root, ...). Rank ops (``rank.*``) only
make sense with peers, so they run in ``distir.interp.lockstep`` instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from distir.interp.loop import RecursiveCalls, interpret
from distir.ir.dtensor import DTensorType
from distir.ir.function import Function, Module
from distir.ir.ops import Op
from distir.ir.types import ScalarType, TensorType, TupleType, Type
from distir.ops.registry import REGISTRY, OpDef, OpKind, OpTypeError


class ReferenceDomain(RecursiveCalls[Any]):
    def __init__(self) -> None:
        self._defs: dict[str, OpDef] = {}

    def op(self, op: Op, args: Sequence[Any]) -> Sequence[Any]:
        d = self._defs.get(op.name)
        if d is None:
            d = self._defs[op.name] = REGISTRY[op.name]
        if d.kind is OpKind.RANK_COMM or d.reference is None:
            raise OpTypeError(
                f"{op.name} has no sequential meaning; run per-rank programs with the lock-step executor"
            )
        outs = tuple(d.reference(args, op.attrs))
        for v, o in zip(op.outputs, outs, strict=False):
            t = v.type
            if isinstance(t, TensorType) and np.shape(o) != t.shape:
                raise OpTypeError(
                    f"{op.name} produced shape {np.shape(o)} for %{v.name}", None, t.shape, np.shape(o)
                )
        return outs


def random_value(t: Type, rng: np.random.Generator) -> Any:
    """A seeded random value of type ``t``: floats ~ N(0, 1), ints in [0, 2), random bools."""
    if isinstance(t, TupleType):
        return tuple(random_value(e, rng) for e in t.elements)
    shape = t.shape if isinstance(t, TensorType | DTensorType) else ()  # a DTensor: its logical value
    dt = t.dtype
    if dt.is_float:
        return rng.standard_normal(shape).astype(dt.to_numpy())
    if dt.is_int:
        return rng.integers(0, 2, size=shape).astype(dt.to_numpy())
    assert isinstance(t, TensorType | ScalarType)
    return rng.random(shape) < 0.5


def random_inputs(fn: Function, seed: int) -> list[Any]:
    rng = np.random.default_rng(seed)
    out = []
    for p in fn.params:
        if p.type is None:
            raise ValueError(f"parameter %{p.name} of @{fn.name} has no type, so no input can be made")
        out.append(random_value(p.type, rng))
    return out


def run_reference(module: Module, args: Sequence[Any], fn: Function | None = None) -> tuple[Any, ...]:
    """Run ``fn`` (default: the entry) on ``args``; returns its outputs."""
    fn = fn if fn is not None else module.entry
    outs, _ = interpret(module, fn, list(args), ReferenceDomain())
    return outs
