"""Ops that join tensors along an axis or split one (family ``shape``, ONNX names): Concat, Split.

Each is the other's gradient: Concat of the parts' cotangents for Split (zeros for a part
without one), Split into the inputs' sizes for Concat.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from distir.ir.dtensor import split_sizes
from distir.ir.ops import Op
from distir.ir.types import Type
from distir.ir.values import Attrs, Value
from distir.ops import sharding as sh
from distir.ops._rules import int_attr, norm_axis
from distir.ops.gradrules import GradCtx, first, is_float, zeros_like
from distir.ops.registry import AttrSpec, OpDef, TypeCtx, register
from distir.ops.shape.family import COST_CLASS, FAMILY, copy_bytes

if TYPE_CHECKING:
    from distir.backend.context import TorchContext

Grads = Sequence[Value | None]


# -- Concat -----------------------------------------------------------------------------------
def _concat_rule(ctx: TypeCtx) -> Sequence[Type]:
    ts = [ctx.tensor(i) for i in range(len(ctx.types))]
    first = ts[0]
    ax = norm_axis(ctx, ctx.attr("axis"), first.rank)
    total = 0
    for i, t in enumerate(ts):
        if t.dtype != first.dtype:
            ctx.fail(f"Concat input {i + 1} has dtype {t.dtype}", i, first.dtype, t.dtype)
        if t.rank != first.rank or any(
            a != b for k, (a, b) in enumerate(zip(t.shape, first.shape, strict=True)) if k != ax
        ):
            ctx.fail(
                f"Concat input {i + 1} of shape {t.shape} does not match {first.shape} outside axis {ax}",
                i,
                first.shape,
                t.shape,
            )
        total += t.shape[ax]
    return (ctx.out(first.dtype, (*first.shape[:ax], total, *first.shape[ax + 1 :])),)


CONCAT = register(
    OpDef(
        name="Concat",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("*inputs",),
        outputs=("concat_result",),
        infer=_concat_rule,
        attrs={"axis": AttrSpec("int")},
        reference=lambda args, attrs: (
            np.concatenate([np.asarray(a) for a in args], axis=int_attr(attrs, "axis", 0)),
        ),
        bytes_read=copy_bytes,
        sharding=sh.other_dims("axis"),
    )
)


# -- Split ------------------------------------------------------------------------------------
def _split_count(n_inputs: int, attrs: Attrs) -> int:
    sizes: Any = attrs.get("sizes")
    if sizes is not None:
        return len(sizes)
    k = attrs.get("num_splits", 2)
    return k if isinstance(k, int) and not isinstance(k, bool) and k > 0 else 1


def _split_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = ctx.tensor(0)
    ax = norm_axis(ctx, ctx.attr("dim"), t.rank, "Split dim")
    sizes = ctx.attr("sizes")
    if sizes is not None:
        if "num_splits" in ctx.attrs:
            ctx.fail("Split takes either num_splits or sizes, not both")
        if sum(sizes) != t.shape[ax] or any(s < 0 for s in sizes):
            ctx.fail(
                f"Split sizes {list(sizes)} do not add up to dim {ax} of size {t.shape[ax]}",
                0,
                t.shape[ax],
                sum(sizes),
            )
    else:
        k = ctx.attr("num_splits")
        if k < 1:
            ctx.fail("Split num_splits must be positive", None, ">= 1", k)
        sizes = split_sizes(t.shape[ax], k)
    return tuple(ctx.out(t.dtype, (*t.shape[:ax], s, *t.shape[ax + 1 :])) for s in sizes)


def _split_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[0])
    ax: Any = attrs.get("dim", 0)
    sizes: Any = attrs.get("sizes")
    if sizes is None:
        sizes = split_sizes(x.shape[ax], attrs.get("num_splits", 2))  # type: ignore[arg-type]
    cuts = np.cumsum(sizes)[:-1]
    return tuple(np.ascontiguousarray(p) for p in np.split(x, cuts, axis=ax))


def _split_bytes(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    """What a Split reads and writes: the parts' bytes, none for views (``view=1``)."""
    return 0.0 if attrs.get("view", 0) else copy_bytes(ins, outs, attrs)


SPLIT = register(
    OpDef(
        name="Split",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("input",),
        outputs=_split_count,
        infer=_split_rule,
        attrs={
            "dim": AttrSpec("int", 0),
            "num_splits": AttrSpec("int", 2),
            "sizes": AttrSpec("ints", None),
            "view": AttrSpec("int", 0, (0, 1)),
        },
        reference=_split_ref,
        bytes_read=_split_bytes,
        bytes_written=_split_bytes,
        doc="Split along dim into num_splits near-equal parts (first parts larger) or given sizes; "
        "view=1: the parts are views of the input, as torch.split returns them (no kernel, no "
        "bytes: the consumers read them strided), where the default copies them out.",
        sharding=sh.other_dims("dim"),
    )
)


# -- gradient rules (contract: distir.ops.gradrules) ------------------------------------------
def _split_grad(ctx: GradCtx, op: Op, douts: Grads) -> Grads:
    """Concat of the parts' cotangents; a part without one contributes zeros of its shape."""
    if not is_float(ctx, op.inputs[0]):
        return [None]
    parts = [
        d if d is not None else zeros_like(ctx, ctx.primal(o)) for d, o in zip(douts, op.outputs, strict=True)
    ]
    rank = ctx.type(op.inputs[0]).rank
    dim: Any = op.attrs.get("dim", 0)
    (dx,) = ctx.op("Concat", *parts, axis=dim % rank)
    return [dx]


def _concat_grad(ctx: GradCtx, op: Op, douts: Grads) -> Grads:
    """Split of the cotangent into the inputs' sizes along the axis."""
    if not is_float(ctx, op.inputs[0]):
        return [None for _ in op.inputs]
    ts = [ctx.type(v) for v in op.inputs]
    axis: Any = op.attrs["axis"]
    axis %= ts[0].rank
    sizes = tuple(t.shape[axis] for t in ts)
    return list(ctx.op("Split", first(douts), n_out=len(sizes), dim=axis, sizes=sizes))


# -- torch implementations (contract: distir.ops._torch) ----------------------------------------
def _split_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    x = xs[0]
    ax = int_attr(attrs, "dim", 0) % x.dim()
    sizes: Any = attrs.get("sizes")
    if sizes is None:
        sizes = split_sizes(x.shape[ax], int_attr(attrs, "num_splits", 2))
    return tuple(ctx.torch.split(x, list(sizes), dim=ax))


SPLIT.fill("grad", _split_grad)
CONCAT.fill("grad", _concat_grad)
CONCAT.fill("torch", lambda ctx, xs, attrs: (ctx.torch.cat(list(xs), dim=int_attr(attrs, "axis", 0)),))
SPLIT.fill("torch", _split_torch)
