"""Gradient rules of convolution and pooling (contract: ``distir.ops.gradrules``), kept beside
``distir.ops.conv`` (which imports this module at its end) so that file stays short: each emits
the matching gradient op of ``distir.ops.grad`` with the forward op's attributes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distir.ir.ops import Op
from distir.ir.values import Value
from distir.ops.conv import AVERAGE_POOL, CONV, MAX_POOL
from distir.ops.gradrules import GradCtx, first

Grads = Sequence[Value | None]


def _conv_grad(ctx: GradCtx, op: Op, douts: Grads) -> Grads:
    """ConvGrad gives (dX, dW, dB); dB only when the forward had a bias."""
    x, w = ctx.primal(op.inputs[0]), ctx.primal(op.inputs[1])
    attrs: dict[str, Any] = dict(op.attrs.items())
    dx, dw, db = ctx.op("ConvGrad", first(douts), x, w, **attrs)
    return [dx, dw, db][: len(op.inputs)]


def _pool_grad(grad_op: str) -> object:
    def rule(ctx: GradCtx, op: Op, douts: Grads) -> Grads:
        attrs: dict[str, Any] = dict(op.attrs.items())
        return ctx.op(grad_op, first(douts), ctx.primal(op.inputs[0]), **attrs)

    return rule


CONV.fill("grad", _conv_grad)
MAX_POOL.fill("grad", _pool_grad("MaxPoolGrad"))
AVERAGE_POOL.fill("grad", _pool_grad("AveragePoolGrad"))
