"""Gradient rules of the shape and data-movement ops (contract: ``distir.ops.gradrules``), kept
beside ``distir.ops.shape`` and ``distir.ops.shape_index`` (``shape`` imports this module at its
end) so those files stay short.

Each rule moves the cotangent back the way the op moved the data: the inverse permutation, a
reshape to the input's shape, Concat for Split and Split for Concat, SliceGrad / GatherGrad
(zeros with the cotangent put or scatter-added in) for Slice and Gather, a sum over the
broadcast dims for Expand. Integer tensors (indices, shapes) get no gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distir.ir.ops import Op
from distir.ir.values import Value
from distir.ops.gradrules import GradCtx, first, is_float, reshape, unbroadcast, zeros_like
from distir.ops.shape import EXPAND, RESHAPE, SQUEEZE, TRANSPOSE, UNSQUEEZE
from distir.ops.shape_index import CONCAT, GATHER, SLICE, SPLIT, TRILU

Grads = Sequence[Value | None]


def _transpose_grad(ctx: GradCtx, op: Op, douts: Grads) -> Grads:
    if not is_float(ctx, op.inputs[0]):
        return [None]
    rank = ctx.type(op.inputs[0]).rank
    perm: Any = op.attrs.get("perm") or tuple(reversed(range(rank)))
    inverse = [0] * rank
    for out_dim, in_dim in enumerate(perm):
        inverse[in_dim] = out_dim
    (dx,) = ctx.op("Transpose", first(douts), perm=tuple(inverse))
    return [dx]


def _reshape_grad(ctx: GradCtx, op: Op, douts: Grads) -> Grads:
    """Back to the input's concrete shape (the target shape input, if any, gets no gradient)."""
    dx = reshape(ctx, first(douts), ctx.type(op.inputs[0]).shape) if is_float(ctx, op.inputs[0]) else None
    return [dx, *(None for _ in op.inputs[1:])]


def _unsqueeze_grad(ctx: GradCtx, op: Op, douts: Grads) -> Grads:
    if not is_float(ctx, op.inputs[0]):
        return [None]
    rank = ctx.type(op.outputs[0]).rank
    axes: Any = op.attrs["axes"]
    (dx,) = ctx.op("Squeeze", first(douts), axes=tuple(sorted(a % rank for a in axes)))
    return [dx]


def _squeeze_grad(ctx: GradCtx, op: Op, douts: Grads) -> Grads:
    x = ctx.type(op.inputs[0])
    if not x.dtype.is_float:
        return [None]
    axes: Any = op.attrs.get("axes")
    removed = (
        sorted(a % x.rank for a in axes) if axes is not None else [i for i, d in enumerate(x.shape) if d == 1]
    )
    if not removed:
        return [first(douts)]
    (dx,) = ctx.op("Unsqueeze", first(douts), axes=tuple(removed))
    return [dx]


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


def _slice_grad(ctx: GradCtx, op: Op, douts: Grads) -> Grads:
    if not is_float(ctx, op.inputs[0]):
        return [None]
    x = ctx.type(op.inputs[0])
    attrs: dict[str, Any] = {
        k: op.attrs[k] for k in ("starts", "ends", "axes", "steps") if op.attrs.get(k) is not None
    }
    starts: Any = op.attrs["starts"]
    axes: Any = op.attrs.get("axes") or tuple(range(len(starts)))
    sliced = {a % x.rank for a in axes}
    # -1 for the dims that are not sliced: SliceGrad may keep them sharded
    shape = tuple(s if k in sliced else -1 for k, s in enumerate(x.shape))
    (dx,) = ctx.op("SliceGrad", first(douts), shape=shape, **attrs)
    return [dx]


def _gather_grad(ctx: GradCtx, op: Op, douts: Grads) -> Grads:
    """GatherGrad scatter-adds the cotangent into zeros of the data's shape; indices: none."""
    data = ctx.type(op.inputs[0])
    if not data.dtype.is_float:
        return [None, None]
    axis: Any = op.attrs.get("axis", 0)
    axis %= data.rank
    # the data, for its type only: a sharded table's gradient is sharded alike (each device
    # scatters into its own rows); a weight is a backward input anyway, nothing is saved for it
    dy, idx, table = first(douts), ctx.primal(op.inputs[1]), ctx.primal(op.inputs[0])
    (dx,) = ctx.op("GatherGrad", dy, idx, table, axis=axis, size=data.shape[axis])
    return [dx, None]


def _expand_grad(ctx: GradCtx, op: Op, douts: Grads) -> Grads:
    x = ctx.type(op.inputs[0])
    if not x.dtype.is_float:
        return [None]
    return [unbroadcast(ctx, first(douts), x.shape, ctx.type(op.outputs[0]).shape)]


def _trilu_grad(ctx: GradCtx, op: Op, douts: Grads) -> Grads:
    """Trilu is linear: the cotangent's same triangle."""
    if not is_float(ctx, op.inputs[0]):
        return [None]
    (dx,) = ctx.op("Trilu", first(douts), upper=op.attrs.get("upper", 1), k=op.attrs.get("k", 0))
    return [dx]


TRANSPOSE.fill("grad", _transpose_grad)
RESHAPE.fill("grad", _reshape_grad)
UNSQUEEZE.fill("grad", _unsqueeze_grad)
SQUEEZE.fill("grad", _squeeze_grad)
SPLIT.fill("grad", _split_grad)
CONCAT.fill("grad", _concat_grad)
SLICE.fill("grad", _slice_grad)
GATHER.fill("grad", _gather_grad)
EXPAND.fill("grad", _expand_grad)
TRILU.fill("grad", _trilu_grad)
