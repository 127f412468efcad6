"""Ops that keep a part of a tensor (family ``shape``, ONNX names): Gather, Slice, Trilu.

Gather's ``rows`` attribute (a piece of a sharded table) and its localizer are shared with the
ops that read a vocabulary-parallel table (the losses; GatherGrad). Gradient rules: GatherGrad
and SliceGrad (zeros with the cotangent scatter-added or put in; ``distir.ops.grad.index``) for
Gather and Slice, the cotangent's same triangle for Trilu. Integer tensors get no gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from distir.ir.dtensor import Shard
from distir.ir.ops import Op
from distir.ir.types import TensorType, Type
from distir.ir.values import Attrs, Value
from distir.ops import _torch
from distir.ops import sharding as sh
from distir.ops._rules import int_attr, norm_axis
from distir.ops.gradrules import GradCtx, first, is_float
from distir.ops.registry import AttrSpec, LocalizeRule, LocalPiece, OpDef, TypeCtx, register
from distir.ops.shape.family import COST_CLASS, FAMILY, copy_bytes

if TYPE_CHECKING:
    from distir.backend.context import TorchContext

Grads = Sequence[Value | None]


# -- Gather -----------------------------------------------------------------------------------
# ``rows=[start, total]``: ``data`` is the piece starting at row ``start`` (along ``axis``) of a
# table of ``total`` rows, sharded on the gathered axis (Megatron's vocabulary-parallel
# embedding). An index (negative ones count from ``total``) that falls outside the piece reads
# zeros, so the pieces' results sum to the whole table's. Materialization sets it per device
# (``localize``); a global program leaves it unset.
ROWS = AttrSpec("ints", None)
# a row of the whole table whose gradient stays zero (``nn.Embedding``'s ``padding_idx``); -1: none
PADDING = AttrSpec("int", -1)


def check_rows(ctx: TypeCtx, n: int) -> tuple[int, int] | None:
    """The ``rows`` attribute of an op whose piece has ``n`` rows, validated (None: unset)."""
    rows = ctx.attr("rows")
    if rows is None:
        return None
    if len(rows) != 2 or rows[0] < 0 or rows[0] + n > rows[1]:
        ctx.fail(
            f"{ctx.op.name} rows={list(rows)} must be [start, total] with 0 <= start, start + {n} <= total",
            None,
            "[start, total]",
            list(rows),
        )
    return int(rows[0]), int(rows[1])


def local_rows(idx: Any, rows: Any, n: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Indices into a piece of ``n`` rows at ``rows=[start, total]`` (None: the whole table), and
    the mask of those it holds (None: all)."""
    i = np.asarray(idx).astype(np.int64)
    if rows is None:
        return i, None
    start, total = int(rows[0]), int(rows[1])
    local = np.where(i < 0, i + total, i) - start
    mask = (local >= 0) & (local < n)
    return np.where(mask, local, 0), mask


def rows_localizer(axis_of: Callable[[Attrs, int], int], table: int) -> LocalizeRule:
    """The ``localize`` rule of an op whose input ``table`` is read along ``axis_of(attrs,
    rank)``: when that input is a piece of a sharded axis, ``rows`` says where the piece starts
    and the global size."""

    def localize(attrs: Attrs, ins: Sequence[LocalPiece | None], outs: Sequence[LocalPiece | None]) -> Attrs:
        piece = ins[table]
        if piece is None:
            return attrs
        ax = axis_of(attrs, len(piece.shape))
        if piece.shape[ax] == piece.global_shape[ax]:
            return attrs
        given: Any = attrs.get("rows")
        start, total = (int(given[0]), int(given[1])) if given is not None else (0, piece.global_shape[ax])
        return Attrs({**dict(attrs.items()), "rows": (start + piece.offset[ax], total)})

    return localize


def gather_axis(attrs: Attrs, rank: int) -> int:
    return int_attr(attrs, "axis", 0) % max(rank, 1)


def _gather_rule(ctx: TypeCtx) -> Sequence[Type]:
    data, idx = ctx.tensor(0), ctx.tensor(1)
    if not idx.dtype.is_int:
        ctx.fail("Gather indices must be integers", 1, "an int dtype", idx.dtype)
    if data.rank == 0:
        ctx.fail("Gather data must have rank >= 1", 0, "rank >= 1", 0)
    ax = norm_axis(ctx, ctx.attr("axis"), data.rank)
    rows = check_rows(ctx, data.shape[ax])
    known = ctx.known[1]
    if known is not None:
        n = data.shape[ax] if rows is None else rows[1]
        if np.any((known < -n) | (known >= n)):
            ctx.fail(f"Gather index out of range for axis of size {n}", 1, f"-{n}..{n - 1}", known.tolist())
    return (ctx.out(data.dtype, data.shape[:ax] + idx.shape + data.shape[ax + 1 :]),)


