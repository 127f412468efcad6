"""Gradient ops: the backward counterparts of forward ops that are not themselves compositions
of forward ops (``ReluGrad(dy, x) = dy * (x > 0)``, ...).

Each takes the incoming gradient first and returns the gradient of the forward op's inputs, in
the forward op's attribute conventions. References compute in float64 and round once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from distir.ir.types import TensorType, Type
from distir.ir.values import Attrs
from distir.ops._rules import (
    float_attr,
    float_input,
    in_numel_flops,
    int_attr,
    out_numel_flops,
    same_dtype,
    same_shape,
    str_attr,
)
from distir.ops._special import F64, f64, normal_cdf, normal_pdf
from distir.ops.loss import REDUCTION, check_pred_target, check_scores_labels, reduction
from distir.ops.nn import (
    NORM_ATTRS,
    check_param,
    layer_norm_stats,
    norm_axes_of,
    norm_start,
    rms_norm_stats,
    softmax,
    softmax_axis,
)
from distir.ops.registry import AttrSpec, OpDef, TypeCtx, register

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


def _relu_grad(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    dy, x = np.asarray(args[0]), np.asarray(args[1])
    return ((dy * (x > 0)).astype(dy.dtype, copy=False),)


RELU_GRAD = register(
    OpDef(
        name="ReluGrad",
        family=FAMILY,
        inputs=("dY", "X"),
        outputs=("dX",),
        infer=_like_first,
        reference=_relu_grad,
        flops=out_numel_flops(1.0),
        doc="dX = dY * (X > 0), the gradient of Relu at X.",
    )
)


# -- elementwise activations ------------------------------------------------------------------
def _pointwise(f: Any) -> Any:
    """A reference dX = f(dY, Z) computed in float64, in dY's dtype."""

    def ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
        dy = np.asarray(args[0])
        return (np.asarray(f(f64(dy), f64(args[1]))).astype(dy.dtype),)

    return ref


def _gelu_grad(dy: F64, x: F64) -> F64:
    return dy * (normal_cdf(x) + x * normal_pdf(x))


GELU_GRAD = register(
    OpDef(
        name="GeluGrad",
        family=FAMILY,
        inputs=("dY", "X"),
        outputs=("dX",),
        infer=_float_like_first,
        reference=_pointwise(_gelu_grad),
        flops=out_numel_flops(12.0),
        doc="dX = dY * (Phi(X) + X * phi(X)), the gradient of exact (erf) Gelu at X.",
    )
)
TANH_GRAD = register(
    OpDef(
        name="TanhGrad",
        family=FAMILY,
        inputs=("dY", "Y"),
        outputs=("dX",),
        infer=_float_like_first,
        reference=_pointwise(lambda dy, y: dy * (1.0 - y * y)),
        flops=out_numel_flops(3.0),
        doc="dX = dY * (1 - Y^2) where Y = Tanh(X).",
    )
)
SIGMOID_GRAD = register(
    OpDef(
        name="SigmoidGrad",
        family=FAMILY,
        inputs=("dY", "Y"),
        outputs=("dX",),
        infer=_float_like_first,
        reference=_pointwise(lambda dy, y: dy * y * (1.0 - y)),
        flops=out_numel_flops(3.0),
        doc="dX = dY * Y * (1 - Y) where Y = Sigmoid(X).",
    )
)


# -- Softmax ----------------------------------------------------------------------------------
def _softmax_grad_rule(ctx: TypeCtx) -> Sequence[Type]:
    out = _float_like_first(ctx)
    softmax_axis(ctx, ctx.tensor(1))
    return out


