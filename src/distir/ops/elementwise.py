"""Elementwise tensor ops (ONNX names): arithmetic with numpy broadcasting, activations, Where,
Cast, Identity, and the variadic Sum.

Each op is one ``OpDef``: signature, shape rule, numpy reference, FLOPs per output element.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from distir.ir.types import DType, Type
from distir.ir.values import Attrs
from distir.ops._rules import broadcast_shapes, numel, out_numel_flops, same_dtype
from distir.ops._special import normal_cdf
from distir.ops.registry import AttrSpec, OpDef, TypeCtx, register
from distir.ops.sharding import ShardingRule, mul_rule, pointwise

FAMILY = "elementwise"


def _broadcast_rule(ctx: TypeCtx) -> Sequence[Type]:
    n = len(ctx.types)
    same_dtype(ctx, list(range(n)))
    shape = broadcast_shapes(ctx, [ctx.tensor(i).shape for i in range(n)])
    return (ctx.out(ctx.tensor(0).dtype, shape),)


def _unary_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = ctx.tensor(0)
    return (ctx.out(t.dtype, t.shape),)


def _float_unary_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = ctx.tensor(0)
    if not t.dtype.is_float:
        ctx.fail(f"{ctx.op.name} needs a floating-point input", 0, "a float dtype", t.dtype)
    return (ctx.out(t.dtype, t.shape),)


def _keep_dtype(f: Callable[..., Any]) -> Callable[[Sequence[Any], Attrs], Sequence[Any]]:
    """Wrap a numpy function so the result keeps the first input's dtype."""

    def ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
        arrs = [np.asarray(a) for a in args]
        return (np.asarray(f(*arrs)).astype(arrs[0].dtype, copy=False),)

    return ref


def _binary(
    name: str, fn: Callable[..., Any], flops: float = 1.0, doc: str = "", sharding: ShardingRule | None = None
) -> OpDef:
    return register(
        OpDef(
            name=name,
            family=FAMILY,
            inputs=("A", "B"),
            outputs=("C",),
            infer=_broadcast_rule,
            reference=_keep_dtype(fn),
            flops=out_numel_flops(flops),
            doc=doc,
            sharding=sharding if sharding is not None else pointwise(),
        )
    )


def _unary(
    name: str, fn: Callable[..., Any], flops: float, float_only: bool = True, linear: bool = False
) -> OpDef:
    return register(
        OpDef(
            name=name,
            family=FAMILY,
            inputs=("X",),
            outputs=("Y",),
            infer=_float_unary_rule if float_only else _unary_rule,
            reference=_keep_dtype(fn),
            flops=out_numel_flops(flops),
            sharding=pointwise("linear" if linear else "none"),
        )
    )


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        return np.asarray(np.trunc(np.true_divide(a, b))).astype(a.dtype)  # ONNX: toward zero
    return np.asarray(np.divide(a, b))


ADD = _binary("Add", np.add, doc="C = A + B, numpy broadcasting", sharding=pointwise("linear"))
SUB = _binary("Sub", np.subtract, sharding=pointwise("linear"))
MUL = _binary("Mul", np.multiply, sharding=mul_rule())
DIV = _binary("Div", _int_div, sharding=pointwise("scale"))
POW = _binary("Pow", np.power, flops=4.0)


def _gelu(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU, the ONNX default: x·Φ(x), computed in float64 then cast back."""
    return x.astype(np.float64) * normal_cdf(x)


SQRT = _unary("Sqrt", np.sqrt, 1.0)
NEG = _unary("Neg", np.negative, 1.0, float_only=False, linear=True)
EXP = _unary("Exp", np.exp, 1.0)
RELU = _unary("Relu", lambda x: np.maximum(x, 0), 1.0, float_only=False)
GELU = _unary("Gelu", _gelu, 8.0)
TANH = _unary("Tanh", np.tanh, 4.0)
SIGMOID = _unary("Sigmoid", lambda x: 1.0 / (1.0 + np.exp(-x)), 4.0)
IDENTITY = register(
    OpDef(
        name="Identity",
        family=FAMILY,
        inputs=("X",),
        outputs=("Y",),
        infer=_unary_rule,
        reference=lambda args, attrs: (np.array(args[0], copy=True),),
        sharding=pointwise("linear"),
    )
)


def _sum_rule(ctx: TypeCtx) -> Sequence[Type]:
    return _broadcast_rule(ctx)


def _sum_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    acc = np.array(args[0], copy=True)
    for a in args[1:]:
        acc = acc + a
    return (acc.astype(np.asarray(args[0]).dtype, copy=False),)


SUM = register(
    OpDef(
        name="Sum",
        family=FAMILY,
        inputs=("*data",),
        outputs=("sum",),
        infer=_sum_rule,
        reference=_sum_ref,
        flops=lambda ins, outs, attrs: float(max(len(ins) - 1, 0) * numel(outs[0])),
        doc="Elementwise sum of any number of inputs (ONNX Sum).",
        sharding=pointwise("linear"),
    )
)


def _where_rule(ctx: TypeCtx) -> Sequence[Type]:
    c = ctx.tensor(0)
    if c.dtype is not DType.bool:
        ctx.fail("Where's condition must be bool", 0, DType.bool, c.dtype)
    same_dtype(ctx, [1, 2])
    shape = broadcast_shapes(ctx, [ctx.tensor(i).shape for i in range(3)])
    return (ctx.out(ctx.tensor(1).dtype, shape),)


def _where_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    c, x, y = (np.asarray(a) for a in args)
    return (np.asarray(np.where(c, x, y)).astype(x.dtype, copy=False),)


WHERE = register(
    OpDef(
        name="Where",
        family=FAMILY,
        inputs=("condition", "X", "Y"),
        outputs=("output",),
        infer=_where_rule,
        reference=_where_ref,
        flops=out_numel_flops(1.0),
        sharding=pointwise(),
    )
)


def _cast_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = ctx.tensor(0)
    to = ctx.attr("to")
    if not isinstance(to, DType):
        known = ", ".join(d.value for d in DType)
        ctx.fail(f"Cast to unknown dtype {to!r}; known dtypes: {known}", None, "a DType", to)
    return (ctx.out(to, t.shape),)


CAST = register(
    OpDef(
        name="Cast",
        family=FAMILY,
        inputs=("input",),
        outputs=("output",),
        infer=_cast_rule,
        attrs={"to": AttrSpec("dtype")},
        reference=lambda args, attrs: (np.asarray(args[0]).astype(attrs["to"].to_numpy()),),  # type: ignore[union-attr]
        sharding=pointwise(),
    )
)
