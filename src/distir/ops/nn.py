"""Neural-network layers (ONNX names): Softmax, LayerNormalization, RMSNormalization.

The normalizations work over the trailing axes ``[axis, rank)`` of ``X`` (ONNX semantics);
``Scale`` (and ``B``) broadcast against those axes. References compute in float64 and round
once to the input dtype. Helpers here are shared with their gradients in ``distir.ops.grad``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from distir.ir.types import TensorType, Type
from distir.ir.values import Attrs
from distir.ops import sharding as sh
from distir.ops._rules import (
    float_attr,
    float_input,
    int_attr,
    norm_axis,
    out_numel_flops,
    same_dtype,
)
from distir.ops._special import F64, f64
from distir.ops.registry import AttrSpec, OpDef, TypeCtx, register

FAMILY = "nn"


# -- Softmax ----------------------------------------------------------------------------------
def softmax_axis(ctx: TypeCtx, t: TensorType) -> int:
    if t.rank == 0:
        ctx.fail(f"{ctx.op.name} needs an input of rank >= 1", 0, "rank >= 1", 0)
    return norm_axis(ctx, ctx.attr("axis"), t.rank, f"{ctx.op.name} axis")


def _softmax_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = float_input(ctx, 0)
    softmax_axis(ctx, t)
    return (ctx.out(t.dtype, t.shape),)


def softmax(x: Any, axis: int) -> F64:
    """Numerically stable softmax along ``axis`` in float64."""
    xd = f64(x)
    e = np.exp(xd - np.max(xd, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)  # type: ignore[no-any-return]


def log_softmax(x: Any, axis: int) -> F64:
    xd = f64(x)
    z = xd - np.max(xd, axis=axis, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=axis, keepdims=True))  # type: ignore[no-any-return]


def _softmax_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[0])
    return (softmax(x, int_attr(attrs, "axis", -1)).astype(x.dtype),)


SOFTMAX = register(
    OpDef(
        name="Softmax",
        family=FAMILY,
        inputs=("input",),
        outputs=("output",),
        infer=_softmax_rule,
        attrs={"axis": AttrSpec("int", -1)},
        reference=_softmax_ref,
        flops=out_numel_flops(5.0),
        doc="exp(x - max) / sum(exp(x - max)) along one axis (ONNX opset 13 Softmax).",
        sharding=sh.whole_axes("axis"),
    )
)


# -- normalizations ---------------------------------------------------------------------------
def norm_start(ctx: TypeCtx, x: TensorType) -> int:
    """The first normalized axis of ``x`` (``axis`` attribute, normalized)."""
    if x.rank == 0:
        ctx.fail(f"{ctx.op.name} needs an input of rank >= 1", 0, "rank >= 1", 0)
    return norm_axis(ctx, ctx.attr("axis"), x.rank, f"{ctx.op.name} axis")


def check_param(ctx: TypeCtx, i: int, x_index: int, start: int) -> TensorType:
    """Input ``i`` (a Scale or bias) must broadcast to X's normalized shape without growing it."""
    x, p = ctx.tensor(x_index), ctx.tensor(i)
    same_dtype(ctx, [x_index, i])
    normed = x.shape[start:]
    fits = all(d in (1, n) for d, n in zip(p.shape[::-1], normed[::-1], strict=False))
    if p.rank > len(normed) or not fits:
        name = ctx.op.inputs[i].rstrip("?")
        ctx.fail(
            f"{ctx.op.name}: {name} of shape {p.shape} does not broadcast to the normalized "
            f"shape {normed} (axes {start}..{x.rank - 1} of X)",
            i,
            normed,
            p.shape,
        )
    return p


def _norm_rule(ctx: TypeCtx) -> Sequence[Type]:
    x = float_input(ctx, 0, "X")
    start = norm_start(ctx, x)
    for i in range(1, len(ctx.types)):
        check_param(ctx, i, 0, start)
    return (ctx.out(x.dtype, x.shape),)


def norm_axes_of(x: np.ndarray, attrs: Attrs) -> tuple[int, ...]:
    start = int_attr(attrs, "axis", -1) % x.ndim
    return tuple(range(start, x.ndim))


def layer_norm_stats(x: F64, axes: tuple[int, ...], eps: float) -> tuple[F64, F64]:
    """(x̂, 1/σ): the normalized input and the reciprocal standard deviation (keepdims)."""
    mu = np.mean(x, axis=axes, keepdims=True)
    var = np.mean((x - mu) ** 2, axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    return (x - mu) * rstd, rstd


def rms_norm_stats(x: F64, axes: tuple[int, ...], eps: float) -> tuple[F64, F64]:
    """(x̂, 1/rms): x scaled by its reciprocal root mean square (keepdims)."""
    r = 1.0 / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + eps)
    return x * r, r


def _layer_norm_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[0])
    xhat, _ = layer_norm_stats(f64(x), norm_axes_of(x, attrs), float_attr(attrs, "epsilon", 1e-5))
    y = xhat * f64(args[1])
    if len(args) > 2 and args[2] is not None:
        y = y + f64(args[2])
    return (y.astype(x.dtype),)


def _rms_norm_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[0])
    xhat, _ = rms_norm_stats(f64(x), norm_axes_of(x, attrs), float_attr(attrs, "epsilon", 1e-5))
    return ((xhat * f64(args[1])).astype(x.dtype),)


NORM_ATTRS = {"axis": AttrSpec("int", -1), "epsilon": AttrSpec("float", 1e-5)}

LAYER_NORMALIZATION = register(
    OpDef(
        name="LayerNormalization",
        family=FAMILY,
        inputs=("X", "Scale", "B?"),
        outputs=("Y",),
        infer=_norm_rule,
        attrs=dict(NORM_ATTRS),
        reference=_layer_norm_ref,
        flops=out_numel_flops(8.0),
        doc="Y = (X - mean) / sqrt(var + epsilon) * Scale + B over axes [axis, rank).",
        sharding=sh.whole_axes("axis", to_end=True),
    )
)
RMS_NORMALIZATION = register(
    OpDef(
        name="RMSNormalization",
        family=FAMILY,
        inputs=("X", "scale"),
        outputs=("Y",),
        infer=_norm_rule,
        attrs=dict(NORM_ATTRS),
        reference=_rms_norm_ref,
        flops=out_numel_flops(5.0),
        doc="Y = X / sqrt(mean(X^2) + epsilon) * scale over axes [axis, rank).",
        sharding=sh.whole_axes("axis", to_end=True),
    )
)

__all__ = [
    "check_param",
    "layer_norm_stats",
    "log_softmax",
    "norm_axes_of",
    "norm_start",
    "rms_norm_stats",
    "softmax",
    "softmax_axis",
]
