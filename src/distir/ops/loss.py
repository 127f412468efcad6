"""Losses: SoftmaxCrossEntropyLoss (ONNX semantics, no weights or ignore_index; only the loss
output) and MSELoss (mean squared error, named like PyTorch's).

``reduction`` is ``"mean"`` (default; a 0-d result), ``"sum"`` (0-d) or ``"none"`` (one loss per
sample: the labels' shape, or the prediction's for MSELoss). References compute in float64.
Sharding (``distir.ops.sharding.loss``): items (batch, positions) sharded; a sum is then a
pending sum, a mean a pending mean only over even shards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from distir.ir.types import TensorType, Type
from distir.ir.values import Attrs
from distir.ops import sharding as sh
from distir.ops._rules import float_input, numel, same_dtype, same_shape, str_attr
from distir.ops._special import F64, f64
from distir.ops.nn import log_softmax
from distir.ops.registry import AttrSpec, OpDef, TypeCtx, register

FAMILY = "loss"

REDUCTIONS = ("mean", "sum", "none")
REDUCTION = AttrSpec("str", "mean", REDUCTIONS)


def reduction(ctx: TypeCtx) -> str:
    r = ctx.attr("reduction")
    if r not in REDUCTIONS:
        ctx.fail(f"{ctx.op.name} reduction must be one of {list(REDUCTIONS)}", None, list(REDUCTIONS), r)
    assert isinstance(r, str)
    return r


def reduce_loss(per_item: F64, how: str) -> F64:
    if how == "mean":
        return np.asarray(np.mean(per_item))
    if how == "sum":
        return np.asarray(np.sum(per_item))
    return per_item


# -- SoftmaxCrossEntropyLoss ------------------------------------------------------------------
def check_scores_labels(ctx: TypeCtx, si: int, li: int) -> tuple[TensorType, TensorType]:
    """scores [N, C, d1..] (float) and labels [N, d1..] (int, in 0..C-1 when known)."""
    scores, labels = float_input(ctx, si, "scores"), ctx.tensor(li)
    if scores.rank < 2:
        ctx.fail(f"{ctx.op.name} scores must be [N, C, d1, ...] (rank >= 2)", si, "rank >= 2", scores.rank)
    if not labels.dtype.is_int:
        ctx.fail(f"{ctx.op.name} labels must be integers", li, "an int dtype", labels.dtype)
    want = scores.shape[:1] + scores.shape[2:]
    if labels.shape != want:
        ctx.fail(
            f"{ctx.op.name} labels of shape {labels.shape} do not match scores "
            f"{scores.shape} (want [N, d1, ...] = {want})",
            li,
            want,
            labels.shape,
        )
    known = ctx.known[li] if li < len(ctx.known) else None
    if known is not None:
        c = scores.shape[1]
        bad = np.asarray(known)[(np.asarray(known) < 0) | (np.asarray(known) >= c)]
        if bad.size:
            ctx.fail(
                f"{ctx.op.name} label {int(bad.flat[0])} is out of range for {c} classes",
                li,
                f"0..{c - 1}",
                bad.tolist(),
            )
    return scores, labels


def _sce_rule(ctx: TypeCtx) -> Sequence[Type]:
    scores, labels = check_scores_labels(ctx, 0, 1)
    shape = labels.shape if reduction(ctx) == "none" else ()
    return (ctx.out(scores.dtype, shape),)


def picked_log_probs(scores: Any, labels: Any) -> F64:
    """log softmax(scores)[n, labels[n, ...], ...]: shape of labels."""
    logp = log_softmax(scores, 1)
    idx = np.expand_dims(np.asarray(labels).astype(np.int64), 1)
    return np.take_along_axis(logp, idx, axis=1).squeeze(1)


def _sce_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    scores = np.asarray(args[0])
    loss = reduce_loss(-picked_log_probs(scores, args[1]), str_attr(attrs, "reduction", "mean"))
    return (loss.astype(scores.dtype),)


def _sce_flops(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    """Log-softmax (~5 per score), pick and negate, reduce."""
    n = numel(ins[1])
    return 5.0 * numel(ins[0]) + 2.0 * n + (n if attrs.get("reduction", "mean") != "none" else 0.0)


SOFTMAX_CROSS_ENTROPY_LOSS = register(
    OpDef(
        name="SoftmaxCrossEntropyLoss",
        family=FAMILY,
        inputs=("scores", "labels"),
        outputs=("output",),
        infer=_sce_rule,
        attrs={"reduction": REDUCTION},
        reference=_sce_ref,
        flops=_sce_flops,
        doc="-log softmax(scores, axis=1)[labels], reduced (ONNX, without weights/ignore_index).",
        sharding=sh.loss("ce"),
    )
)


# -- MSELoss ----------------------------------------------------------------------------------
def check_pred_target(ctx: TypeCtx, pi: int, ti: int) -> TensorType:
    p = float_input(ctx, pi, "prediction")
    same_dtype(ctx, [pi, ti])
    same_shape(ctx, [pi, ti])
    return p


def _mse_rule(ctx: TypeCtx) -> Sequence[Type]:
    p = check_pred_target(ctx, 0, 1)
    return (ctx.out(p.dtype, p.shape if reduction(ctx) == "none" else ()),)


def _mse_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    p = np.asarray(args[0])
    d = f64(p) - f64(args[1])
    return (reduce_loss(d * d, str_attr(attrs, "reduction", "mean")).astype(p.dtype),)


MSE_LOSS = register(
    OpDef(
        name="MSELoss",
        family=FAMILY,
        inputs=("prediction", "target"),
        outputs=("output",),
        infer=_mse_rule,
        attrs={"reduction": REDUCTION},
        reference=_mse_ref,
        flops=lambda ins, outs, attrs: 3.0 * numel(ins[0]),
        doc="(prediction - target)^2, reduced by mean (default), sum or none.",
        sharding=sh.loss("mse"),
    )
)

__all__ = ["check_pred_target", "check_scores_labels", "picked_log_probs", "reduce_loss", "reduction"]


# -- gradient rules (contract: distir.ops.gradrules) --------------------------------------------
# (imported here so the rules stay one appended block; the other helpers own the top of the file)
from distir.ir.ops import Op  # noqa: E402
from distir.ir.values import Value  # noqa: E402
from distir.ops.gradrules import GradCtx, first  # noqa: E402


def _sce_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    scores, labels = (ctx.primal(v) for v in op.inputs)
    how = str_attr(op.attrs, "reduction", "mean")
    (ds,) = ctx.op("SoftmaxCrossEntropyLossGrad", first(douts), scores, labels, reduction=how)
    return [ds, None]


def _mse_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    """MSELossGrad gives d/dprediction; the target's gradient is its negation."""
    pred, target = (ctx.primal(v) for v in op.inputs)
    how = str_attr(op.attrs, "reduction", "mean")
    (dp,) = ctx.op("MSELossGrad", first(douts), pred, target, reduction=how)
    (dt,) = ctx.op("Neg", dp)
    return [dp, dt]


SOFTMAX_CROSS_ENTROPY_LOSS.fill("grad", _sce_grad)
MSE_LOSS.fill("grad", _mse_grad)
