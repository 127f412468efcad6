"""Gradient ops: the backward counterparts of forward ops that are not themselves compositions
of forward ops (``ReluGrad(dy, x) = dy * (x > 0)``, ...)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from distir.ir.types import Type
from distir.ir.values import Attrs
from distir.ops._rules import out_numel_flops, same_dtype
from distir.ops.registry import OpDef, TypeCtx, register

FAMILY = "grad"


def _like_first(ctx: TypeCtx) -> Sequence[Type]:
    same_dtype(ctx, [0, 1])
    dy, x = ctx.tensor(0), ctx.tensor(1)
    if dy.shape != x.shape:
        ctx.fail(f"{ctx.op.name}: gradient and input shapes differ", 1, dy.shape, x.shape)
    return (ctx.out(dy.dtype, dy.shape),)


def _relu_grad(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    dy, x = np.asarray(args[0]), np.asarray(args[1])
    return ((dy * (x > 0)).astype(dy.dtype, copy=False),)


RELU_GRAD = register(OpDef(
    name="ReluGrad", family=FAMILY, inputs=("dY", "X"), outputs=("dX",), infer=_like_first,
    reference=_relu_grad, flops=out_numel_flops(1.0),  # type: ignore[arg-type]
    doc="dX = dY * (X > 0), the gradient of Relu at X.",
))
