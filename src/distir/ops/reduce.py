"""Reductions (ONNX names): ReduceSum, ReduceMean and ReduceMax over a set of axes, and the
running sum CumSum along one axis.

Attributes follow ONNX with the axes as an attribute: ``axes`` (default: every axis; an empty
list also means every axis, ONNX's ``noop_with_empty_axes=0``) and ``keepdims`` (1 keeps reduced
axes with size 1). Float references accumulate in float64 and round once to the input dtype;
integer sums wrap like the dtype does, integer means truncate toward zero.

ReduceMax has no gradient rule (its gradient would route to the argmax): the vocabulary-parallel
cross entropy of the zoo uses it for the softmax's shift, behind a ``StopGradient``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from distir.ir.dtensor import Shard
from distir.ir.ops import Op
from distir.ir.types import DType, TensorType, Type
from distir.ir.values import Attrs, Value
from distir.ops import sharding as sh
from distir.ops._rules import int_attr, norm_axes, numel
from distir.ops.gradrules import GradCtx, GradRule, first
from distir.ops.registry import AttrSpec, CostClass, OpDef, TypeCtx, register

if TYPE_CHECKING:
    from distir.backend.context import TorchContext

FAMILY = "reduce"
COST_CLASS = CostClass.REDUCE  # how the family's ops are costed

ATTRS = {"axes": AttrSpec("ints", None), "keepdims": AttrSpec("int", 1, (0, 1))}


def reduced_axes(ctx: TypeCtx, rank: int) -> list[int]:
    """The normalized, sorted axes a reduction removes (all of them when ``axes`` is unset)."""
    axes = ctx.attr("axes")
    if not axes:
        return list(range(rank))
    return sorted(norm_axes(ctx, axes, rank, "Reduce axis"))


def _reduce_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = ctx.tensor(0)
    if t.dtype is DType.bool:
        ctx.fail(f"{ctx.op.name} needs a numeric input", 0, "a numeric dtype", t.dtype)
    axes = set(reduced_axes(ctx, t.rank))
    keep = ctx.attr("keepdims") == 1
    shape = [1 if i in axes else d for i, d in enumerate(t.shape) if keep or i not in axes]
    return (ctx.out(t.dtype, shape),)


def _axes_of(x: np.ndarray, attrs: Attrs) -> tuple[int, ...]:
    axes: Any = attrs.get("axes")
    if not axes:
        return tuple(range(x.ndim))
    return tuple(a % x.ndim for a in axes)


def _reduce_ref(mean: bool) -> Any:
    def ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
        x = np.asarray(args[0])
        axes = _axes_of(x, attrs)
        keep = attrs.get("keepdims", 1) == 1
        acc = np.float64 if x.dtype.kind == "f" else np.int64
        s = np.sum(x, axis=axes, keepdims=keep, dtype=acc)
        if mean:
            n = int(np.prod([x.shape[a] for a in axes]))
            s = s / n if x.dtype.kind == "f" else np.trunc(s / n).astype(np.int64)
        return (np.asarray(s).astype(x.dtype),)

    return ref


def _sum_flops(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    """One add per input element that is folded into an output element."""
    return float(max(numel(ins[0]) - numel(outs[0]), 0))


def _mean_flops(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    return _sum_flops(ins, outs, attrs) + float(numel(outs[0]))


REDUCE_SUM = register(
    OpDef(
        name="ReduceSum",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("data",),
        outputs=("reduced",),
        infer=_reduce_rule,
        attrs=dict(ATTRS),
        reference=_reduce_ref(mean=False),
        flops=_sum_flops,
        doc="Sum over axes (default all); keepdims=1 keeps them with size 1.",
        sharding=sh.reduction("sum"),
    )
)
REDUCE_MEAN = register(
    OpDef(
        name="ReduceMean",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("data",),
        outputs=("reduced",),
        infer=_reduce_rule,
        attrs=dict(ATTRS),
        reference=_reduce_ref(mean=True),
        flops=_mean_flops,
        doc="Mean over axes (default all); keepdims=1 keeps them with size 1.",
        sharding=sh.reduction("mean"),
    )
)


def _max_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[0])
    return (np.asarray(np.max(x, axis=_axes_of(x, attrs), keepdims=attrs.get("keepdims", 1) == 1)),)


REDUCE_MAX = register(
    OpDef(
        name="ReduceMax",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("data",),
        outputs=("reduced",),
        infer=_reduce_rule,
        attrs=dict(ATTRS),
        reference=_max_ref,
        flops=_sum_flops,
        doc="Maximum over axes (default all); keepdims=1 keeps them with size 1. Not differentiable.",
        sharding=sh.reduction("max"),
    )
)


# -- CumSum -----------------------------------------------------------------------------------
def _cumsum_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = ctx.tensor(0)
    if t.dtype is DType.bool or t.rank == 0:
        ctx.fail("CumSum needs a numeric tensor of rank >= 1", 0, "a numeric dtype, rank >= 1", t)
    norm_axes(ctx, [ctx.attr("axis")], t.rank, "CumSum axis")
    return (ctx.out(t.dtype, t.shape),)


def _cumsum_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[0])
    ax = int_attr(attrs, "axis", 0) % x.ndim
    rev = int_attr(attrs, "reverse", 0) == 1
    y = np.flip(x, ax) if rev else x
    acc = np.float64 if x.dtype.kind == "f" else np.int64
    s = np.cumsum(y, axis=ax, dtype=acc)
    if int_attr(attrs, "exclusive", 0):
        s = s - y  # the sum of the elements before, not including, each one
    return (np.ascontiguousarray(np.flip(s, ax) if rev else s).astype(x.dtype),)


def _cumsum_sharding(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[sh.Strategy]:
    """Dims other than the summed one may be sharded; a running sum is linear, so a pending sum
    passes through."""
    x = ins[0].shape if isinstance(ins[0], TensorType) else ()
    ax = int_attr(attrs, "axis", 0) % max(len(x), 1)
    found = [sh.replicated(ins, outs), sh.Strategy((sh.SUM,), (sh.SUM,))]
    found += [sh.Strategy((Shard(d),), (Shard(d),)) for d in range(len(x)) if d != ax and x[d] > 1]
    return found


CUMSUM = register(
    OpDef(
        name="CumSum",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("x",),
        outputs=("y",),
        infer=_cumsum_rule,
        attrs={
            "axis": AttrSpec("int", 0),
            "exclusive": AttrSpec("int", 0, (0, 1)),
            "reverse": AttrSpec("int", 0, (0, 1)),
        },
        reference=_cumsum_ref,
        flops=lambda ins, outs, attrs: float(numel(outs[0])),
        doc="ONNX CumSum with the axis as an attribute: running sums along axis (exclusive=1: of "
        "the elements before each one; reverse=1: from the end). Floats accumulate in float64.",
        sharding=_cumsum_sharding,
    )
)


# -- gradient rules (contract: distir.ops.gradrules) --------------------------------------------
def _reduce_grad(mean: bool) -> GradRule:
    """dX = dY expanded back over the reduced axes (put back as size 1 first when keepdims=0);
    a mean also divides by the number of elements each result averaged."""

    def rule(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
        dy = first(douts)
        x = ctx.type(op.inputs[0])
        if not x.dtype.is_float:
            return [None]
        axes: Any = op.attrs.get("axes")
        axes = sorted(a % x.rank for a in axes) if axes else list(range(x.rank))
        if op.attrs.get("keepdims", 1) == 0 and axes:
            (dy,) = ctx.op("Unsqueeze", dy, axes=tuple(axes))
        count = math.prod(x.shape[a] for a in axes)
        if mean and count > 1:
            (dy,) = ctx.op("Scale", dy, alpha=1.0 / count)
        # 1 keeps the dims that were not reduced: Expand may keep them sharded
        grow = tuple(x.shape[a] if a in axes else 1 for a in range(x.rank))
        (dx,) = ctx.op("Expand", dy, shape=grow)
        return [dx]

    return rule


REDUCE_SUM.fill("grad", _reduce_grad(mean=False))
REDUCE_MEAN.fill("grad", _reduce_grad(mean=True))


def _cumsum_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    """Each input element adds to the results after it (before it, reversed): dX is the running
    sum of dY the other way, with the same exclusivity."""
    if not ctx.type(op.inputs[0]).dtype.is_float:
        return [None]
    rev = 1 - int_attr(op.attrs, "reverse", 0)
    (dx,) = ctx.op(
        "CumSum",
        first(douts),
        axis=int_attr(op.attrs, "axis", 0),
        exclusive=int_attr(op.attrs, "exclusive", 0),
        reverse=rev,
    )
    return [dx]


CUMSUM.fill("grad", _cumsum_grad)

__all__ = ["reduced_axes"]


# -- torch implementations (contract: distir.ops._torch) ----------------------------------------
def _torch_axes(x: Any, attrs: Attrs) -> tuple[int, ...]:
    axes: Any = attrs.get("axes")
    return tuple(a % x.dim() for a in axes) if axes else tuple(range(x.dim()))


def _reduce_torch(mean: bool) -> Any:
    """Sums in the input's dtype (integers in i64, wrapping back like the dtype); an integer
    mean truncates toward zero."""

    def impl(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
        x = xs[0]
        axes, keep = _torch_axes(x, attrs), attrs.get("keepdims", 1) == 1
        if x.dtype.is_floating_point:
            f = ctx.torch.mean if mean else ctx.torch.sum
            return (f(x, dim=axes, keepdim=keep) if axes else x.clone(),)
        s = ctx.torch.sum(x, dim=axes, keepdim=keep, dtype=ctx.torch.int64) if axes else x.long()
        if mean:
            n = math.prod(x.shape[a] for a in axes)
            s = ctx.torch.div(s, n, rounding_mode="trunc") if n else ctx.torch.zeros_like(s)
        return (s.to(x.dtype),)

    return impl


def _max_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    x = xs[0]
    axes = _torch_axes(x, attrs)
    return (ctx.torch.amax(x, dim=axes, keepdim=attrs.get("keepdims", 1) == 1) if axes else x.clone(),)


def _cumsum_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    x = xs[0]
    ax = int_attr(attrs, "axis", 0) % x.dim()
    y = x.flip(ax) if int_attr(attrs, "reverse", 0) == 1 else x
    acc = ctx.torch.float64 if x.dtype.is_floating_point else ctx.torch.int64
    s = ctx.torch.cumsum(y.to(acc), dim=ax)
    if int_attr(attrs, "exclusive", 0):
        s = s - y.to(acc)  # the sum of the elements before, not including, each one
    return ((s.flip(ax) if int_attr(attrs, "reverse", 0) == 1 else s).to(x.dtype),)


REDUCE_SUM.fill("torch", _reduce_torch(mean=False))
CUMSUM.fill("torch", _cumsum_torch)
REDUCE_MEAN.fill("torch", _reduce_torch(mean=True))
REDUCE_MAX.fill("torch", _max_torch)
