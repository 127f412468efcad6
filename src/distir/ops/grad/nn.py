"""Gradient ops of the activations, softmaxes and normalizations (family ``grad``): ReluGrad,
GeluGrad, TanhGrad, SigmoidGrad, SiluGrad, SquaredReluGrad, SoftmaxGrad, LogSoftmaxGrad,
LayerNormalizationGrad, RMSNormalizationGrad. Each takes the incoming gradient first; references
compute in float64 and round once (the forward's helpers in ``distir.ops.nn``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from distir.ir.types import TensorType, Type
from distir.ir.values import Attrs
from distir.ops import sharding as sh
from distir.ops._rules import (
    float_attr,
    float_input,
    in_numel_flops,
    int_attr,
    out_numel_flops,
    same_dtype,
    same_shape,
)
from distir.ops._special import F64, f64, gelu_tanh_slope, normal_cdf, normal_pdf
from distir.ops._torch import like, sum_to, upcast
from distir.ops.grad.family import COST_CLASS, FAMILY, _float_like_first, _like_first
from distir.ops.nn import (
    LAYER_NORM_ATTRS,
    NORM_ATTRS,
    NORM_BENCH,
    check_param,
    gamma_shift,
    layer_norm_stats,
    norm_axes_of,
    norm_shape,
    norm_start,
    rms_norm_stats,
    softmax_axis,
)
from distir.ops.registry import AttrSpec, EagerRate, Fusion, InductorSplit, Kink, OpDef, TypeCtx, register

if TYPE_CHECKING:
    from distir.backend.context import TorchContext


def _relu_grad(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    dy, x = np.asarray(args[0]), np.asarray(args[1])
    return ((dy * (x > 0)).astype(dy.dtype, copy=False),)


RELU_GRAD = register(
    OpDef(
        name="ReluGrad",
        family=FAMILY,
        cost_class=COST_CLASS,
        fusion=Fusion.POINTWISE,
        inputs=("dY", "X"),
        outputs=("dX",),
        infer=_like_first,
        reference=_relu_grad,
        flops=out_numel_flops(1.0),
        doc="dX = dY * (X > 0), the gradient of Relu at X.",
        sharding=sh.pointwise("scale"),
    )
)


def _pointwise(f: Any) -> Any:
    """A reference dX = f(dY, Z) computed in float64, in dY's dtype."""

    def ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
        dy = np.asarray(args[0])
        return (np.asarray(f(f64(dy), f64(args[1]))).astype(dy.dtype),)

    return ref


def _activation_grad(name: str, of: str, fn: Any, flops: float, doc: str) -> OpDef:
    """dX = fn(dY, Z) of an activation with a dedicated gradient op, Z its input (``of`` "X") or
    its result ("Y"): one pointwise kernel, float64 reference, scaled with dY when sharded."""
    return register(
        OpDef(
            name=name,
            family=FAMILY,
            cost_class=COST_CLASS,
            fusion=Fusion.POINTWISE,
            inputs=("dY", of),
            outputs=("dX",),
            infer=_float_like_first,
            reference=_pointwise(fn),
            flops=out_numel_flops(flops),
            doc=doc,
            sharding=sh.pointwise("scale"),
        )
    )


def _silu_grad(dy: F64, x: F64) -> F64:
    sig = 1.0 / (1.0 + np.exp(-x))
    return dy * sig * (1.0 + x * (1.0 - sig))


