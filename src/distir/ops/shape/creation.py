"""Ops that make a tensor from a type, attributes or scalars (family ``shape``, ONNX names): Shape,
Constant, Range, ConstantOfShape.

``Shape`` and ``Constant`` have partial evaluators: their results are concrete from types and
attributes alone, which is what lets mixed abstract/concrete interpretation compute shapes of
dynamic reshapes (the paper's Figure 4). None of them has a gradient (their results are integer
or constant).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from distir.ir.types import DType, Type
from distir.ir.values import Attrs, Value
from distir.ops.registry import AttrSpec, OpDef, TypeCtx, register
from distir.ops.shape.family import COST_CLASS, FAMILY

if TYPE_CHECKING:
    from distir.backend.context import TorchContext

Grads = Sequence[Value | None]


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
        with np.errstate(over="ignore"):  # a float past the dtype's range rounds to ±inf, as a cast does
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
    with np.errstate(over="ignore"):  # as the rule: past the dtype's range, ±inf
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


# -- torch implementations (contract: distir.ops._torch) ----------------------------------------
def _shape_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    return (ctx.torch.tensor(tuple(xs[0].shape), dtype=ctx.torch.int64, device=ctx.device),)


def _constant_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """The reference's array on the device, in the constant's dtype (bf16 as bf16)."""
    (arr,) = _constant_ref(xs, attrs)
    dt = attrs.get("dtype")
    t = ctx.torch.from_numpy(np.array(arr, copy=True)).to(ctx.device)
    return (t.to(ctx.dtype(dt)) if isinstance(dt, DType) else t,)


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