def _gather_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    data = np.asarray(args[0])
    ax = gather_axis(attrs, data.ndim)
    idx, mask = local_rows(args[1], attrs.get("rows"), data.shape[ax])
    if data.shape[ax] == 0:  # an empty piece of the table: every index is elsewhere
        return (np.zeros(data.shape[:ax] + idx.shape + data.shape[ax + 1 :], dtype=data.dtype),)
    out = np.take(data, idx, axis=ax)
    if mask is not None:
        out = out * mask.reshape((1,) * ax + mask.shape + (1,) * (data.ndim - ax - 1)).astype(data.dtype)
    return (out,)


GATHER = register(
    OpDef(
        name="Gather",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("data", "indices"),
        outputs=("output",),
        infer=_gather_rule,
        attrs={"axis": AttrSpec("int", 0), "rows": ROWS, "padding": PADDING},
        reference=_gather_ref,
        bytes_read=lambda ins, outs, attrs: float(outs[0].nbytes + ins[1].nbytes),
        doc="ONNX Gather: take slices of data along axis (an embedding lookup when axis=0); "
        "rows=[start, total]: data is that piece of a sharded table, indices outside it read zeros; "
        "padding (a row of the whole table, default -1: none) gets no gradient, as nn.Embedding's "
        "padding_idx.",
        sharding=sh.embedding,
        localize=rows_localizer(gather_axis, 0),
    )
)


# -- Slice ------------------------------------------------------------------------------------
def slices(ctx_or_none: TypeCtx | None, shape: tuple[int, ...], attrs: Attrs) -> list[slice]:
    starts: Any = attrs.get("starts")
    ends: Any = attrs.get("ends")
    axes: Any = attrs.get("axes") or tuple(range(len(starts)))
    steps: Any = attrs.get("steps") or (1,) * len(starts)
    if ctx_or_none is not None and not (len(starts) == len(ends) == len(axes) == len(steps)):
        ctx_or_none.fail(
            "Slice starts, ends, axes and steps must have the same length",
            None,
            len(starts),
            [len(ends), len(axes), len(steps)],
        )
    sl = [slice(None)] * len(shape)
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        if ctx_or_none is not None:
            a = norm_axis(ctx_or_none, a, len(shape), "Slice axis")
            if st == 0:
                ctx_or_none.fail("Slice step must not be 0", None, "non-zero", 0)
        sl[a % len(shape)] = slice(s, e, st)
    return sl


SLICE_ATTRS = {
    "starts": AttrSpec("ints"),
    "ends": AttrSpec("ints"),
    "axes": AttrSpec("ints", None),
    "steps": AttrSpec("ints", None),
}


def slice_sharding(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[sh.Strategy]:
    """Dims that are not sliced may stay sharded."""
    x = ins[0].shape if isinstance(ins[0], TensorType) else ()
    starts: Any = attrs.get("starts") or ()
    axes: Any = attrs.get("axes") or tuple(range(len(starts)))
    sliced = {a % max(len(x), 1) for a in axes}
    found = [sh.replicated(ins, outs)]
    for d in range(len(x)):
        if d not in sliced and x[d] > 1:
            found.append(sh.Strategy((Shard(d),), (Shard(d),)))
    return found


def _slice_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = ctx.tensor(0)
    sl = slices(ctx, t.shape, ctx.attrs)
    shape = [len(range(*s.indices(d))) for s, d in zip(sl, t.shape, strict=True)]
    return (ctx.out(t.dtype, shape),)


SLICE = register(
    OpDef(
        name="Slice",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("data",),
        outputs=("output",),
        infer=_slice_rule,
        attrs=dict(SLICE_ATTRS),
        reference=lambda args, attrs: (
            np.array(np.asarray(args[0])[tuple(slices(None, np.shape(args[0]), attrs))]),
        ),
        bytes_read=copy_bytes,
        doc="ONNX Slice with starts/ends/axes/steps as attributes (Python slice semantics).",
        sharding=slice_sharding,
    )
)


# -- Trilu ------------------------------------------------------------------------------------
def _trilu_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = ctx.tensor(0)
    if t.rank < 2:
        ctx.fail("Trilu needs a tensor of rank >= 2 (matrices in its last two dims)", 0, "rank >= 2", t.rank)
    return (ctx.out(t.dtype, t.shape),)


def _trilu_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[0])
    k = int_attr(attrs, "k", 0)
    return (np.triu(x, k) if int_attr(attrs, "upper", 1) else np.tril(x, k),)


