"""Ops that rearrange a tensor's elements without selecting or joining any (family ``shape``, ONNX
names; torch's views): Reshape, Expand, Unsqueeze, Squeeze, Transpose.

Each gradient rule moves the cotangent back the way the op moved the data: the inverse
permutation, a reshape to the input's shape, a sum over the broadcast dims for Expand. Integer
tensors (indices, shapes) get no gradient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from distir.ir.dtensor import Shard, split_sizes
from distir.ir.ops import Op
from distir.ir.types import TensorType, Type
from distir.ir.values import Attrs, Value
from distir.ops import sharding as sh
from distir.ops._rules import norm_axis, numel
from distir.ops.gradrules import GradCtx, first, is_float, reshape, unbroadcast
from distir.ops.registry import AttrSpec, OpDef, TypeCtx, register
from distir.ops.shape.family import FAMILY, copy_bytes

if TYPE_CHECKING:
    from distir.backend.context import TorchContext

Grads = Sequence[Value | None]


# -- Reshape ----------------------------------------------------------------------------------
def _reshape_target(
    ctx: TypeCtx, in_shape: tuple[int, ...], spec: np.ndarray, allowzero: bool, where: int | None
) -> tuple[int, ...]:
    """The target shape of ``in_shape`` reshaped by ``spec`` (0 copies, -1 is inferred); errors
    name ``where`` (the shape input's index, or None for the ``shape`` attribute)."""
    dims = [int(x) for x in np.asarray(spec).reshape(-1)]
    out = []
    infer_at = None
    for i, d in enumerate(dims):
        if d == 0 and not allowzero:
            if i >= len(in_shape):
                ctx.fail(f"Reshape dim {i} is 0 (copy) but the input has rank {len(in_shape)}", where)
            out.append(in_shape[i])
        elif d == -1:
            if infer_at is not None:
                ctx.fail("Reshape shape has more than one -1", where, "at most one -1", dims)
            infer_at = i
            out.append(1)
        elif d < 0:
            ctx.fail(f"Reshape dim {d} is invalid", where, "-1, 0 or a positive size", d)
        else:
            out.append(d)
    total = math.prod(in_shape)
    if infer_at is not None:
        rest = math.prod(out)
        if rest == 0 or total % rest:
            ctx.fail(f"cannot reshape {in_shape} to {dims}", where, f"sizes dividing {total}", dims)
        out[infer_at] = total // rest
    if math.prod(out) != total:
        ctx.fail(
            f"cannot reshape {in_shape} ({total} elements) to {tuple(out)}", where, total, math.prod(out)
        )
    return tuple(out)


def _reshape_rule(ctx: TypeCtx) -> Sequence[Type]:
    data = ctx.tensor(0)
    attr = ctx.attr("shape")
    allowzero = bool(ctx.attr("allowzero"))
    if len(ctx.types) == 2:
        if attr is not None:
            ctx.fail(
                "Reshape takes its target shape either as the shape input or as the shape attribute, "
                "not both",
                1,
                "one of them",
                "both",
            )
        shp = ctx.tensor(1)
        if not shp.dtype.is_int or shp.rank != 1:
            ctx.fail("Reshape's shape must be a 1-d integer tensor", 1, "Tensor[i64, (n,)]", shp)
        target = _reshape_target(ctx, data.shape, ctx.const(1, "the target shape"), allowzero, 1)
    elif attr is None:
        ctx.fail("Reshape needs a target shape: the shape input or the shape attribute", None, "one", "none")
    else:
        target = _reshape_target(ctx, data.shape, np.asarray(attr, dtype=np.int64), allowzero, None)
    return (ctx.out(data.dtype, target),)


def _reshape_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    data = np.asarray(args[0])
    given: Any = attrs.get("shape")
    spec = [int(x) for x in np.asarray(given if given is not None else args[1]).reshape(-1)]
    if not attrs.get("allowzero", 0):
        spec = [data.shape[i] if d == 0 else d for i, d in enumerate(spec)]
    return (data.reshape(spec),)


RESHAPE = register(
    OpDef(
        name="Reshape",
        family=FAMILY,
        inputs=("data", "shape?"),
        outputs=("reshaped",),
        attrs={"allowzero": AttrSpec("int", 0, (0, 1)), "shape": AttrSpec("ints", None)},
        infer=_reshape_rule,
        reference=_reshape_ref,
        bytes_read=lambda ins, outs, attrs: 0.0,
        bytes_written=lambda ins, outs, attrs: 0.0,
        doc="ONNX Reshape: the target shape is the shape input (a concrete 1-d int tensor) or the "
        "shape attribute (ONNX Reshape-1), exactly one of them; 0 copies the input dim (a literal "
        "0 with allowzero=1), -1 is inferred.",
        sharding=sh.reshape,
    )
)


# -- Expand -----------------------------------------------------------------------------------
def _expand_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = ctx.tensor(0)
    shape = tuple(ctx.attr("shape"))
    if any(d < 0 for d in shape):
        ctx.fail(f"Expand shape {list(shape)} has a negative dim", None, "sizes >= 0", list(shape))
    rank = max(t.rank, len(shape))
    xs, ts = (1,) * (rank - t.rank) + t.shape, (1,) * (rank - len(shape)) + shape
    out = []
    for k, (a, b) in enumerate(zip(xs, ts, strict=True)):
        if a != b and 1 not in (a, b):
            ctx.fail(
                f"Expand: input of shape {t.shape} does not broadcast to {list(shape)} (dim {k}: {a} vs {b})",
                0,
                list(shape),
                t.shape,
            )
        out.append(b if a == 1 else a)
    return (ctx.out(t.dtype, out),)


def _expand_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[0])
    target: Any = attrs["shape"]
    out = np.broadcast_shapes(x.shape, tuple(target))
    return (np.array(np.broadcast_to(x, out)),)