GELU_GRAD = _activation_grad(
    "GeluGrad",
    "X",
    lambda dy, x: dy * (normal_cdf(x) + x * normal_pdf(x)),
    12.0,
    "dX = dY * (Phi(X) + X * phi(X)), the gradient of exact (erf) Gelu at X.",
)
GELU_TANH_GRAD = _activation_grad(
    "GeluTanhGrad",
    "X",
    lambda dy, x: dy * gelu_tanh_slope(x),
    14.0,
    "dX = dY * d/dX GeluTanh(X), the gradient of GELU's tanh approximation at X (torch's "
    "gelu_backward with approximate='tanh': one kernel).",
)
TANH_GRAD = _activation_grad(
    "TanhGrad", "Y", lambda dy, y: dy * (1.0 - y * y), 3.0, "dX = dY * (1 - Y^2) where Y = Tanh(X)."
)
SIGMOID_GRAD = _activation_grad(
    "SigmoidGrad", "Y", lambda dy, y: dy * y * (1.0 - y), 3.0, "dX = dY * Y * (1 - Y) where Y = Sigmoid(X)."
)
SILU_GRAD = _activation_grad(
    "SiluGrad",
    "X",
    _silu_grad,
    8.0,
    "dX = dY * s * (1 + X * (1 - s)) with s = Sigmoid(X), the gradient of Silu at X "
    "(torch's silu_backward: one kernel).",
)
SQUARED_RELU_GRAD = _activation_grad(
    "SquaredReluGrad",
    "X",
    lambda dy, x: 2.0 * dy * np.maximum(x, 0.0),
    3.0,
    "dX = 2 * max(X, 0) * dY, the gradient of SquaredRelu at X (the fused backward of "
    "Megatron-Core's squared_relu: one kernel).",
)


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
        cost_class=COST_CLASS,
        fusion=Fusion.ROWWISE,
        inputs=("dY", "Y"),
        outputs=("dX",),
        infer=_softmax_grad_rule,
        attrs={"axis": AttrSpec("int", -1)},
        reference=_softmax_grad,
        flops=out_numel_flops(4.0),
        doc="dX = Y * (dY - sum(dY * Y, axis)) where Y = Softmax(X, axis).",
        sharding=sh.whole_axes("axis", extra_inputs="same", partial="scale"),
    )
)


