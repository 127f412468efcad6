"""Matching chains of elementwise ops on scalar constants in an imported program (the
formulas an exporter writes out: GELU's tanh approximation, RMSNorm), and replacing each
matched chain by the fused op it stands for (``replace_matches``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TypeVar

import numpy as np

from distir.frontends.onnx_import.values import Program
from distir.ir.ops import Op
from distir.ir.values import Value

RTOL = 1e-6  # float32 exporters round the formulas' constants (0.044715 -> 0.044714998...)

M = TypeVar("M")


def replace_matches(
    program: Program, outputs: tuple[Value, ...], found: Mapping[int, M], emit: Callable[[Op, int, M], None]
) -> None:
    """``program``'s ops again in order, each op whose id ``found`` maps to a match (the last op
    of a matched chain) replaced by what ``emit(op, node, match)`` emits — its fused form, making
    the op's own results — then what no longer has a reader dropped (the chain's other ops)."""
    if not found:
        return
    ops, origins = program.ops, program.origin
    program.ops, program.origin = [], []
    for op, k in zip(ops, origins, strict=True):
        m = found.get(id(op))
        if m is None:
            program.ops.append(op)
            program.origin.append(k)
        else:
            emit(op, k, m)
    program.drop_dead(outputs)


def scalar_operand(
    program: Program, v: Value, name: str, value: float, made: dict[Value, Op], uses: dict[Value, int]
) -> Value | None:
    """The tensor operand of ``v = name(tensor, value)`` (either order), read by one op only."""
    op = made.get(v)
    if op is None or op.name != name or len(op.inputs) != 2 or uses.get(v) != 1:
        return None
    a, b = op.inputs
    for t, c in ((a, b), (b, a)):
        if program.known(t) is None and scalar(program, c, value):
            return t
    return None


def scalar(program: Program, v: Value, value: float) -> bool:
    """Whether ``v`` is the constant ``value``, up to the rounding of its dtype (an import in
    f16 rounds a formula's constants to about 1e-3)."""
    known = program.known(v)
    if known is None or known.size != 1:
        return False
    tol = max(RTOL, float(np.finfo(known.dtype).eps)) if np.issubdtype(known.dtype, np.floating) else RTOL
    return math.isclose(float(known.reshape(())), value, rel_tol=tol)
