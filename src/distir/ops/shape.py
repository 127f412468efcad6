"""Shape and data-movement ops (ONNX names): Shape, Constant, Range, ConstantOfShape, Reshape,
Expand, Unsqueeze, Squeeze, Transpose (Gather, Concat, Split, Slice and Trilu, of the same family,
are in ``distir.ops.shape_index``).

``Shape`` and ``Constant`` have partial evaluators: their results are concrete from types and
attributes alone, which is what lets mixed abstract/concrete interpretation compute shapes of
dynamic reshapes (the paper's Figure 4).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from distir.ir.dtensor import Shard, split_sizes
from distir.ir.types import DType, TensorType, Type
from distir.ir.values import Attrs
from distir.ops import sharding as sh
from distir.ops._rules import norm_axis, numel
from distir.ops.registry import AttrSpec, CostClass, OpDef, TypeCtx, register

if TYPE_CHECKING:
    from distir.backend.context import TorchContext

FAMILY = "shape"
COST_CLASS = CostClass.SHAPE  # how the family's ops are costed


def copy_bytes(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    """Data movement ops read what they write."""
    return float(sum(t.nbytes for t in outs))


# -- Shape ------------------------------------------------------------------------------------
def _shape_rule(ctx: TypeCtx) -> Sequence[Type]:
    return (ctx.out(DType.i64, (ctx.tensor(0).rank,)),)


SHAPE = register(
    OpDef(
        name="Shape",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("data",),
        outputs=("shape",),
        infer=_shape_rule,
        partial=lambda ctx: (np.array(ctx.tensor(0).shape, dtype=np.int64),),
        reference=lambda args, attrs: (np.array(np.shape(args[0]), dtype=np.int64),),
        bytes_read=lambda ins, outs, attrs: 0.0,
    )
)


# -- Constant ---------------------------------------------------------------------------------
def _default_dtype(value: object) -> DType:
    kind = np.array(value).dtype.kind
    return DType.f32 if kind == "f" else DType.bool if kind == "b" else DType.i64


def _const_array(ctx: TypeCtx) -> np.ndarray:
    value = ctx.attr("value")
    dt = ctx.attr("dtype")
    if dt is None:
        dt = _default_dtype(value)
    try:
        arr = np.array(value, dtype=dt.to_numpy())
    except (ValueError, OverflowError):
        ctx.fail(
            "Constant value is not a rectangular array of numbers",
            None,
            "nested lists of equal length",
            value,
        )
    if arr.dtype == object:  # pragma: no cover - numpy raises above for ragged input
        ctx.fail("Constant value is not a rectangular array")
    return arr


def _constant_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    """The same array the rule types: the dtype attribute, else i64 / f32 / bool by value."""
    value = attrs["value"]
    dt = attrs.get("dtype")
    if not isinstance(dt, DType):
        dt = _default_dtype(value)
    return (np.array(value, dtype=dt.to_numpy()),)


def _constant_rule(ctx: TypeCtx) -> Sequence[Type]:
    arr = _const_array(ctx)
    dt = ctx.attr("dtype")
    if dt is None:
        dt = DType.from_numpy(arr.dtype)
    return (ctx.out(dt, arr.shape),)


CONSTANT = register(
    OpDef(
        name="Constant",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=(),
        outputs=("output",),
        infer=_constant_rule,
        attrs={"value": AttrSpec("tensor"), "dtype": AttrSpec("dtype", None), "device": AttrSpec("device")},
        partial=lambda ctx: (_const_array(ctx),),
        reference=_constant_ref,
        bytes_read=lambda ins, outs, attrs: 0.0,
        doc="A literal tensor on a device; dtype defaults to i64 for ints and f32 for floats.",
    )
)


# -- Range / ConstantOfShape ------------------------------------------------------------------
def _range_count(ctx: TypeCtx) -> int:
    start, limit, delta = (ctx.const(i, w).item() for i, w in enumerate(("start", "limit", "delta")))
    if delta == 0:
        ctx.fail("Range delta must not be 0", 2, "non-zero", 0)
    return max(math.ceil(float(limit - start) / float(delta)), 0)


def _range_rule(ctx: TypeCtx) -> Sequence[Type]:
    ts = [ctx.tensor(i) for i in range(3)]
    for i, t in enumerate(ts):
        if t.rank != 0 or t.dtype is not ts[0].dtype:
            ctx.fail(
                f"Range's inputs must be scalars of one dtype (input {i + 1})",
                i,
                f"Tensor[{ts[0].dtype}, ()]",
                t,
            )
    return (ctx.out(ts[0].dtype, (_range_count(ctx),)),)


def _range_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    start, limit, delta = (np.asarray(a) for a in args)
    n = max(math.ceil((limit.item() - start.item()) / delta.item()), 0)
    return ((start + delta * np.arange(n)).astype(start.dtype),)


RANGE = register(
    OpDef(
        name="Range",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("start", "limit", "delta"),
        outputs=("output",),
        infer=_range_rule,
        reference=_range_ref,
        bytes_read=lambda ins, outs, attrs: 0.0,
        doc="ONNX Range: start, start + delta, ... up to (excluding) limit; the three scalar inputs "
        "must be known (constants or shape subgraphs) so the length is.",
    )
)


def _constant_of_shape_rule(ctx: TypeCtx) -> Sequence[Type]:
    shp = ctx.tensor(0)
    if not shp.dtype.is_int or shp.rank != 1:
        ctx.fail("ConstantOfShape's shape must be a 1-d integer tensor", 0, "Tensor[i64, (n,)]", shp)
    dims = [int(d) for d in ctx.const(0, "the shape")]
    if any(d < 0 for d in dims):
        ctx.fail(f"ConstantOfShape shape {dims} has a negative dim", 0, "sizes >= 0", dims)
    return (ctx.out(ctx.attr("dtype"), dims),)


def _constant_of_shape_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    dt = attrs.get("dtype", DType.f32)
    assert isinstance(dt, DType)
    shape = tuple(int(d) for d in np.asarray(args[0]))
    return (np.full(shape, attrs.get("value", 0.0), dtype=dt.to_numpy()),)


CONSTANT_OF_SHAPE = register(
    OpDef(
        name="ConstantOfShape",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("shape",),
        outputs=("output",),
        infer=_constant_of_shape_rule,
        attrs={"value": AttrSpec("float", 0.0), "dtype": AttrSpec("dtype", DType.f32)},
        reference=_constant_of_shape_ref,
        bytes_read=lambda ins, outs, attrs: 0.0,
        doc="ONNX ConstantOfShape: a tensor of the (known) shape input filled with value, cast to dtype.",
    )
)


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
        cost_class=COST_CLASS,
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
        cost_class=COST_CLASS,
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
        cost_class=COST_CLASS,
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
        cost_class=COST_CLASS,
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
        cost_class=COST_CLASS,
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


# -- torch implementations (contract: distir.ops._torch) ----------------------------------------
def _shape_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    return (ctx.torch.tensor(tuple(xs[0].shape), dtype=ctx.torch.int64, device=ctx.device),)


def _constant_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """The reference's array on the device, in the constant's dtype (bf16 as bf16)."""
    (arr,) = _constant_ref(xs, attrs)
    dt = attrs.get("dtype")
    t = ctx.torch.from_numpy(np.array(arr, copy=True)).to(ctx.device)
    return (t.to(ctx.dtype(dt)) if isinstance(dt, DType) else t,)


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


def _range_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    start, limit, delta = (x.item() for x in xs)
    n = max(math.ceil((limit - start) / delta), 0)
    steps = ctx.torch.arange(n, device=xs[0].device).to(xs[0].dtype)
    return (xs[0] + xs[2] * steps,)


def _constant_of_shape_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    dt = attrs.get("dtype", DType.f32)
    assert isinstance(dt, DType)
    shape = tuple(int(d) for d in xs[0].tolist())
    value: Any = attrs.get("value", 0.0)
    if dt.is_int:
        value = int(value)
    elif dt is DType.bool:
        value = value != 0.0
    return (ctx.torch.full(shape, value, dtype=ctx.dtype(dt), device=xs[0].device),)


SHAPE.fill("torch", _shape_torch)
RANGE.fill("torch", _range_torch)
CONSTANT_OF_SHAPE.fill("torch", _constant_of_shape_torch)
CONSTANT.fill("torch", _constant_torch)
RESHAPE.fill("torch", _reshape_torch)
EXPAND.fill("torch", _expand_torch)
UNSQUEEZE.fill("torch", _unsqueeze_torch)
SQUEEZE.fill("torch", _squeeze_torch)
TRANSPOSE.fill("torch", _transpose_torch)