def _log_softmax_grad(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    dy0 = np.asarray(args[0])
    dy, y = f64(dy0), f64(args[1])
    ax = int_attr(attrs, "axis", -1)
    return ((dy - np.exp(y) * np.sum(dy, axis=ax, keepdims=True)).astype(dy0.dtype),)


LOG_SOFTMAX_GRAD = register(
    OpDef(
        name="LogSoftmaxGrad",
        family=FAMILY,
        cost_class=COST_CLASS,
        fusion=Fusion.ROWWISE,
        inputs=("dY", "Y"),
        outputs=("dX",),
        infer=_softmax_grad_rule,
        attrs={"axis": AttrSpec("int", -1)},
        reference=_log_softmax_grad,
        flops=out_numel_flops(4.0),
        doc="dX = dY - exp(Y) * sum(dY, axis) where Y = LogSoftmax(X, axis) (torch's "
        "_log_softmax_backward_data).",
        sharding=sh.whole_axes("axis", extra_inputs="same", partial="scale"),
    )
)


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
    g = dy * (scale + gamma_shift(attrs))
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


NORM_GRAD_SPLIT = InductorSplit(
    (0, 1),
    "pytorch/pytorch#165370 (2025-10-13, 'generate fused rms/layer norm bwd'): a normalization's "
    "backward has two reductions, dX over the normalized axis and dScale/dB over the rows, with "
    "common input buffers, which Inductor could not fuse because of their different loop "
    "orders: the dScale kernel reads dY and X again",
)
"""Inductor's normalization backward before pytorch#165370: dX in one kernel, the scale's (and
bias's) gradient in a second reading dY and X again."""

LAYER_NORMALIZATION_GRAD = register(
    OpDef(
        name="LayerNormalizationGrad",
        family=FAMILY,
        cost_class=COST_CLASS,
        fusion=Fusion.ROWWISE,
        inputs=("dY", "X", "Scale"),
        outputs=("dX", "dScale", "dB"),
        infer=_layer_norm_grad_rule,
        attrs=dict(LAYER_NORM_ATTRS),
        reference=_layer_norm_grad,
        flops=in_numel_flops(12.0),
        eager_memory=EagerRate(0.35, NORM_BENCH),  # H100 36%, A100 35%
        inductor_split=NORM_GRAD_SPLIT,
        doc="Gradients of LayerNormalization(X, Scale, B) w.r.t. X, Scale and B (B shaped like "
        "Scale); recomputes the statistics from X (zero_centered_gamma: as the forward's).",
        sharding=sh.norm_grad,
    )
)

RMS_NORMALIZATION_GRAD = register(
    OpDef(
        name="RMSNormalizationGrad",
        family=FAMILY,
        cost_class=COST_CLASS,
        fusion=Fusion.ROWWISE,
        inputs=("dY", "X", "scale"),
        outputs=("dX", "dScale"),
        infer=_rms_norm_grad_rule,
        attrs=dict(NORM_ATTRS),
        reference=_rms_norm_grad,
        flops=in_numel_flops(9.0),
        eager_memory=EagerRate(0.18, NORM_BENCH),
        inductor_split=NORM_GRAD_SPLIT,
        doc="Gradients of RMSNormalization(X, scale) w.r.t. X and scale.",
        sharding=sh.norm_grad,
    )
)


# -- torch implementations (contract: distir.ops._torch) ----------------------------------------
def _relu_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    dy, x = xs
    return (dy * (x > 0).to(dy.dtype),)


def _softmax_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    dy, y = xs
    axis = int_attr(attrs, "axis", -1) % y.dim()
    return (ctx.torch.ops.aten._softmax_backward_data(dy, y, axis, y.dtype),)


def _norm_grad_torch(rms: bool) -> Any:
    """The norms' backward by their formulas (those of the references), accumulating 16-bit
    types in f32 as the fused kernels do: (dX, dScale[, dB])."""

    def impl(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
        dy0, scale0 = xs[0], xs[2]
        dy, x, scale = (upcast(ctx, t) for t in xs)
        axes = tuple(range(x.dim() - len(norm_shape(x, attrs)), x.dim()))
        eps = float_attr(attrs, "epsilon", 1e-5)
        if not rms:
            x = x - x.mean(dim=axes, keepdim=True)
        r = ctx.torch.rsqrt((x * x).mean(dim=axes, keepdim=True) + eps)
        xhat, g = x * r, dy * (scale + gamma_shift(attrs))
        dx = g - xhat * (g * xhat).mean(dim=axes, keepdim=True)
        if not rms:
            dx = dx - g.mean(dim=axes, keepdim=True)
        shape = tuple(scale0.shape)
        grads = (r * dx, sum_to(dy * xhat, shape)) + (() if rms else (sum_to(dy, shape),))
        return tuple(like(t, dy0) for t in grads)

    return impl


def _log_softmax_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    dy, y = xs
    axis = int_attr(attrs, "axis", -1) % y.dim()
    return (ctx.torch.ops.aten._log_softmax_backward_data(dy, y, axis, y.dtype),)


def _aten_grad(name: str) -> Any:
    """dX = aten.<name>(dY, Z): torch's own backward kernel of an activation."""

    def impl(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
        return (getattr(ctx.torch.ops.aten, name)(xs[0], xs[1]),)

    return impl


RELU_GRAD.fill("torch", _relu_grad_torch)
RELU_GRAD.fill("kink", Kink(1))  # dY or 0 by the sign of X
GELU_GRAD.fill("torch", _aten_grad("gelu_backward"))
GELU_TANH_GRAD.fill(
    "torch", lambda ctx, xs, attrs: (ctx.torch.ops.aten.gelu_backward(xs[0], xs[1], approximate="tanh"),)
)
TANH_GRAD.fill("torch", _aten_grad("tanh_backward"))
SIGMOID_GRAD.fill("torch", _aten_grad("sigmoid_backward"))
SILU_GRAD.fill("torch", _aten_grad("silu_backward"))
SQUARED_RELU_GRAD.fill("torch", lambda ctx, xs, attrs: (xs[0] * ctx.torch.relu(xs[1]) * 2,))
SOFTMAX_GRAD.fill("torch", _softmax_grad_torch)
LOG_SOFTMAX_GRAD.fill("torch", _log_softmax_grad_torch)
LAYER_NORMALIZATION_GRAD.fill("torch", _norm_grad_torch(rms=False))
RMS_NORMALIZATION_GRAD.fill("torch", _norm_grad_torch(rms=True))

__all__ = ["sum_to_shape"]
