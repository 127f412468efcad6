"""What the gradient ops share: the family's name (their cost class in the simulator) and the
type rule of a gradient shaped like the forward input it follows."""

from __future__ import annotations

from collections.abc import Sequence

from distir.ir.types import Type
from distir.ops._rules import float_input, same_dtype
from distir.ops.registry import TypeCtx

FAMILY = "grad"


def _like_first(ctx: TypeCtx) -> Sequence[Type]:
    same_dtype(ctx, [0, 1])
    dy, x = ctx.tensor(0), ctx.tensor(1)
    if dy.shape != x.shape:
        ctx.fail(f"{ctx.op.name}: gradient and input shapes differ", 1, dy.shape, x.shape)
    return (ctx.out(dy.dtype, dy.shape),)


def _float_like_first(ctx: TypeCtx) -> Sequence[Type]:
    float_input(ctx, 0, "gradient")
    return _like_first(ctx)
