"""Shared helpers for writing op rules: broadcasting, axis normalization, cost shorthands."""

from __future__ import annotations

import math
from collections.abc import Sequence

from distir.ir.types import TensorType, Type
from distir.ir.values import Attrs
from distir.ops.registry import CostFn, OpTypeError, TypeCtx


def broadcast_shapes(ctx: TypeCtx, shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """Numpy-style broadcasting of ``shapes``; fails naming the incompatible input."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for i, s in enumerate(shapes):
        for k, dim in enumerate(s):
            j = rank - len(s) + k
            if out[j] == 1:
                out[j] = dim
            elif dim not in (1, out[j]):
                ctx.fail(
                    f"input {i + 1} of shape {s} does not broadcast with {tuple(out)}",
                    i,
                    tuple(out),
                    s,
                )
    return tuple(out)


def norm_axis(ctx: TypeCtx, axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        ctx.fail(f"{what} {axis} is out of range for rank {rank}", 0, f"-{rank}..{rank - 1}", axis)
    return axis % rank if rank else 0


def numel(t: Type) -> int:
    if isinstance(t, TensorType):
        return math.prod(t.shape)
    return 1


def out_numel_flops(per_element: float) -> CostFn:
    """A FLOP count of ``per_element`` per output element."""

    def flops(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
        return per_element * sum(numel(t) for t in outs)

    return flops


def in_numel_flops(per_element: float, index: int = 0) -> CostFn:
    """A FLOP count of ``per_element`` per element of input ``index``."""

    def flops(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
        return per_element * numel(ins[index])

    return flops


def norm_axes(ctx: TypeCtx, axes: Sequence[int], rank: int, what: str = "axis") -> list[int]:
    """``axes`` made non-negative; fails on out-of-range or repeated axes."""
    norm = [norm_axis(ctx, a, rank, what) for a in axes]
    if len(set(norm)) != len(norm):
        ctx.fail(f"{ctx.op.name} {what}es repeat: {list(axes)}", None, "distinct axes", list(axes))
    return norm


def float_input(ctx: TypeCtx, i: int, what: str = "input") -> TensorType:
    """Input ``i`` as a tensor, which must have a floating-point dtype."""
    t = ctx.tensor(i)
    if not t.dtype.is_float:
        ctx.fail(f"{ctx.op.name} needs a floating-point {what} (input {i + 1})", i, "a float dtype", t.dtype)
    return t


def same_shape(ctx: TypeCtx, idx: Sequence[int]) -> None:
    """Inputs ``idx`` all have the shape of the first one."""
    ts = [ctx.tensor(i) for i in idx]
    for i, t in zip(idx[1:], ts[1:], strict=True):
        if t.shape != ts[0].shape:
            ctx.fail(
                f"{ctx.op.name}: input {i + 1} has shape {t.shape} but input {idx[0] + 1} has {ts[0].shape}",
                i,
                ts[0].shape,
                t.shape,
            )


def same_dtype(ctx: TypeCtx, idx: Sequence[int]) -> None:
    ts = [ctx.tensor(i) for i in idx]
    for i, t in zip(idx[1:], ts[1:], strict=True):
        if t.dtype != ts[0].dtype:
            ctx.fail(
                f"input {i + 1} has dtype {t.dtype} but input {idx[0] + 1} has {ts[0].dtype}",
                i,
                ts[0].dtype,
                t.dtype,
            )


def int_attr(attrs: Attrs, name: str, default: int) -> int:
    """A reference's view of an int attribute (the verifier has checked its kind)."""
    v = attrs.get(name, default)
    assert isinstance(v, int) and not isinstance(v, bool), (name, v)
    return v


def float_attr(attrs: Attrs, name: str, default: float) -> float:
    v = attrs.get(name, default)
    assert isinstance(v, int | float) and not isinstance(v, bool), (name, v)
    return float(v)


def str_attr(attrs: Attrs, name: str, default: str) -> str:
    v = attrs.get(name, default)
    assert isinstance(v, str), (name, v)
    return v


__all__ = [
    "OpTypeError",
    "broadcast_shapes",
    "float_attr",
    "float_input",
    "in_numel_flops",
    "int_attr",
    "norm_axes",
    "norm_axis",
    "numel",
    "out_numel_flops",
    "same_dtype",
    "same_shape",
    "str_attr",
]
