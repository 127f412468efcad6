"""Gradient ops of the losses (family ``grad``): NegativeLogLikelihoodLossGrad,
SoftmaxCrossEntropyLossGrad, SoftmaxCrossEntropyPartsGrad, NllLossPartsGrad, MSELossGrad. Each
takes the loss's gradient first (a scalar, or one per item without reduction); references
compute in float64 and round once (the forward's helpers in ``distir.ops.loss``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from distir.ir.types import Type
from distir.ir.values import Attrs
from distir.ops import sharding as sh
from distir.ops._rules import (
    numel,
    out_numel_flops,
    same_dtype,
    str_attr,
)
from distir.ops._special import f64
from distir.ops._torch import like, upcast
from distir.ops.grad.family import COST_CLASS, FAMILY
from distir.ops.loss import (
    CLASSES_AXIS,
    REDUCTION,
    check_parts,
    check_pred_target,
    check_scores_labels,
    classes_axis,
    exp_and_onehot,
    parts_sharding,
    reduction,
    torch_exp_and_onehot,
)
from distir.ops.nn import (
    softmax,
)
from distir.ops.registry import OpDef, TypeCtx, register
from distir.ops.shape.select import ROWS, check_rows, rows_localizer

if TYPE_CHECKING:
    from distir.backend.context import TorchContext


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


def _nll_grad_rule(ctx: TypeCtx) -> Sequence[Type]:
    scores, labels = check_scores_labels(ctx, 1, 2, ctx.attr("axis"))
    _check_dloss(ctx, 1, labels.shape)
    return (ctx.out(scores.dtype, scores.shape),)


def _nll_grad(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    logp0 = np.asarray(args[1])
    axis = classes_axis(attrs, logp0.ndim)
    labels = np.expand_dims(np.asarray(args[2]).astype(np.int64), axis)
    dloss = f64(args[0])
    how = str_attr(attrs, "reduction", "mean")
    per = -np.expand_dims(dloss, axis) if how == "none" else np.full(labels.shape, -float(dloss))
    if how == "mean":
        per = per / labels.size
    d = np.zeros(logp0.shape)
    np.put_along_axis(d, labels, per, axis=axis)
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
        infer=_nll_grad_rule,
        attrs={"reduction": REDUCTION, "axis": CLASSES_AXIS},
        reference=_nll_grad,
        flops=lambda ins, outs, attrs: float(numel(ins[2])),  # a scaled negation per item
        bytes_read=_nll_grad_bytes_read,
        doc="dInput = −dLoss at each target, 0 elsewhere (divided by the item count for "
        "reduction='mean'): dense, as torch's nll_loss_backward writes it; axis: the classes' dim, "
        "as the forward's.",
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
        if d.shape != scores.shape[:-1]:
            ctx.fail(
                f"{ctx.op.name} input {i} must have shape {scores.shape[:-1]}", i, scores.shape[:-1], d.shape
            )
    return (ctx.out(scores.dtype, scores.shape),)


def _parts_grad(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    e, onehot = exp_and_onehot(args[2], args[3], args[4], attrs.get("rows"))
    d = f64(args[0])[..., None] * e + f64(args[1])[..., None] * onehot
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
        localize=rows_localizer(lambda attrs, rank: rank - 1, 2),
    )
)


def _nll_parts_grad_rule(ctx: TypeCtx) -> Sequence[Type]:
    logp = ctx.tensor(1)
    if logp.rank < 2 or not logp.dtype.is_float:
        ctx.fail(f"{ctx.op.name} input must be float (N..., C)", 1, "rank >= 2, float", logp)
    n = logp.shape[:-1]
    d, labels = ctx.tensor(0), ctx.tensor(2)
    if d.shape != n:
        ctx.fail(f"{ctx.op.name} dLoss must have shape {n}", 0, n, d.shape)
    if not labels.dtype.is_int or labels.shape != n:
        ctx.fail(f"{ctx.op.name} labels must be {n} integers", 2, n, labels.shape)
    check_rows(ctx, logp.shape[-1])
    return tuple(ctx.out(logp.dtype, logp.shape) for _ in range(3))


def _nll_parts_grad(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    logp = np.asarray(args[1])
    e, onehot = exp_and_onehot(logp, np.zeros(logp.shape[:-1]), args[2], attrs.get("rows"))
    summed = e - onehot
    outs = (f64(args[0])[..., None] * summed, -onehot, summed)
    return tuple(o.astype(logp.dtype) for o in outs)


# torch's _nll_loss_and_log_softmax_backward runs, over the local log-probabilities: zeros_like
# (a write), the scatter of −1 at the labels (one element per row), exp (read, write), the add
# (two reads, a write) and the multiplication by dLoss (read, write): 4 reads and 4 writes.
_NLL_GRAD_READS, _NLL_GRAD_WRITES = 4, 4


def _nll_parts_grad_bytes_read(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    return _NLL_GRAD_READS * float(ins[1].nbytes) + float(ins[0].nbytes + ins[2].nbytes)


def _nll_parts_grad_bytes_written(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    return _NLL_GRAD_WRITES * float(ins[1].nbytes)


NLL_LOSS_PARTS_GRAD = register(
    OpDef(
        name="NllLossPartsGrad",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("dLoss", "input", "labels"),
        outputs=("dInput", "grad_input", "summed"),
        infer=_nll_parts_grad_rule,
        attrs={"rows": ROWS},
        reference=_nll_parts_grad,
        flops=lambda ins, outs, attrs: 3.0 * numel(ins[1]),  # exp, add, multiply per element
        bytes_read=_nll_parts_grad_bytes_read,
        bytes_written=_nll_parts_grad_bytes_written,
        doc="The gradient of NllLossParts, as torch's loss_parallel computes it "
        "(_nll_loss_and_log_softmax_backward): grad_input = zeros with −1 at the labels (this piece's), "
        "summed = grad_input + exp(input), dInput = summed · dLoss per row. grad_input and summed "
        "are results so that the program holds what torch holds while it runs: with the saved "
        "input, four tensors the size of the local log-probabilities (their users: none). rows as "
        "the forward's.",
        sharding=parts_sharding(1, 1, summed=False),
        localize=rows_localizer(lambda attrs, rank: rank - 1, 1),
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


# -- torch implementations (contract: distir.ops._torch) ----------------------------------------
def _sce_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """(softmax − one-hot) · dLoss, in f32 for 16-bit scores."""
    dloss, scores0, labels = xs
    p = ctx.torch.softmax(upcast(ctx, scores0), 1)
    idx = labels.long().unsqueeze(1)
    p = p.scatter_add(1, idx, ctx.torch.full(idx.shape, -1.0, dtype=p.dtype, device=p.device))
    how, d = str_attr(attrs, "reduction", "mean"), upcast(ctx, dloss)
    scale = d.unsqueeze(1) if how == "none" else d / labels.numel() if how == "mean" else d
    return (like(p * scale, scores0),)


def _nll_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """−dLoss at each target, zeros elsewhere (a dense tensor, as nll_loss_backward writes)."""
    dloss, logp, labels = xs
    how, d = str_attr(attrs, "reduction", "mean"), upcast(ctx, dloss)
    axis = classes_axis(attrs, logp.dim())
    idx = labels.long().unsqueeze(axis)
    per = -d.unsqueeze(axis) if how == "none" else (-d).expand(idx.shape)
    if how == "mean":
        per = per / labels.numel()
    out = ctx.torch.zeros(logp.shape, dtype=per.dtype, device=logp.device)
    return (like(out.scatter(axis, idx, per), logp),)


def _parts_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    dsum, dpicked, scores, shift, labels = xs
    e, onehot = torch_exp_and_onehot(ctx, scores, shift, labels, attrs.get("rows"))
    d = upcast(ctx, dsum)[..., None] * e + upcast(ctx, dpicked)[..., None] * onehot
    return (like(d, scores),)


def _nll_parts_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    dloss, logp, labels = xs
    zero = ctx.torch.zeros(logp.shape[:-1], dtype=logp.dtype, device=logp.device)
    e, onehot = torch_exp_and_onehot(ctx, logp, zero, labels, attrs.get("rows"))
    summed = e - onehot
    return tuple(like(t, logp) for t in (upcast(ctx, dloss)[..., None] * summed, -onehot, summed))


def _mse_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    dloss, p, t = xs
    g = 2.0 * (upcast(ctx, p) - upcast(ctx, t)) * upcast(ctx, dloss)
    if str_attr(attrs, "reduction", "mean") == "mean":
        g = g / max(p.numel(), 1)
    return (like(g, p),)


NEGATIVE_LOG_LIKELIHOOD_LOSS_GRAD.fill("torch", _nll_grad_torch)
SOFTMAX_CROSS_ENTROPY_LOSS_GRAD.fill("torch", _sce_grad_torch)
SOFTMAX_CROSS_ENTROPY_PARTS_GRAD.fill("torch", _parts_grad_torch)
NLL_LOSS_PARTS_GRAD.fill("torch", _nll_parts_grad_torch)
MSE_LOSS_GRAD.fill("torch", _mse_grad_torch)
