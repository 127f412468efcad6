"""Shared helpers for writing op rules: broadcasting, axis normalization, cost shorthands."""

from __future__ import annotations

import math
from collections.abc import Sequence

from distir.ir.types import TensorType, Type
from distir.ir.values import Attrs
from distir.ops.registry import OpTypeError, TypeCtx


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
                    i, tuple(out), s,
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


def out_numel_flops(per_element: float) -> object:
    """A FLOP count of ``per_element`` per output element."""

    def flops(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
        return per_element * sum(numel(t) for t in outs)

    return flops


def same_dtype(ctx: TypeCtx, idx: Sequence[int]) -> None:
    ts = [ctx.tensor(i) for i in idx]
    for i, t in zip(idx[1:], ts[1:], strict=True):
        if t.dtype != ts[0].dtype:
            ctx.fail(f"input {i + 1} has dtype {t.dtype} but input {idx[0] + 1} has {ts[0].dtype}",
                     i, ts[0].dtype, t.dtype)


__all__ = ["OpTypeError", "broadcast_shapes", "norm_axis", "numel", "out_numel_flops", "same_dtype"]