def _expand_sharding(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[sh.Strategy]:
    """A dim the input keeps (not broadcast) may be sharded when ``shape`` says 1 there (or does
    not reach it): the attribute holds global sizes, and a 1 keeps whatever local size the piece
    has. Expand is linear, so a pending sum passes through."""
    x = ins[0].shape if isinstance(ins[0], TensorType) else ()
    y = outs[0].shape if isinstance(outs[0], TensorType) else ()
    target: Any = attrs.get("shape", ())
    found = [sh.replicated(ins, outs), sh.Strategy((sh.SUM,), (sh.SUM,))]
    for d in range(len(y)):
        k, j = d - (len(y) - len(x)), d - (len(y) - len(target))
        if k >= 0 and x[k] == y[d] > 1 and (j < 0 or target[j] == 1):
            found.append(sh.Strategy((Shard(k),), (Shard(d),)))
    return found


EXPAND = register(
    OpDef(
        name="Expand",
        family=FAMILY,
        inputs=("input",),
        outputs=("output",),
        infer=_expand_rule,
        attrs={"shape": AttrSpec("ints")},
        reference=_expand_ref,
        doc="ONNX Expand with the shape as an attribute: the result has the numpy broadcast of the "
        "input's shape and shape (a 1 in shape keeps the input's dim, and only such dims may be "
        "sharded).",
        sharding=_expand_sharding,
    )
)


# -- Unsqueeze / Squeeze ----------------------------------------------------------------------
def _unsqueeze_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = ctx.tensor(0)
    axes = ctx.attr("axes")
    r = t.rank + len(axes)
    norm = sorted(norm_axis(ctx, a, r, "Unsqueeze axis") for a in axes)
    if len(set(norm)) != len(norm):
        ctx.fail("Unsqueeze axes repeat", None, "distinct axes", axes)
    shape = list(t.shape)
    for a in norm:
        shape.insert(a, 1)
    return (ctx.out(t.dtype, shape),)


def _unsqueeze_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[0])
    axes: Any = attrs["axes"]
    r = x.ndim + len(axes)
    for a in sorted(a % r for a in axes):
        x = np.expand_dims(x, a)
    return (x,)


UNSQUEEZE = register(
    OpDef(
        name="Unsqueeze",
        family=FAMILY,
        inputs=("data",),
        outputs=("expanded",),
        infer=_unsqueeze_rule,
        attrs={"axes": AttrSpec("ints")},
        reference=_unsqueeze_ref,
        bytes_read=lambda ins, outs, attrs: 0.0,
        bytes_written=lambda ins, outs, attrs: 0.0,
        sharding=sh.reshape,
    )
)


def _squeeze_axes(ctx: TypeCtx) -> list[int]:
    t = ctx.tensor(0)
    axes = ctx.attr("axes")
    if axes is None:
        return [i for i, d in enumerate(t.shape) if d == 1]
    norm = [norm_axis(ctx, a, t.rank, "Squeeze axis") for a in axes]
    for a in norm:
        if t.shape[a] != 1:
            ctx.fail(f"Squeeze axis {a} has size {t.shape[a]}", 0, 1, t.shape[a])
    return norm


