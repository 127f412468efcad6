"""Gradient ops of the indexing ops (family ``grad``): ``GatherGrad`` (the adjoint of Gather: an
embedding's gradient) and ``SliceGrad`` (the adjoint of Slice).

Both build their result from zeros of the forward input's shape, which they take as attributes
(``size`` / ``shape``), so backward code needs no constant on a device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from distir.ir.dtensor import Placement, Shard
from distir.ir.types import TensorType, Type
from distir.ir.values import Attrs
from distir.ops import _torch
from distir.ops import sharding as sh
from distir.ops._rules import in_numel_flops, int_attr, norm_axis
from distir.ops.grad.family import COST_CLASS, FAMILY
from distir.ops.registry import AttrSpec, LocalPiece, OpDef, TypeCtx, register
from distir.ops.shape.select import (
    PADDING,
    ROWS,
    SLICE_ATTRS,
    check_rows,
    forward_slices,
    local_rows,
    slice_sharding,
    slices,
)

if TYPE_CHECKING:
    from distir.backend.context import TorchContext


def _shape(t: Type) -> tuple[int, ...]:
    return t.shape if isinstance(t, TensorType) else ()


# -- GatherGrad -------------------------------------------------------------------------------
def _gather_grad_rule(ctx: TypeCtx) -> Sequence[Type]:
    dy, idx = ctx.tensor(0), ctx.tensor(1)
    if not idx.dtype.is_int:
        ctx.fail("GatherGrad indices must be integers", 1, "an int dtype", idx.dtype)
    size = ctx.attr("size")
    if size < 1 and not (size == 0 and ctx.attr("rows") is not None):  # a piece may be empty
        ctx.fail(f"GatherGrad size must be positive, got {size}", None, ">= 1", size)
    # dY = data[:axis] + indices + data[axis + 1:], so data has rank dY.rank - indices.rank + 1
    rank = dy.rank - idx.rank + 1
    if rank < 1:
        ctx.fail(
            f"GatherGrad: dY of rank {dy.rank} is too small for indices of rank {idx.rank}",
            0,
            f"rank >= {idx.rank}",
            dy.rank,
        )
    ax = norm_axis(ctx, ctx.attr("axis"), rank, "GatherGrad axis")
    if dy.shape[ax : ax + idx.rank] != idx.shape:
        ctx.fail(
            f"GatherGrad: dY of shape {dy.shape} does not hold the indices' shape {idx.shape} at axis {ax}",
            0,
            idx.shape,
            dy.shape[ax : ax + idx.rank],
        )
    rows = check_rows(ctx, size)
    total = size if rows is None else rows[1]
    known = ctx.known[1]
    if known is not None and np.any((known < -total) | (known >= total)):
        ctx.fail(
            f"GatherGrad index out of range for size {total}", 1, f"-{total}..{total - 1}", known.tolist()
        )
    shape = (*dy.shape[:ax], size, *dy.shape[ax + idx.rank :])
    if len(ctx.types) == 3 and ctx.tensor(2).shape != shape:
        ctx.fail(
            f"GatherGrad data of shape {ctx.tensor(2).shape} is not the result's {shape}",
            2,
            shape,
            ctx.tensor(2).shape,
        )
    return (ctx.out(dy.dtype, shape),)


def _gather_grad_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    dy, idx = np.asarray(args[0]), np.asarray(args[1])
    ax = int_attr(attrs, "axis", 0) % (dy.ndim - idx.ndim + 1)
    size = int_attr(attrs, "size", 0)
    idx, mask = local_rows(idx, attrs.get("rows"), size)
    out = np.zeros((*dy.shape[:ax], size, *dy.shape[ax + idx.ndim :]), dtype=dy.dtype)
    if mask is not None:  # rows another piece of the table holds: nothing to add here
        if not size:
            return (out,)
        dy = dy * mask.reshape((1,) * ax + mask.shape + (1,) * (dy.ndim - ax - idx.ndim)).astype(dy.dtype)
    where: Any = (*(slice(None) for _ in range(ax)), idx)
    np.add.at(out, where, dy)  # repeated indices accumulate
    row = padding_row(attrs, size)
    if row is not None:
        np.moveaxis(out, ax, 0)[row] = 0
    return (out,)


def padding_row(attrs: Attrs, size: int) -> int | None:
    """The row of this piece of the table (``rows``) that is the ``padding`` row, if it holds it."""
    padding = int_attr(attrs, "padding", -1)
    if padding < 0:
        return None
    given: Any = attrs.get("rows")
    local = padding - (int(given[0]) if given is not None else 0)
    return local if 0 <= local < size else None


def _gather_grad_sharding(
    ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int
) -> list[sh.Strategy]:
    """dY's dims before ``axis`` and after the index dims map to the result's; sharding an index
    dim (dY and indices alike) leaves each device a part of the sum (P(sum)); linear in dY."""
    dy, idx, y = _shape(ins[0]), _shape(ins[1]), _shape(outs[0])
    a = int_attr(attrs, "axis", 0) % max(len(y), 1)
    with_data = len(ins) == 3

    def data(p: Placement) -> tuple[Placement, ...]:  # the data input, placed as the result
        return (p,) if with_data else ()

    found = [sh.replicated(ins, outs)]
    for d in range(len(dy)):
        if dy[d] <= 1:
            continue
        if d < a:
            found.append(sh.Strategy((Shard(d), sh.R, *data(Shard(d))), (Shard(d),)))
        elif d < a + len(idx):
            found.append(sh.Strategy((Shard(d), Shard(d - a), *data(sh.R)), (sh.SUM,)))
        else:
            od = d - len(idx) + 1
            found.append(sh.Strategy((Shard(d), sh.R, *data(Shard(od))), (Shard(od),)))
    if with_data and y[a] > 1:  # each device scatters into its rows of the table (``rows``)
        found.append(sh.Strategy((sh.R, sh.R, Shard(a)), (Shard(a),)))
    found.append(sh.Strategy((sh.SUM, sh.R, *data(sh.R)), (sh.SUM,)))
    return found


def _gather_grad_localize(
    attrs: Attrs, ins: Sequence[LocalPiece | None], outs: Sequence[LocalPiece | None]
) -> Attrs:
    """A result sharded on ``axis`` (the table's rows): ``size`` is the piece's, ``rows`` where it
    starts in the table."""
    y = outs[0]
    if y is None:
        return attrs
    ax = int_attr(attrs, "axis", 0) % max(len(y.shape), 1)
    if y.shape[ax] == y.global_shape[ax]:
        return attrs
    given: Any = attrs.get("rows")
    start, total = (int(given[0]), int(given[1])) if given is not None else (0, y.global_shape[ax])
    return Attrs({**dict(attrs.items()), "size": y.shape[ax], "rows": (start + y.offset[ax], total)})


GATHER_GRAD = register(
    OpDef(
        name="GatherGrad",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("dY", "indices", "data?"),
        outputs=("dData",),
        infer=_gather_grad_rule,
        attrs={"axis": AttrSpec("int", 0), "size": AttrSpec("int"), "rows": ROWS, "padding": PADDING},
        reference=_gather_grad_ref,
        flops=in_numel_flops(1.0),
        bytes_read=lambda ins, outs, attrs: float(sum(t.nbytes for t in ins[:2])),  # data: its type only
        doc="The gradient of Gather(data, indices, axis) w.r.t. data, whose dim axis has the given "
        "size: dY scatter-added into zeros along axis (repeated indices accumulate). The optional "
        "data (the forward's) gives only its type: sharded on axis, each device keeps its rows "
        "(rows=[start, total] as Gather's: indices outside them add nothing); the padding row "
        "(of the whole table) stays zero.",
        sharding=_gather_grad_sharding,
        localize=_gather_grad_localize,
    )
)


# -- SliceGrad --------------------------------------------------------------------------------
def _slice_grad_shape(dy: tuple[int, ...], shape: Sequence[int]) -> tuple[int, ...]:
    """``shape`` with each -1 (a dim that is not sliced) replaced by dY's size there."""
    return tuple(dy[k] if s == -1 else s for k, s in enumerate(shape))


def _slice_grad_rule(ctx: TypeCtx) -> Sequence[Type]:
    dy = ctx.tensor(0)
    given = tuple(ctx.attr("shape"))
    if len(given) != dy.rank:
        ctx.fail(
            f"SliceGrad shape {list(given)} has rank {len(given)} but dY has rank {dy.rank}",
            0,
            len(given),
            dy.rank,
        )
    if any(d < -1 for d in given):
        ctx.fail(f"SliceGrad shape {list(given)} has a negative dim", None, "sizes >= 0 or -1", list(given))
    starts = ctx.attr("starts")
    axes = ctx.attr("axes") or tuple(range(len(starts)))
    sliced = {norm_axis(ctx, a, dy.rank, "SliceGrad axis") for a in axes}
    if any(given[a] == -1 for a in sliced):
        ctx.fail(
            f"SliceGrad shape {list(given)} has -1 at a sliced axis",
            None,
            "sizes at sliced axes",
            list(given),
        )
    shape = _slice_grad_shape(dy.shape, given)
    sl = slices(ctx, shape, ctx.attrs)
    want = tuple(len(range(*s.indices(d))) for s, d in zip(sl, shape, strict=True))
    if dy.shape != want:
        ctx.fail(
            f"SliceGrad: dY has shape {dy.shape} but the slice of {shape} has shape {want}",
            0,
            want,
            dy.shape,
        )
    return (ctx.out(dy.dtype, shape),)


def _slice_grad_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    dy = np.asarray(args[0])
    given: Any = attrs["shape"]
    shape = _slice_grad_shape(dy.shape, given)
    out = np.zeros(shape, dtype=dy.dtype)
    out[tuple(slices(None, shape, attrs))] = dy
    return (out,)


def _slice_grad_sharding(
    ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int
) -> list[sh.Strategy]:
    """A dim that is not sliced may be sharded (dY and the result alike) when ``shape`` says -1
    there (the attribute holds global sizes; -1 takes the piece's own); linear in dY."""
    given: Any = attrs.get("shape", ())
    found = [sh.replicated(ins, outs), sh.Strategy((sh.SUM,), (sh.SUM,))]
    for s in slice_sharding(ins, outs, attrs, n)[1:]:
        (p,) = s.ins
        if isinstance(p, Shard) and given[p.dim] == -1:
            found.append(s)
    return found


SLICE_GRAD = register(
    OpDef(
        name="SliceGrad",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("dY",),
        outputs=("dData",),
        infer=_slice_grad_rule,
        attrs={"shape": AttrSpec("ints"), **SLICE_ATTRS},
        reference=_slice_grad_ref,
        doc="The gradient of Slice(data; starts, ends, axes, steps) w.r.t. data of the given shape "
        "(-1: a dim that is not sliced, of dY's size; only such dims may be sharded): dY placed "
        "into zeros at the slice.",
        sharding=_slice_grad_sharding,
    )
)


# -- torch implementations (contract: distir.ops._torch) ----------------------------------------
def _gather_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """dY index-added into zeros along the axis (repeated indices accumulate)."""
    dy, idx = xs[0], xs[1]
    ax = int_attr(attrs, "axis", 0) % (dy.dim() - idx.dim() + 1)
    size = int_attr(attrs, "size", 0)
    post = tuple(dy.shape[ax + idx.dim() :])
    out = ctx.torch.zeros((*dy.shape[:ax], size, *post), dtype=dy.dtype, device=dy.device)
    if not size:
        return (out,)
    i, mask = _torch.local_rows(ctx, idx, attrs.get("rows"), size)
    if mask is not None:  # rows another piece of the table holds: nothing to add here
        dy = dy * mask.reshape((1,) * ax + tuple(mask.shape) + (1,) * len(post)).to(dy.dtype)
    flat = dy.reshape((*dy.shape[:ax], i.numel(), *post))
    out = out.index_add(ax, i.reshape(-1), flat)
    row = padding_row(attrs, size)
    if row is not None:
        out.select(ax, row).zero_()
    return (out,)


def _slice_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    dy = xs[0]
    given: Any = attrs["shape"]
    shape = _slice_grad_shape(tuple(dy.shape), given)
    index, flip = forward_slices(shape, attrs)
    out = ctx.torch.zeros(shape, dtype=dy.dtype, device=dy.device)
    out[index] = dy.flip(flip) if flip else dy
    return (out,)


GATHER_GRAD.fill("torch", _gather_grad_torch)
SLICE_GRAD.fill("torch", _slice_grad_torch)
