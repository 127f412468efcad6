"""Gradient ops: the backward counterparts of forward ops that are not themselves compositions
of forward ops (``ReluGrad(dy, x) = dy * (x > 0)``, ...).

Each takes the incoming gradient first and returns the gradient of the forward op's inputs, in
the forward op's attribute conventions. References compute in float64 and round once.
Sharding rules (``distir.ops.sharding``): every gradient here is linear in the incoming gradient,
so a pending sum on it (the other inputs replicated) passes to every result.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
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
    numel,
    out_numel_flops,
    same_dtype,
    same_shape,
    str_attr,
)
from distir.ops._special import F64, f64, normal_cdf, normal_pdf
from distir.ops._torch import like, sum_to, upcast, vjp
from distir.ops.conv import (
    AVERAGE_POOL_ATTRS,
    CONV_ATTRS,
    MAX_POOL_ATTRS,
    Window,
    avg_pool_counts,
    conv_macs,
    conv_types,
    grouped,
    max_pool_forward,
    pad_for,
    pool_flops,
    pool_types,
    pool_window,
    torch_avg_pool,
    torch_max_pool,
    torch_pad_for,
    window_of,
)
from distir.ops.loss import (
    REDUCTION,
    check_parts,
    check_pred_target,
    check_scores_labels,
    exp_and_onehot,
    parts_sharding,
    reduction,
    torch_exp_and_onehot,
)
from distir.ops.nn import (
    NORM_ATTRS,
    check_param,
    layer_norm_stats,
    norm_axes_of,
    norm_shape,
    norm_start,
    rms_norm_stats,
    softmax,
    softmax_axis,
)
from distir.ops.registry import AttrSpec, CostClass, Fusion, OpDef, TypeCtx, register
from distir.ops.shape_index import ROWS, rows_localizer

if TYPE_CHECKING:
    from distir.backend.context import TorchContext

FAMILY = "grad"
COST_CLASS = CostClass.GRAD  # how the family's ops are costed


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
        cost_class=COST_CLASS,
        fusion=Fusion.POINTWISE,
        inputs=("dY", "X"),
        outputs=("dX",),
        infer=_float_like_first,
        reference=_pointwise(_gelu_grad),
        flops=out_numel_flops(12.0),
        doc="dX = dY * (Phi(X) + X * phi(X)), the gradient of exact (erf) Gelu at X.",
        sharding=sh.pointwise("scale"),
    )
)
TANH_GRAD = register(
    OpDef(
        name="TanhGrad",
        family=FAMILY,
        cost_class=COST_CLASS,
        fusion=Fusion.POINTWISE,
        inputs=("dY", "Y"),
        outputs=("dX",),
        infer=_float_like_first,
        reference=_pointwise(lambda dy, y: dy * (1.0 - y * y)),
        flops=out_numel_flops(3.0),
        doc="dX = dY * (1 - Y^2) where Y = Tanh(X).",
        sharding=sh.pointwise("scale"),
    )
)
SIGMOID_GRAD = register(
    OpDef(
        name="SigmoidGrad",
        family=FAMILY,
        cost_class=COST_CLASS,
        fusion=Fusion.POINTWISE,
        inputs=("dY", "Y"),
        outputs=("dX",),
        infer=_float_like_first,
        reference=_pointwise(lambda dy, y: dy * y * (1.0 - y)),
        flops=out_numel_flops(3.0),
        doc="dX = dY * Y * (1 - Y) where Y = Sigmoid(X).",
        sharding=sh.pointwise("scale"),
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
        cost_class=COST_CLASS,
        fusion=Fusion.ROWWISE,
        inputs=("dY", "X", "Scale"),
        outputs=("dX", "dScale", "dB"),
        infer=_layer_norm_grad_rule,
        attrs=dict(NORM_ATTRS),
        reference=_layer_norm_grad,
        flops=in_numel_flops(12.0),
        doc="Gradients of LayerNormalization(X, Scale, B) w.r.t. X, Scale and B (B shaped like "
        "Scale); recomputes the statistics from X.",
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
        doc="Gradients of RMSNormalization(X, scale) w.r.t. X and scale.",
        sharding=sh.norm_grad,
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


def _nll_grad(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    logp0 = np.asarray(args[1])
    labels = np.expand_dims(np.asarray(args[2]).astype(np.int64), 1)
    dloss = f64(args[0])
    how = str_attr(attrs, "reduction", "mean")
    per = -np.expand_dims(dloss, 1) if how == "none" else np.full(labels.shape, -float(dloss))
    if how == "mean":
        per = per / labels.size
    d = np.zeros(logp0.shape)
    np.put_along_axis(d, labels, per, axis=1)
    return (d.astype(logp0.dtype),)


def _nll_grad_bytes_read(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    """dLoss and the labels: the input is read for its shape only."""
    return float(ins[0].nbytes + ins[2].nbytes)


NEGATIVE_LOG_LIKELIHOOD_LOSS_GRAD = register(
    OpDef(
        name="NegativeLogLikelihoodLossGrad",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("dLoss", "input", "target"),
        outputs=("dInput",),
        infer=_sce_grad_rule,
        attrs={"reduction": REDUCTION},
        reference=_nll_grad,
        flops=lambda ins, outs, attrs: float(numel(ins[2])),  # a scaled negation per item
        bytes_read=_nll_grad_bytes_read,
        doc="dInput = −dLoss at each target, 0 elsewhere (divided by the item count for "
        "reduction='mean'): dense, as torch's nll_loss_backward writes it.",
        sharding=sh.loss_grad("ce"),
    )
)


SOFTMAX_CROSS_ENTROPY_LOSS_GRAD = register(
    OpDef(
        name="SoftmaxCrossEntropyLossGrad",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("dLoss", "scores", "labels"),
        outputs=("dScores",),
        infer=_sce_grad_rule,
        attrs={"reduction": REDUCTION},
        reference=_sce_grad,
        flops=out_numel_flops(7.0),
        doc="dScores = (softmax(scores, 1) - onehot(labels)) * dLoss (divided by the label count "
        "for reduction='mean'; broadcast over classes for 'none').",
        sharding=sh.loss_grad("ce"),
    )
)


def _parts_grad_rule(ctx: TypeCtx) -> Sequence[Type]:
    scores, _ = check_parts(ctx, 2)
    for i in (0, 1):
        d = ctx.tensor(i)
        if d.shape != scores.shape[:1]:
            ctx.fail(
                f"{ctx.op.name} input {i} must have shape {scores.shape[:1]}", i, scores.shape[:1], d.shape
            )
    return (ctx.out(scores.dtype, scores.shape),)


def _parts_grad(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    e, onehot = exp_and_onehot(args[2], args[3], args[4], attrs.get("rows"))
    d = f64(args[0])[:, None] * e + f64(args[1])[:, None] * onehot
    return (d.astype(np.asarray(args[2]).dtype),)


SOFTMAX_CROSS_ENTROPY_PARTS_GRAD = register(
    OpDef(
        name="SoftmaxCrossEntropyPartsGrad",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("dSumexp", "dPicked", "scores", "shift", "labels"),
        outputs=("dScores",),
        infer=_parts_grad_rule,
        attrs={"rows": ROWS},
        reference=_parts_grad,
        flops=out_numel_flops(5.0),
        doc="The gradient of SoftmaxCrossEntropyParts w.r.t. scores: dSumexp·exp(scores − shift) + "
        "dPicked·onehot(labels), per row (softmax − one-hot when dSumexp = 1/sumexp, dPicked = −1); "
        "rows as the forward's.",
        sharding=parts_sharding(2, 2),
        localize=rows_localizer(lambda attrs, rank: 1, 2),
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
        cost_class=COST_CLASS,
        inputs=("dLoss", "prediction", "target"),
        outputs=("dPrediction",),
        infer=_mse_grad_rule,
        attrs={"reduction": REDUCTION},
        reference=_mse_grad,
        flops=out_numel_flops(3.0),
        doc="dPrediction = 2 * (prediction - target) * dLoss (divided by the element count for "
        "reduction='mean').",
        sharding=sh.loss_grad("mse"),
    )
)


# -- convolution and pooling ------------------------------------------------------------------
def scatter_windows(
    parts: Iterator[tuple[tuple[int, ...], F64]], x_shape: Sequence[int], win: Window, out: Sequence[int]
) -> F64:
    """The adjoint of gathering windows: adds each offset's part (shaped like the output) into the
    padded input, then crops the padding away. Returns an array of ``x_shape``."""
    padded = [
        max(n + b + e, (o - 1) * s + win.extent(i))
        for i, (n, b, e, o, s) in enumerate(
            zip(x_shape[2:], win.pads_begin, win.pads_end, out, win.strides, strict=True)
        )
    ]
    g = np.zeros((*x_shape[:2], *padded))
    for offset, part in parts:
        g[win.view(offset, out)] += part
    crop = tuple(slice(b, b + n) for b, n in zip(win.pads_begin, x_shape[2:], strict=True))
    return g[(slice(None), slice(None), *crop)]


def conv_backward(dy: F64, x: F64, w: F64, win: Window, group: int) -> tuple[F64, F64, F64]:
    """(dX, dW, dB) of ``Y = Conv(X, W, B)`` for the incoming gradient ``dy``."""
    m, out = w.shape[0], dy.shape[2:]
    xp = pad_for(x, win, out, 0.0)
    wk = w.reshape(group, m // group, w.shape[1], math.prod(w.shape[2:]))
    dyg = grouped(dy, group)  # (N, g, M/g, P)
    dw = np.zeros_like(wk)
    offsets = list(win.offsets())
    for k, offset in enumerate(offsets):
        xs = grouped(xp[win.view(offset, out)], group)  # (N, g, C/g, P)
        dw[..., k] = np.sum(dyg @ xs.swapaxes(-1, -2), axis=0)
    xshape = (x.shape[0], x.shape[1], *out)
    parts = ((o, (wk[..., k].swapaxes(-1, -2) @ dyg).reshape(xshape)) for k, o in enumerate(offsets))
    dx = scatter_windows(parts, x.shape, win, out)
    db = np.sum(dy, axis=(0, *range(2, dy.ndim)))
    return dx, dw.reshape(w.shape), db


def max_pool_backward(dy: F64, x: F64, win: Window) -> F64:
    _, arg = max_pool_forward(x, win)
    out = dy.shape[2:]
    parts = ((o, np.where(arg == k, dy, 0.0)) for k, o in enumerate(win.offsets()))
    return scatter_windows(parts, x.shape, win, out)


def avg_pool_backward(dy: F64, x_shape: Sequence[int], win: Window, include_pad: bool) -> F64:
    g = dy / avg_pool_counts(x_shape, win, include_pad)
    return scatter_windows(((o, g) for o in win.offsets()), x_shape, win, dy.shape[2:])


def _check_dy(ctx: TypeCtx, shape: tuple[int, ...]) -> None:
    """dY (input 0) has X's dtype (input 1) and the forward output's shape."""
    same_dtype(ctx, [1, 0])
    dy = ctx.tensor(0)
    if dy.shape != shape:
        msg = f"{ctx.op.name}: dY has shape {dy.shape} but the forward output has {shape}"
        ctx.fail(msg, 0, shape, dy.shape)


def _conv_grad_rule(ctx: TypeCtx) -> Sequence[Type]:
    x, w, shape = conv_types(ctx, 1, 2, None)
    _check_dy(ctx, shape)
    return (ctx.out(x.dtype, x.shape), ctx.out(x.dtype, w.shape), ctx.out(x.dtype, (w.shape[0],)))


def _pool_grad_rule(ctx: TypeCtx) -> Sequence[Type]:
    x, shape = pool_types(ctx, 1)
    _check_dy(ctx, shape)
    return (ctx.out(x.dtype, x.shape),)


def _conv_grad(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x, w = np.asarray(args[1]), np.asarray(args[2])
    win, group = window_of(attrs, w.shape[2:]), int_attr(attrs, "group", 1)
    return tuple(g.astype(x.dtype) for g in conv_backward(f64(args[0]), f64(x), f64(w), win, group))


def _max_pool_grad(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[1])
    return (max_pool_backward(f64(args[0]), f64(x), pool_window(attrs)).astype(x.dtype),)


def _avg_pool_grad(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[1])
    include = bool(int_attr(attrs, "count_include_pad", 0))
    return (avg_pool_backward(f64(args[0]), x.shape, pool_window(attrs), include).astype(x.dtype),)


CONV_GRAD = register(
    OpDef(
        name="ConvGrad",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("dY", "X", "W"),
        outputs=("dX", "dW", "dB"),
        infer=_conv_grad_rule,
        attrs=dict(CONV_ATTRS),
        reference=_conv_grad,
        flops=lambda ins, outs, attrs: 4.0 * conv_macs(ins[0], ins[2]) + numel(ins[0]),
        doc="Gradients of Conv(X, W, B) w.r.t. X, W and B (dB has shape (M,), whether or not the "
        "forward had a bias).",
        sharding=sh.windowed_grad("conv"),
    )
)
MAX_POOL_GRAD = register(
    OpDef(
        name="MaxPoolGrad",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("dY", "X"),
        outputs=("dX",),
        infer=_pool_grad_rule,
        attrs=dict(MAX_POOL_ATTRS),
        reference=_max_pool_grad,
        flops=lambda ins, outs, attrs: pool_flops(2.0, ins[0], attrs),
        doc="Routes each dY to the position of its window's maximum in X (the first one on ties); "
        "recomputes the forward.",
        sharding=sh.windowed_grad("pool"),
    )
)
AVERAGE_POOL_GRAD = register(
    OpDef(
        name="AveragePoolGrad",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("dY", "X"),
        outputs=("dX",),
        infer=_pool_grad_rule,
        attrs=dict(AVERAGE_POOL_ATTRS),
        reference=_avg_pool_grad,
        flops=lambda ins, outs, attrs: pool_flops(1.0, ins[0], attrs),
        doc="Spreads each dY / (its window's divisor) over the window's positions in X (only X's "
        "shape is read).",
        sharding=sh.windowed_grad("pool"),
    )
)

__all__ = ["avg_pool_backward", "conv_backward", "max_pool_backward", "scatter_windows", "sum_to_shape"]


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
        xhat, g = x * r, dy * scale
        dx = g - xhat * (g * xhat).mean(dim=axes, keepdim=True)
        if not rms:
            dx = dx - g.mean(dim=axes, keepdim=True)
        shape = tuple(scale0.shape)
        grads = (r * dx, sum_to(dy * xhat, shape)) + (() if rms else (sum_to(dy, shape),))
        return tuple(like(t, dy0) for t in grads)

    return impl


def _sce_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """(softmax − one-hot) · dLoss, in f32 for 16-bit scores."""
    dloss, scores0, labels = xs
    p = ctx.torch.softmax(upcast(ctx, scores0), 1)
    idx = labels.long().unsqueeze(1)
    p = p.scatter_add(1, idx, ctx.torch.full(idx.shape, -1.0, dtype=p.dtype, device=p.device))
    how, d = str_attr(attrs, "reduction", "mean"), upcast(ctx, dloss)
    scale = d.unsqueeze(1) if how == "none" else d / labels.numel() if how == "mean" else d
    return (like(p * scale, scores0),)


def _log_softmax_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    dy, y = xs
    axis = int_attr(attrs, "axis", -1) % y.dim()
    return (ctx.torch.ops.aten._log_softmax_backward_data(dy, y, axis, y.dtype),)


def _nll_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """−dLoss at each target, zeros elsewhere (a dense tensor, as nll_loss_backward writes)."""
    dloss, logp, labels = xs
    how, d = str_attr(attrs, "reduction", "mean"), upcast(ctx, dloss)
    idx = labels.long().unsqueeze(1)
    per = -d.unsqueeze(1) if how == "none" else (-d).expand(idx.shape)
    if how == "mean":
        per = per / labels.numel()
    out = ctx.torch.zeros(logp.shape, dtype=per.dtype, device=logp.device)
    return (like(out.scatter(1, idx, per), logp),)


def _parts_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    dsum, dpicked, scores, shift, labels = xs
    e, onehot = torch_exp_and_onehot(ctx, scores, shift, labels, attrs.get("rows"))
    d = upcast(ctx, dsum)[:, None] * e + upcast(ctx, dpicked)[:, None] * onehot
    return (like(d, scores),)


def _mse_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    dloss, p, t = xs
    g = 2.0 * (upcast(ctx, p) - upcast(ctx, t)) * upcast(ctx, dloss)
    if str_attr(attrs, "reduction", "mean") == "mean":
        g = g / max(p.numel(), 1)
    return (like(g, p),)


def _conv_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """torch's convolution backward on the padded input; dX is its unpadded part."""
    dy, x, w = xs
    win = window_of(attrs, tuple(w.shape[2:]))
    r = len(win.kernel)
    zeros, group = [0] * r, int_attr(attrs, "group", 1)
    xp = torch_pad_for(ctx, x, win, 0.0)
    dxp, dw, db = ctx.torch.ops.aten.convolution_backward(
        dy, xp, w, [w.shape[0]], win.strides, zeros, win.dilations, False, zeros, group, [True, True, True]
    )
    crop = tuple(slice(b, b + n) for b, n in zip(win.pads_begin, x.shape[2:], strict=True))
    return (dxp[(slice(None), slice(None), *crop)], dw, db)