def _squeeze_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = ctx.tensor(0)
    axes = set(_squeeze_axes(ctx))
    return (ctx.out(t.dtype, [d for i, d in enumerate(t.shape) if i not in axes]),)


def _squeeze_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[0])
    axes: Any = attrs.get("axes")
    if axes is None:
        return (np.squeeze(x),)
    return (np.squeeze(x, axis=tuple(a % x.ndim for a in axes)),)


SQUEEZE = register(
    OpDef(
        name="Squeeze",
        family=FAMILY,
        inputs=("data",),
        outputs=("squeezed",),
        infer=_squeeze_rule,
        attrs={"axes": AttrSpec("ints", None)},
        reference=_squeeze_ref,
        bytes_read=lambda ins, outs, attrs: 0.0,
        bytes_written=lambda ins, outs, attrs: 0.0,
        sharding=sh.reshape,
    )
)


# -- Transpose --------------------------------------------------------------------------------
def _perm(ctx: TypeCtx, rank: int) -> list[int]:
    perm = ctx.attr("perm")
    if perm is None:
        return list(range(rank))[::-1]
    if sorted(perm) != list(range(rank)):
        ctx.fail(
            f"Transpose perm {list(perm)} is not a permutation of 0..{rank - 1}",
            None,
            f"a permutation of {rank} axes",
            list(perm),
        )
    return list(perm)


def _transpose_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = ctx.tensor(0)
    return (ctx.out(t.dtype, [t.shape[p] for p in _perm(ctx, t.rank)]),)


TRANSPOSE = register(
    OpDef(
        name="Transpose",
        family=FAMILY,
        inputs=("data",),
        outputs=("transposed",),
        infer=_transpose_rule,
        attrs={"perm": AttrSpec("ints", None)},
        reference=lambda args, attrs: (np.ascontiguousarray(np.transpose(args[0], attrs.get("perm"))),),  # type: ignore[arg-type]
        bytes_read=copy_bytes,
        sharding=sh.transpose,
    )
)


__all__ = ["copy_bytes", "numel", "split_sizes"]


# -- gradient rules (contract: distir.ops.gradrules) ------------------------------------------
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


def _expand_grad(ctx: GradCtx, op: Op, douts: Grads) -> Grads:
    x = ctx.type(op.inputs[0])
    if not x.dtype.is_float:
        return [None]
    return [unbroadcast(ctx, first(douts), x.shape, ctx.type(op.outputs[0]).shape)]


# -- torch implementations (contract: distir.ops._torch) ----------------------------------------
def _reshape_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """The target shape is an attribute or a concrete (host-read) shape input."""
    x = xs[0]
    given: Any = attrs.get("shape")
    spec: list[int] = list(given) if given is not None else xs[1].reshape(-1).tolist()
    if not attrs.get("allowzero", 0):
        spec = [x.shape[i] if d == 0 else d for i, d in enumerate(spec)]
    return (x.reshape(spec),)


def _expand_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    target: Any = attrs["shape"]
    return (xs[0].expand(np.broadcast_shapes(tuple(xs[0].shape), tuple(target))),)


def _unsqueeze_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    x, axes = xs[0], attrs["axes"]
    assert isinstance(axes, tuple)
    r = x.dim() + len(axes)
    for a in sorted(int(a) % r for a in axes if isinstance(a, int)):
        x = x.unsqueeze(a)
    return (x,)


def _squeeze_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    x, axes = xs[0], attrs.get("axes")
    if not isinstance(axes, tuple):
        return (x.squeeze(),)
    return (x.squeeze(tuple(a % x.dim() for a in axes if isinstance(a, int))) if axes else x,)


def _transpose_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    perm: Any = attrs.get("perm")
    x = xs[0]
    return (x.permute(tuple(perm) if perm is not None else tuple(reversed(range(x.dim())))),)


TRANSPOSE.fill("grad", _transpose_grad)
RESHAPE.fill("grad", _reshape_grad)
UNSQUEEZE.fill("grad", _unsqueeze_grad)
SQUEEZE.fill("grad", _squeeze_grad)
EXPAND.fill("grad", _expand_grad)
RESHAPE.fill("torch", _reshape_torch)
EXPAND.fill("torch", _expand_torch)
UNSQUEEZE.fill("torch", _unsqueeze_torch)
SQUEEZE.fill("torch", _squeeze_torch)
TRANSPOSE.fill("torch", _transpose_torch)