def _trilu_sharding(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[sh.Strategy]:
    """The batch dims (all but the last two) may be sharded; zeroing is linear, so a pending
    sum passes through."""
    x = ins[0].shape if isinstance(ins[0], TensorType) else ()
    found = [sh.replicated(ins, outs), sh.Strategy((sh.SUM,), (sh.SUM,))]
    found += [sh.Strategy((Shard(d),), (Shard(d),)) for d in range(len(x) - 2) if x[d] > 1]
    return found


TRILU = register(
    OpDef(
        name="Trilu",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("input",),
        outputs=("output",),
        infer=_trilu_rule,
        attrs={"upper": AttrSpec("int", 1, (0, 1)), "k": AttrSpec("int", 0)},
        reference=_trilu_ref,
        bytes_read=copy_bytes,
        doc="ONNX Trilu with k as an attribute: the upper (upper=1: j - i >= k) or lower (upper=0: "
        "j - i <= k) triangle of the last two dims, zeros elsewhere.",
        sharding=_trilu_sharding,
    )
)

__all__ = ["PADDING", "SLICE_ATTRS", "forward_slices", "slice_sharding", "slices"]


# -- gradient rules (contract: distir.ops.gradrules) ------------------------------------------
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
    padding = int_attr(op.attrs, "padding", -1)
    pad = {"padding": padding} if padding >= 0 else {}
    (dx,) = ctx.op("GatherGrad", dy, idx, table, axis=axis, size=data.shape[axis], **pad)
    return [dx, None]


def _trilu_grad(ctx: GradCtx, op: Op, douts: Grads) -> Grads:
    """Trilu is linear: the cotangent's same triangle."""
    if not is_float(ctx, op.inputs[0]):
        return [None]
    (dx,) = ctx.op("Trilu", first(douts), upper=op.attrs.get("upper", 1), k=op.attrs.get("k", 0))
    return [dx]


# -- torch implementations (contract: distir.ops._torch) ----------------------------------------
def forward_slices(shape: Sequence[int], attrs: Attrs) -> tuple[tuple[slice, ...], tuple[int, ...]]:
    """Slice's index as torch takes it (torch has no negative steps): slices with positive
    steps, and the dims to flip after them (those whose step was negative)."""
    out: list[slice] = []
    flip: list[int] = []
    for d, (s, n) in enumerate(zip(slices(None, tuple(shape), attrs), shape, strict=True)):
        r = range(*s.indices(n))
        if r.step > 0 or not r:
            out.append(slice(r.start, r.stop, r.step) if r else slice(0, 0))
        else:
            out.append(slice(r[-1], r[0] + 1, -r.step))
            flip.append(d)
    return tuple(out), tuple(flip)


def _gather_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    data, idx = xs
    ax = gather_axis(attrs, data.dim())
    n = data.shape[ax]
    shape = (*data.shape[:ax], *idx.shape, *data.shape[ax + 1 :])
    if n == 0:
        return (ctx.torch.zeros(shape, dtype=data.dtype, device=data.device),)
    i, mask = _torch.local_rows(ctx, idx, attrs.get("rows"), n)
    out = data.index_select(ax, i.reshape(-1)).reshape(shape)
    if mask is not None:
        out = out * mask.reshape((1,) * ax + tuple(mask.shape) + (1,) * (data.dim() - ax - 1)).to(out.dtype)
    return (out,)


def _slice_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    index, flip = forward_slices(tuple(xs[0].shape), attrs)
    y = xs[0][index]
    return (y.flip(flip) if flip else y,)


def _trilu_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    k = int_attr(attrs, "k", 0)
    return (ctx.torch.triu(xs[0], k) if int_attr(attrs, "upper", 1) else ctx.torch.tril(xs[0], k),)


SLICE.fill("grad", _slice_grad)
GATHER.fill("grad", _gather_grad)
TRILU.fill("grad", _trilu_grad)
GATHER.fill("torch", _gather_torch)
TRILU.fill("torch", _trilu_torch)
SLICE.fill("torch", _slice_torch)
