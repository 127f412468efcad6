"""Losses: SoftmaxCrossEntropyLoss (ONNX semantics, no weights or ignore_index; only the loss
output), MSELoss (mean squared error, named like PyTorch's), SoftmaxCrossEntropyParts (the
per-row sums a cross entropy over classes sharded across devices is made of: Megatron-LM's
vocabulary-parallel cross entropy, which the zoo's language models use) and NllLossParts (the
negative log-likelihood of torch's ``loss_parallel`` on log-probabilities sharded on the classes,
whose gradient is torch's fused backward).

``reduction`` is ``"mean"`` (default; a 0-d result), ``"sum"`` (0-d) or ``"none"`` (one loss per
sample: the labels' shape, or the prediction's for MSELoss). References compute in float64.
Sharding (``distir.ops.sharding.loss``): items (batch, positions) sharded; a sum is then a
pending sum, a mean a pending mean only over even shards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from distir.ir.dtensor import Placement, Shard
from distir.ir.ops import Op
from distir.ir.types import DType, TensorType, Type
from distir.ir.values import Attrs, Value
from distir.ops import _torch
from distir.ops import sharding as sh
from distir.ops._rules import float_input, int_attr, norm_axis, numel, same_dtype, same_shape, str_attr
from distir.ops._special import F64, f64
from distir.ops.gradrules import GradCtx, first, zeros_like
from distir.ops.nn import log_softmax
from distir.ops.registry import AttrSpec, CostClass, OpDef, TypeCtx, register
from distir.ops.shape.select import ROWS, check_rows, local_rows, rows_localizer

if TYPE_CHECKING:
    from distir.backend.context import TorchContext

FAMILY = "loss"
COST_CLASS = CostClass.LOSS  # how the family's ops are costed

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
def check_scores_labels(ctx: TypeCtx, si: int, li: int, axis: int = 1) -> tuple[TensorType, TensorType]:
    """scores [N, C, d1..] (float) and labels [N, d1..] (int, in 0..C-1 when known); with
    ``axis``, the classes on that dim of the scores and the labels the scores' shape without it."""
    scores, labels = float_input(ctx, si, "scores"), ctx.tensor(li)
    if scores.rank < 2:
        ctx.fail(f"{ctx.op.name} scores must be [N, C, d1, ...] (rank >= 2)", si, "rank >= 2", scores.rank)
    classes = norm_axis(ctx, axis, scores.rank, f"{ctx.op.name} axis")
    if not labels.dtype.is_int:
        ctx.fail(f"{ctx.op.name} labels must be integers", li, "an int dtype", labels.dtype)
    want = scores.shape[:classes] + scores.shape[classes + 1 :]
    if labels.shape != want:
        ctx.fail(
            f"{ctx.op.name} labels of shape {labels.shape} do not match scores "
            f"{scores.shape} (want the scores' shape without the classes, dim {classes}: {want})",
            li,
            want,
            labels.shape,
        )
    known = ctx.known[li] if li < len(ctx.known) else None
    if known is not None:
        c = scores.shape[classes]
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
        cost_class=COST_CLASS,
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


# -- NegativeLogLikelihoodLoss ----------------------------------------------------------------
# ``axis``: the classes' dim of the input (ONNX's layout, dim 1, by default). A classes-last form
# (axis=-1) takes (batch, sequence, vocab) scores as a language model's head gives them, so the
# loss needs no flattening of (batch, sequence): under context parallelism each rank's cross
# entropy runs on its own (B, S/c, V) logits, as torchtitan's F.cross_entropy does.
CLASSES_AXIS = AttrSpec("int", 1)


def classes_axis(attrs: Attrs, rank: int) -> int:
    """The classes' dim of a rank-``rank`` input (``axis``, normalized; the rule checked it)."""
    return int_attr(attrs, "axis", 1) % rank


