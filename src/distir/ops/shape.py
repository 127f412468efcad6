"""Shape and data-movement ops (ONNX names): Shape, Constant, Gather, Concat, Reshape, Unsqueeze,
Squeeze, Transpose, Split, Slice.

``Shape`` and ``Constant`` have partial evaluators: their results are concrete from types and
attributes alone, which is what lets mixed abstract/concrete interpretation compute shapes of
dynamic reshapes (the paper's Figure 4).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from distir.ir.dtensor import Shard, split_sizes
from distir.ir.types import DType, TensorType, Type
from distir.ir.values import Attrs
from distir.ops import sharding as sh
from distir.ops._rules import int_attr, norm_axis, numel
from distir.ops.registry import AttrSpec, OpDef, TypeCtx, register

FAMILY = "shape"


def _copy_bytes(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    """Data movement ops read what they write."""
    return float(sum(t.nbytes for t in outs))


# -- Shape ------------------------------------------------------------------------------------
def _shape_rule(ctx: TypeCtx) -> Sequence[Type]:
    return (ctx.out(DType.i64, (ctx.tensor(0).rank,)),)


SHAPE = register(
    OpDef(
        name="Shape",
        family=FAMILY,
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


# -- Gather -----------------------------------------------------------------------------------
def _gather_rule(ctx: TypeCtx) -> Sequence[Type]:
    data, idx = ctx.tensor(0), ctx.tensor(1)
    if not idx.dtype.is_int:
        ctx.fail("Gather indices must be integers", 1, "an int dtype", idx.dtype)
    if data.rank == 0:
        ctx.fail("Gather data must have rank >= 1", 0, "rank >= 1", 0)
    ax = norm_axis(ctx, ctx.attr("axis"), data.rank)
    known = ctx.known[1]
    if known is not None:
        n = data.shape[ax]
        if np.any((known < -n) | (known >= n)):
            ctx.fail(f"Gather index out of range for axis of size {n}", 1, f"-{n}..{n - 1}", known.tolist())
    return (ctx.out(data.dtype, data.shape[:ax] + idx.shape + data.shape[ax + 1 :]),)


GATHER = register(
    OpDef(
        name="Gather",
        family=FAMILY,
        inputs=("data", "indices"),
        outputs=("output",),
        infer=_gather_rule,
        attrs={"axis": AttrSpec("int", 0)},
        reference=lambda args, attrs: (
            np.take(args[0], np.asarray(args[1]), axis=int_attr(attrs, "axis", 0)),
        ),
        bytes_read=lambda ins, outs, attrs: float(outs[0].nbytes + ins[1].nbytes),
        doc="ONNX Gather: take slices of data along axis (an embedding lookup when axis=0).",
        sharding=sh.embedding,
    )
)


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
        inputs=("*inputs",),
        outputs=("concat_result",),
        infer=_concat_rule,
        attrs={"axis": AttrSpec("int")},
        reference=lambda args, attrs: (
            np.concatenate([np.asarray(a) for a in args], axis=int_attr(attrs, "axis", 0)),
        ),
        bytes_read=_copy_bytes,
        sharding=sh.other_dims("axis"),
    )
)


# -- Reshape ----------------------------------------------------------------------------------
def _reshape_target(
    ctx: TypeCtx, in_shape: tuple[int, ...], spec: np.ndarray, allowzero: bool = False
) -> tuple[int, ...]:
    dims = [int(x) for x in np.asarray(spec).reshape(-1)]
    out = []
    infer_at = None
    for i, d in enumerate(dims):
        if d == 0 and not allowzero:
            if i >= len(in_shape):
                ctx.fail(f"Reshape dim {i} is 0 (copy) but the input has rank {len(in_shape)}", 1)
            out.append(in_shape[i])
        elif d == -1:
            if infer_at is not None:
                ctx.fail("Reshape shape has more than one -1", 1, "at most one -1", dims)
            infer_at = i
            out.append(1)
        elif d < 0:
            ctx.fail(f"Reshape dim {d} is invalid", 1, "-1, 0 or a positive size", d)
        else:
            out.append(d)
    total = math.prod(in_shape)
    if infer_at is not None:
        rest = math.prod(out)
        if rest == 0 or total % rest:
            ctx.fail(f"cannot reshape {in_shape} to {dims}", 1, f"sizes dividing {total}", dims)
        out[infer_at] = total // rest
    if math.prod(out) != total:
        ctx.fail(f"cannot reshape {in_shape} ({total} elements) to {tuple(out)}", 1, total, math.prod(out))
    return tuple(out)


def _reshape_rule(ctx: TypeCtx) -> Sequence[Type]:
    data, shp = ctx.tensor(0), ctx.tensor(1)
    if not shp.dtype.is_int or shp.rank != 1:
        ctx.fail("Reshape's shape must be a 1-d integer tensor", 1, "Tensor[i64, (n,)]", shp)
    target = _reshape_target(ctx, data.shape, ctx.const(1, "the target shape"), bool(ctx.attr("allowzero")))
    return (ctx.out(data.dtype, target),)


def _reshape_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    data = np.asarray(args[0])
    spec = [int(x) for x in np.asarray(args[1]).reshape(-1)]
    if not attrs.get("allowzero", 0):
        spec = [data.shape[i] if d == 0 else d for i, d in enumerate(spec)]
    return (data.reshape(spec),)


RESHAPE = register(
    OpDef(
        name="Reshape",
        family=FAMILY,
        inputs=("data", "shape"),
        outputs=("reshaped",),
        attrs={"allowzero": AttrSpec("int", 0, (0, 1))},
        infer=_reshape_rule,
        reference=_reshape_ref,
        bytes_read=lambda ins, outs, attrs: 0.0,
        bytes_written=lambda ins, outs, attrs: 0.0,
        doc="ONNX Reshape: 0 copies the input dim (a literal 0 with allowzero=1), -1 is inferred. "
        "Needs a concrete shape input.",
        sharding=sh.reshape,
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
        bytes_read=_copy_bytes,
        sharding=sh.transpose,
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


SPLIT = register(
    OpDef(
        name="Split",
        family=FAMILY,
        inputs=("input",),
        outputs=_split_count,
        infer=_split_rule,
        attrs={"dim": AttrSpec("int", 0), "num_splits": AttrSpec("int", 2), "sizes": AttrSpec("ints", None)},
        reference=_split_ref,
        bytes_read=_copy_bytes,
        doc="Split along dim into num_splits near-equal parts (first parts larger) or given sizes.",
        sharding=sh.other_dims("dim"),
    )
)


# -- Slice ------------------------------------------------------------------------------------
def _slices(ctx_or_none: TypeCtx | None, shape: tuple[int, ...], attrs: Attrs) -> list[slice]:
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


def _slice_sharding(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[sh.Strategy]:
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
    sl = _slices(ctx, t.shape, ctx.attrs)
    shape = [len(range(*s.indices(d))) for s, d in zip(sl, t.shape, strict=True)]
    return (ctx.out(t.dtype, shape),)


SLICE = register(
    OpDef(
        name="Slice",
        family=FAMILY,
        inputs=("data",),
        outputs=("output",),
        infer=_slice_rule,
        attrs={
            "starts": AttrSpec("ints"),
            "ends": AttrSpec("ints"),
            "axes": AttrSpec("ints", None),
            "steps": AttrSpec("ints", None),
        },
        reference=lambda args, attrs: (
            np.array(np.asarray(args[0])[tuple(_slices(None, np.shape(args[0]), attrs))]),
        ),
        bytes_read=_copy_bytes,
        doc="ONNX Slice with starts/ends/axes/steps as attributes (Python slice semantics).",
        sharding=_slice_sharding,
    )
)

__all__ = ["numel", "split_sizes"]
