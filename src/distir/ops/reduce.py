"""Reductions (ONNX names): ReduceSum, ReduceMean and ReduceMax over a set of axes.

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

from distir.ir.ops import Op
from distir.ir.types import DType, Type
from distir.ir.values import Attrs, Value
from distir.ops import sharding as sh
from distir.ops._rules import norm_axes, numel
from distir.ops.gradrules import GradCtx, GradRule, first
from distir.ops.registry import AttrSpec, OpDef, TypeCtx, register

if TYPE_CHECKING:
    from distir.backend.context import TorchContext

FAMILY = "reduce"

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


REDUCE_SUM.fill("torch", _reduce_torch(mean=False))
REDUCE_MEAN.fill("torch", _reduce_torch(mean=True))
REDUCE_MAX.fill("torch", _max_torch)