def picked(values: Any, labels: Any, axis: int = 1) -> F64:
    """values[n, labels[n, ...], ...] (the classes on ``axis``) in float64: the shape of labels."""
    idx = np.expand_dims(np.asarray(labels).astype(np.int64), axis)
    return np.take_along_axis(f64(values), idx, axis=axis).squeeze(axis)


def _nll_rule(ctx: TypeCtx) -> Sequence[Type]:
    scores, labels = check_scores_labels(ctx, 0, 1, ctx.attr("axis"))
    shape = labels.shape if reduction(ctx) == "none" else ()
    return (ctx.out(scores.dtype, shape),)


def _nll_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    logp = np.asarray(args[0])
    per_item = -picked(logp, args[1], classes_axis(attrs, logp.ndim))
    loss = reduce_loss(per_item, str_attr(attrs, "reduction", "mean"))
    return (loss.astype(logp.dtype),)


def _nll_flops(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    """Pick and negate per item, reduce."""
    n = numel(ins[1])
    return 2.0 * n + (n if attrs.get("reduction", "mean") != "none" else 0.0)


def _nll_bytes_read(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    """The labels and one picked value per item (a gather), not every class's."""
    t = ins[0]
    return float(ins[1].nbytes) + (numel(ins[1]) * t.dtype.itemsize if isinstance(t, TensorType) else 0.0)


NEGATIVE_LOG_LIKELIHOOD_LOSS = register(
    OpDef(
        name="NegativeLogLikelihoodLoss",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("input", "target"),
        outputs=("loss",),
        infer=_nll_rule,
        attrs={"reduction": REDUCTION, "axis": CLASSES_AXIS},
        reference=_nll_ref,
        flops=_nll_flops,
        bytes_read=_nll_bytes_read,
        doc="-input[n, target[n], ...], reduced (ONNX, without weights/ignore_index): with LogSoftmax "
        "before it, torch's F.cross_entropy; its gradient is dense (every class, zeros but the targets). "
        "axis: the classes' dim of the input (default 1, ONNX's; -1: classes last, target the "
        "input's shape without it).",
        sharding=sh.loss("ce"),
    )
)


# -- SoftmaxCrossEntropyParts (the local half of a vocabulary-parallel cross entropy) ----------
def check_parts(ctx: TypeCtx, si: int) -> tuple[TensorType, int | None]:
    """scores (N..., C) float (rows N..., classes last), shift (N...) of its dtype, labels (N...)
    int (in range when known), at ``si``, ``si + 1``, ``si + 2``; returns the scores and the
    total class count when ``rows`` is set (a piece of the classes)."""
    scores, shift, labels = float_input(ctx, si, "scores"), ctx.tensor(si + 1), ctx.tensor(si + 2)
    if scores.rank < 2:
        ctx.fail(f"{ctx.op.name} scores must be (N..., C)", si, "rank >= 2", scores.rank)
    n, c = scores.shape[:-1], scores.shape[-1]
    if shift.shape != n or shift.dtype != scores.dtype:
        ctx.fail(f"{ctx.op.name} shift must be {n} {scores.dtype}", si + 1, n, shift.shape)
    if not labels.dtype.is_int or labels.shape != n:
        ctx.fail(f"{ctx.op.name} labels must be {n} integers", si + 2, n, labels.shape)
    rows = check_rows(ctx, c)
    total = c if rows is None else rows[1]
    known = ctx.known[si + 2] if si + 2 < len(ctx.known) else None
    if known is not None and np.any((np.asarray(known) < 0) | (np.asarray(known) >= total)):
        ctx.fail(
            f"{ctx.op.name} label out of range for {total} classes", si + 2, f"0..{total - 1}", known.tolist()
        )
    return scores, None if rows is None else total


def _parts_rule(ctx: TypeCtx) -> Sequence[Type]:
    scores, _ = check_parts(ctx, 0)
    acc = ctx.attr("acc") or scores.dtype
    if not acc.is_float:
        ctx.fail(f"{ctx.op.name} accumulates in a float dtype", None, "a float dtype", acc)
    return (ctx.out(acc, scores.shape[:-1]), ctx.out(acc, scores.shape[:-1]))


def exp_and_onehot(scores: Any, shift: Any, labels: Any, rows: Any) -> tuple[F64, F64]:
    """exp(scores − shift) per score, and the one-hot of the labels within this piece of the
    classes (``rows``: Gather's convention; zeros for a label another piece holds)."""
    x = f64(scores)
    e = np.exp(x - f64(shift)[..., None])
    idx, mask = local_rows(labels, rows, x.shape[-1])
    onehot = np.zeros_like(x)
    if x.shape[-1]:  # an empty piece of the classes holds no label
        np.put_along_axis(
            onehot, idx[..., None], 1.0 if mask is None else mask[..., None].astype(np.float64), axis=-1
        )
    return e, onehot


def _parts_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    acc = attrs.get("acc")
    dtype = acc.to_numpy() if isinstance(acc, DType) else np.asarray(args[0]).dtype
    e, onehot = exp_and_onehot(args[0], args[1], args[2], attrs.get("rows"))
    z = f64(args[0]) - f64(args[1])[..., None]
    return (e.sum(-1).astype(dtype), (z * onehot).sum(-1).astype(dtype))


# Megatron-LM's vocabulary-parallel cross entropy (``megatron/core/tensor_parallel/
# cross_entropy.py``) runs its forward as separate kernels over the fp32 scores after their max:
# the in-place subtraction of the max (read, write), ``torch.exp(..., out=)`` (read, write), the
# sum (read) and the in-place division into the softmax it saves (read, write) — 4 reads and 3
# writes of the scores; the picked logits are a gather of one score per row. The fused form
# (``acc`` set: flash-attn's xentropy kernel) reads the scores once.
_MEGATRON_READS, _MEGATRON_WRITES = 4, 3


def _parts_passes(ins: Sequence[Type], attrs: Attrs) -> tuple[int, int, float]:
    """(reads, writes, bytes) of the scores' passes: Megatron's kernels unless fused (``acc``)."""
    nbytes = float(ins[0].nbytes)
    return (1, 0, nbytes) if attrs.get("acc") is not None else (_MEGATRON_READS, _MEGATRON_WRITES, nbytes)


def _parts_bytes_read(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    reads, _, scores = _parts_passes(ins, attrs)
    return reads * scores + float(sum(t.nbytes for t in ins[1:]))


def _parts_bytes_written(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    _, writes, scores = _parts_passes(ins, attrs)
    return writes * scores + float(sum(t.nbytes for t in outs))


def parts_sharding(first: int, linear: int, summed: bool = True) -> sh.ShardingRule:
    """Each row dim (every dim of the scores but the last, the same dim of everything) sharded
    alike; the classes of the scores (input ``first``, last dim) sharded with the rest whole:
    each result a pending sum (a sum over classes), or with ``linear`` (gradients: the
    ``linear`` first inputs are incoming gradients) sharded alike; with ``summed`` as well,
    the incoming gradients may be pending sums, the rest replicated, giving a pending sum (an op
    whose one result is linear in them)."""

    def rule(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[sh.Strategy]:
        t = ins[first]
        scores = t.shape if isinstance(t, TensorType) else ()
        found = [sh.replicated(ins, outs)]
        if len(scores) < 2:
            return found
        for dim in range(len(scores) - 1):
            if scores[dim] > 1:
                found.append(sh.Strategy(tuple(Shard(dim) for _ in ins), tuple(Shard(dim) for _ in outs)))
        last = len(scores) - 1
        if scores[last] > 1:
            places: tuple[Placement, ...] = tuple(
                Shard(last) if i == first else sh.R for i in range(len(ins))
            )
            outs_p: tuple[Placement, ...] = tuple(Shard(last) if linear else sh.SUM for _ in outs)
            found.append(sh.Strategy(places, outs_p))
        if linear and summed:
            found.append(
                sh.Strategy((*(sh.SUM for _ in range(linear)), *(sh.R for _ in ins[linear:])), (sh.SUM,))
            )
        return found

    return rule


SOFTMAX_CROSS_ENTROPY_PARTS = register(
    OpDef(
        name="SoftmaxCrossEntropyParts",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("scores", "shift", "labels"),
        outputs=("sumexp", "picked"),
        infer=_parts_rule,
        attrs={"rows": ROWS, "acc": AttrSpec("dtype", None)},
        reference=_parts_ref,
        flops=lambda ins, outs, attrs: 3.0 * numel(ins[0]) + numel(ins[1]),
        bytes_read=_parts_bytes_read,
        bytes_written=_parts_bytes_written,
        doc="Per row n (every dim but the last; classes last): sumexp = Σ_c exp(scores[n, c] − "
        "shift[n]) and picked = scores[n, labels[n]] − shift[n]; the cross entropy is "
        "log(sumexp) − picked. Sharded on the classes, both are pending sums (Megatron's "
        "vocabulary-parallel cross entropy, costed as its kernels: 4 reads and 3 writes of the "
        "scores); rows=[start, total]: scores is that piece of the "
        "classes, a label outside it picks 0. acc: the dtype of both results (default: the "
        "scores'); acc=f32 on bf16 scores is a fused cross entropy (flash-attn's xentropy "
        "kernel): fp32 inside, no fp32 copy of the scores, and the gradient written in the "
        "scores' dtype.",
        sharding=parts_sharding(0, 0),
        localize=rows_localizer(lambda attrs, rank: rank - 1, 0),
    )
)


# -- NllLossParts (the negative log-likelihood of torch's loss_parallel) ------------------------
# torch's ``loss_parallel`` (torch/distributed/tensor/parallel/loss.py) runs F.cross_entropy on
# logits sharded on the classes: ``_log_softmax`` (max, all-reduce, subtract, exp, sum,
# all-reduce, log, subtract: ordinary ops of the program) gives the local log-probabilities, the
# one tensor saved for the backward; ``_nll_loss_forward`` gathers each row's label through a
# masked partial and all-reduces it; the backward is fused, ``_nll_loss_and_log_softmax_backward``:
# (zeros with −1 at the labels + exp(log-probabilities)) · dLoss, the log-softmax's own backward
# an identity. NllLossParts is that negative log-likelihood written so that this fused backward
# is its exact gradient: per row, Σ_c exp(input) − 1 − input[label], which on log-probabilities
# (Σ_c exp = 1) is −input[label], what torch computes (a gather), and whose gradient is
# exp(input) − onehot(label). With the log-softmax's normalizer a constant for the gradient
# (StopGradient), the whole is the cross entropy's gradient, softmax − one-hot.
def _nll_parts_rule(ctx: TypeCtx) -> Sequence[Type]:
    logp, labels = float_input(ctx, 0, "input"), ctx.tensor(1)
    if logp.rank < 2:
        ctx.fail(f"{ctx.op.name} input must be (N..., C)", 0, "rank >= 2", logp.rank)
    n = logp.shape[:-1]
    if not labels.dtype.is_int or labels.shape != n:
        ctx.fail(f"{ctx.op.name} labels must be {n} integers", 1, n, labels.shape)
    rows = check_rows(ctx, logp.shape[-1])
    total = logp.shape[-1] if rows is None else rows[1]
    known = ctx.known[1] if len(ctx.known) > 1 else None
    if known is not None and np.any((np.asarray(known) < 0) | (np.asarray(known) >= total)):
        ctx.fail(
            f"{ctx.op.name} label out of range for {total} classes", 1, f"0..{total - 1}", known.tolist()
        )
    return (ctx.out(logp.dtype, n),)


def class_share(width: int, rows: Any) -> float:
    """The share of the −1 a piece of ``width`` classes at ``rows=[start, total]`` carries (1
    for all of them), so that the pieces' pending sum holds it once."""
    return 1.0 if rows is None else width / int(rows[1])


def _nll_parts_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    logp = np.asarray(args[0])
    rows = attrs.get("rows")
    e, onehot = exp_and_onehot(logp, np.zeros(logp.shape[:-1]), args[1], rows)
    out = e.sum(-1) - class_share(logp.shape[-1], rows) - (f64(logp) * onehot).sum(-1)
    return (out.astype(logp.dtype),)


NLL_LOSS_PARTS = register(
    OpDef(
        name="NllLossParts",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("input", "labels"),
        outputs=("loss",),
        infer=_nll_parts_rule,
        attrs={"rows": ROWS},
        reference=_nll_parts_ref,
        flops=lambda ins, outs, attrs: 3.0 * numel(ins[1]),  # mask the label, gather, negate
        bytes_read=_nll_bytes_read,  # torch's _nll_loss_forward: a gather, as NegativeLogLikelihoodLoss
        doc="Per row n (every dim but the last; classes last): Σ_c exp(input[n, c]) − 1 − "
        "input[n, labels[n]]: on log-probabilities (Σ exp = 1) the negative log-likelihood, "
        "costed as torch's loss_parallel computes it (a gather of the label's value); its gradient "
        "(NllLossPartsGrad: exp(input) − one-hot) is torch's fused backward of log-softmax and "
        "negative log-likelihood. Sharded on the classes, a pending sum; rows=[start, total]: input "
        "is that piece of the classes (a label outside it picks 0; the piece carries its share of "
        "the −1).",
        sharding=parts_sharding(0, 0),
        localize=rows_localizer(lambda attrs, rank: rank - 1, 0),
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
        cost_class=COST_CLASS,
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

__all__ = [
    "CLASSES_AXIS",
    "check_parts",
    "check_pred_target",
    "check_scores_labels",
    "classes_axis",
    "exp_and_onehot",
    "parts_sharding",
    "picked_log_probs",
    "reduce_loss",
    "reduction",
    "torch_exp_and_onehot",
]


# -- gradient rules (contract: distir.ops.gradrules) --------------------------------------------


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


def _parts_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    """d scores from SoftmaxCrossEntropyPartsGrad; d shift = −(d sumexp · sumexp + d picked)
    (the zoo's shift is a StopGradient, so dead code removes it); labels: none."""
    scores, shift, labels = (ctx.primal(v) for v in op.inputs)
    ds, dp = douts
    ds = ds if ds is not None else zeros_like(ctx, first([dp]))
    dp = dp if dp is not None else zeros_like(ctx, ds)
    (dscores,) = ctx.op("SoftmaxCrossEntropyPartsGrad", ds, dp, scores, shift, labels)
    (scaled,) = ctx.op("Mul", ds, ctx.primal(op.outputs[0]))
    (dshift,) = ctx.op("Neg", ctx.op("Add", scaled, dp)[0])
    return [dscores, dshift, None]


def _nll_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    logp, labels = (ctx.primal(v) for v in op.inputs)
    how = str_attr(op.attrs, "reduction", "mean")
    args = (first(douts), logp, labels)
    if "axis" in op.attrs:  # the classes' dim, as the forward's (else ONNX's dim 1, left out)
        (d,) = ctx.op("NegativeLogLikelihoodLossGrad", *args, reduction=how, axis=op.attrs["axis"])
    else:
        (d,) = ctx.op("NegativeLogLikelihoodLossGrad", *args, reduction=how)
    return [d, None]


def _nll_parts_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    """NllLossPartsGrad's dInput (its other results, the tensors torch's fused backward holds,
    unused); labels: none."""
    logp, labels = (ctx.primal(v) for v in op.inputs)
    d, _, _ = ctx.op("NllLossPartsGrad", first(douts), logp, labels)
    return [d, None]


SOFTMAX_CROSS_ENTROPY_LOSS.fill("grad", _sce_grad)
NLL_LOSS_PARTS.fill("grad", _nll_parts_grad)
NEGATIVE_LOG_LIKELIHOOD_LOSS.fill("grad", _nll_grad)
SOFTMAX_CROSS_ENTROPY_PARTS.fill("grad", _parts_grad)
MSE_LOSS.fill("grad", _mse_grad)


# -- torch implementations (contract: distir.ops._torch) ----------------------------------------
def _sce_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """torch's cross entropy (log-softmax and pick, in f32 for 16-bit scores)."""
    scores, labels = xs
    how = str_attr(attrs, "reduction", "mean")
    f = ctx.torch.nn.functional.cross_entropy
    return (_torch.like(f(_torch.upcast(ctx, scores), labels.long(), reduction=how), scores),)


def torch_exp_and_onehot(
    ctx: TorchContext, scores: Any, shift: Any, labels: Any, rows: Any
) -> tuple[Any, Any]:
    """``exp_and_onehot`` on torch (in f32 for 16-bit scores): exp(scores − shift) and the
    one-hot of the labels this piece of the classes holds."""
    x = _torch.upcast(ctx, scores)
    e = ctx.torch.exp(x - _torch.upcast(ctx, shift)[..., None])
    onehot = ctx.torch.zeros_like(x)
    if x.shape[-1]:
        idx, mask = _torch.local_rows(ctx, labels, rows, x.shape[-1])
        hit = ctx.torch.ones_like(idx, dtype=x.dtype) if mask is None else mask.to(x.dtype)
        onehot.scatter_(-1, idx[..., None], hit[..., None])
    return e, onehot


def _parts_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    scores, shift, labels = xs
    e, onehot = torch_exp_and_onehot(ctx, scores, shift, labels, attrs.get("rows"))
    z = _torch.upcast(ctx, scores) - _torch.upcast(ctx, shift)[..., None]
    acc = attrs.get("acc")
    out = ctx.dtype(acc) if isinstance(acc, DType) else scores.dtype
    return (e.sum(-1).to(out), (z * onehot).sum(-1).to(out))


def _nll_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """torch's nll_loss (in f32 for 16-bit inputs), which wants the classes on dim 1: a view
    moving them there (``movedim``) for another ``axis``."""
    logp, labels = xs
    how = str_attr(attrs, "reduction", "mean")
    f = ctx.torch.nn.functional.nll_loss
    x = _torch.upcast(ctx, logp).movedim(classes_axis(attrs, logp.dim()), 1)
    return (_torch.like(f(x, labels.long(), reduction=how), logp),)


def _mse_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    p, t = xs
    how = str_attr(attrs, "reduction", "mean")
    f = ctx.torch.nn.functional.mse_loss
    return (_torch.like(f(_torch.upcast(ctx, p), _torch.upcast(ctx, t), reduction=how), p),)


def _nll_parts_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """The reference's formula on torch (in f32 for 16-bit inputs)."""
    logp, labels = xs
    rows = attrs.get("rows")
    zero = ctx.torch.zeros(logp.shape[:-1], dtype=logp.dtype, device=logp.device)
    e, onehot = torch_exp_and_onehot(ctx, logp, zero, labels, rows)
    x = _torch.upcast(ctx, logp)
    out = e.sum(-1) - class_share(logp.shape[-1], rows) - (x * onehot).sum(-1)
    return (out.to(logp.dtype),)


SOFTMAX_CROSS_ENTROPY_LOSS.fill("torch", _sce_torch)
NLL_LOSS_PARTS.fill("torch", _nll_parts_torch)
SOFTMAX_CROSS_ENTROPY_PARTS.fill("torch", _parts_torch)
NEGATIVE_LOG_LIKELIHOOD_LOSS.fill("torch", _nll_torch)
MSE_LOSS.fill("torch", _mse_torch)