def _softmax_grad(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    dy0 = np.asarray(args[0])
    dy, y = f64(dy0), f64(args[1])
    ax = int_attr(attrs, "axis", -1)
    return ((y * (dy - np.sum(dy * y, axis=ax, keepdims=True))).astype(dy0.dtype),)


SOFTMAX_GRAD = register(
    OpDef(
        name="SoftmaxGrad",
        family=FAMILY,
        inputs=("dY", "Y"),
        outputs=("dX",),
        infer=_softmax_grad_rule,
        attrs={"axis": AttrSpec("int", -1)},
        reference=_softmax_grad,
        flops=out_numel_flops(4.0),
        doc="dX = Y * (dY - sum(dY * Y, axis)) where Y = Softmax(X, axis).",
    )
)


# -- normalizations ---------------------------------------------------------------------------
def sum_to_shape(g: F64, shape: Sequence[int]) -> F64:
    """Sum ``g`` over the axes along which ``shape`` was broadcast to ``g.shape``."""
    lead = g.ndim - len(shape)
    g = np.sum(g, axis=tuple(range(lead))) if lead else g
    ones = tuple(i for i, d in enumerate(shape) if d == 1 and g.shape[i] != 1)
    return np.sum(g, axis=ones, keepdims=True) if ones else g


def _norm_grad_rule(ctx: TypeCtx) -> tuple[TensorType, TensorType]:
    dy = float_input(ctx, 0, "gradient")
    same_dtype(ctx, [0, 1])
    same_shape(ctx, [0, 1])
    scale = check_param(ctx, 2, 1, norm_start(ctx, ctx.tensor(1)))
    return dy, scale


def _layer_norm_grad_rule(ctx: TypeCtx) -> Sequence[Type]:
    dy, scale = _norm_grad_rule(ctx)
    return (ctx.out(dy.dtype, dy.shape), ctx.out(dy.dtype, scale.shape), ctx.out(dy.dtype, scale.shape))


def _rms_norm_grad_rule(ctx: TypeCtx) -> Sequence[Type]:
    dy, scale = _norm_grad_rule(ctx)
    return (ctx.out(dy.dtype, dy.shape), ctx.out(dy.dtype, scale.shape))


def _layer_norm_grad(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    dy0, scale0 = np.asarray(args[0]), np.asarray(args[2])
    dy, x, scale = f64(dy0), f64(args[1]), f64(scale0)
    axes = norm_axes_of(x, attrs)
    xhat, rstd = layer_norm_stats(x, axes, float_attr(attrs, "epsilon", 1e-5))
    g = dy * scale
    dx = rstd * (
        g - np.mean(g, axis=axes, keepdims=True) - xhat * np.mean(g * xhat, axis=axes, keepdims=True)
    )
    t = dy0.dtype
    return (
        dx.astype(t),
        sum_to_shape(dy * xhat, scale0.shape).astype(t),
        sum_to_shape(dy, scale0.shape).astype(t),
    )


def _rms_norm_grad(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    dy0, scale0 = np.asarray(args[0]), np.asarray(args[2])
    dy, x, scale = f64(dy0), f64(args[1]), f64(scale0)
    axes = norm_axes_of(x, attrs)
    xhat, r = rms_norm_stats(x, axes, float_attr(attrs, "epsilon", 1e-5))
    g = dy * scale
    dx = r * (g - xhat * np.mean(g * xhat, axis=axes, keepdims=True))
    t = dy0.dtype
    return (dx.astype(t), sum_to_shape(dy * xhat, scale0.shape).astype(t))


LAYER_NORMALIZATION_GRAD = register(
    OpDef(
        name="LayerNormalizationGrad",
        family=FAMILY,
        inputs=("dY", "X", "Scale"),
        outputs=("dX", "dScale", "dB"),
        infer=_layer_norm_grad_rule,
        attrs=dict(NORM_ATTRS),
        reference=_layer_norm_grad,
        flops=in_numel_flops(12.0),
        doc="Gradients of LayerNormalization(X, Scale, B) w.r.t. X, Scale and B (B shaped like "
        "Scale); recomputes the statistics from X.",
    )
)
RMS_NORMALIZATION_GRAD = register(
    OpDef(
        name="RMSNormalizationGrad",
        family=FAMILY,
        inputs=("dY", "X", "scale"),
        outputs=("dX", "dScale"),
        infer=_rms_norm_grad_rule,
        attrs=dict(NORM_ATTRS),
        reference=_rms_norm_grad,
        flops=in_numel_flops(9.0),
        doc="Gradients of RMSNormalization(X, scale) w.r.t. X and scale.",
    )
)


# -- losses -----------------------------------------------------------------------------------
def _check_dloss(ctx: TypeCtx, like: int, per_item: tuple[int, ...]) -> None:
    """dLoss is 0-d (a Scalar or 0-d tensor) for mean/sum, else shaped like the per-item loss."""
    same_dtype(ctx, [like, 0])
    d = ctx.tensor(0)
    want = per_item if reduction(ctx) == "none" else ()
    if d.shape != want:
        ctx.fail(
            f"{ctx.op.name}: dLoss has shape {d.shape} but the loss with reduction="
            f"{ctx.attr('reduction')!r} has shape {want}",
            0,
            want,
            d.shape,
        )


def _sce_grad_rule(ctx: TypeCtx) -> Sequence[Type]:
    scores, labels = check_scores_labels(ctx, 1, 2)
    _check_dloss(ctx, 1, labels.shape)
    return (ctx.out(scores.dtype, scores.shape),)


def _sce_grad(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    scores0 = np.asarray(args[1])
    labels = np.asarray(args[2]).astype(np.int64)
    dloss = f64(args[0])
    p = softmax(scores0, 1)
    np.put_along_axis(
        p, np.expand_dims(labels, 1), np.take_along_axis(p, np.expand_dims(labels, 1), axis=1) - 1.0, axis=1
    )
    how = str_attr(attrs, "reduction", "mean")
    if how == "none":
        p = p * np.expand_dims(dloss, 1)
    else:
        p = p * (dloss / labels.size if how == "mean" else dloss)
    return (p.astype(scores0.dtype),)


SOFTMAX_CROSS_ENTROPY_LOSS_GRAD = register(
    OpDef(
        name="SoftmaxCrossEntropyLossGrad",
        family=FAMILY,
        inputs=("dLoss", "scores", "labels"),
        outputs=("dScores",),
        infer=_sce_grad_rule,
        attrs={"reduction": REDUCTION},
        reference=_sce_grad,
        flops=out_numel_flops(7.0),
        doc="dScores = (softmax(scores, 1) - onehot(labels)) * dLoss (divided by the label count "
        "for reduction='mean'; broadcast over classes for 'none').",
    )
)


def _mse_grad_rule(ctx: TypeCtx) -> Sequence[Type]:
    p = check_pred_target(ctx, 1, 2)
    _check_dloss(ctx, 1, p.shape)
    return (ctx.out(p.dtype, p.shape),)


def _mse_grad(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    p0 = np.asarray(args[1])
    g = 2.0 * (f64(p0) - f64(args[2])) * f64(args[0])
    if str_attr(attrs, "reduction", "mean") == "mean":
        g = g / max(p0.size, 1)
    return (g.astype(p0.dtype),)


MSE_LOSS_GRAD = register(
    OpDef(
        name="MSELossGrad",
        family=FAMILY,
        inputs=("dLoss", "prediction", "target"),
        outputs=("dPrediction",),
        infer=_mse_grad_rule,
        attrs={"reduction": REDUCTION},
        reference=_mse_grad,
        flops=out_numel_flops(3.0),
        doc="dPrediction = 2 * (prediction - target) * dLoss (divided by the element count for "
        "reduction='mean').",
    )
)

__all__ = ["sum_to_shape"]