def _max_pool_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    dy, x = xs
    win = pool_window(attrs)
    return (vjp(ctx, lambda t: torch_max_pool(ctx, t, win), x, dy),)


def _avg_pool_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    dy, x = xs
    win, include = pool_window(attrs), bool(int_attr(attrs, "count_include_pad", 0))
    return (vjp(ctx, lambda t: torch_avg_pool(ctx, t, win, include), x, dy),)


def _aten_grad(name: str) -> Any:
    """dX = aten.<name>(dY, Z): torch's own backward kernel of an activation."""

    def impl(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
        return (getattr(ctx.torch.ops.aten, name)(xs[0], xs[1]),)

    return impl


RELU_GRAD.fill("torch", _relu_grad_torch)
GELU_GRAD.fill("torch", _aten_grad("gelu_backward"))
TANH_GRAD.fill("torch", _aten_grad("tanh_backward"))
SIGMOID_GRAD.fill("torch", _aten_grad("sigmoid_backward"))
SOFTMAX_GRAD.fill("torch", _softmax_grad_torch)
LOG_SOFTMAX_GRAD.fill("torch", _log_softmax_grad_torch)
NEGATIVE_LOG_LIKELIHOOD_LOSS_GRAD.fill("torch", _nll_grad_torch)
LAYER_NORMALIZATION_GRAD.fill("torch", _norm_grad_torch(rms=False))
RMS_NORMALIZATION_GRAD.fill("torch", _norm_grad_torch(rms=True))
SOFTMAX_CROSS_ENTROPY_LOSS_GRAD.fill("torch", _sce_grad_torch)
SOFTMAX_CROSS_ENTROPY_PARTS_GRAD.fill("torch", _parts_grad_torch)
MSE_LOSS_GRAD.fill("torch", _mse_grad_torch)
CONV_GRAD.fill("torch", _conv_grad_torch)
MAX_POOL_GRAD.fill("torch", _max_pool_grad_torch)
AVERAGE_POOL_GRAD.fill("torch", _avg_pool_grad_torch)
