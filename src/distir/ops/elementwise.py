"""Elementwise tensor ops (ONNX names): arithmetic with numpy broadcasting (Max and Min too),
activations, Where, Cast, Identity, Log, and the variadic Sum; ``StopGradient`` (the identity, a constant for
autodiff); and two non-ONNX helpers that gradient rules build on
(they never need a constant on a device): ``Scale`` (alpha·X) and ``FillLike`` (a tensor of X's
type filled with a value).

Each op is one ``OpDef``: signature, shape rule, numpy reference, FLOPs per output element.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from distir.ir.dtensor import PARTIAL_OPS, Partial, Shard
from distir.ir.ops import Op
from distir.ir.types import DType, TensorType, Type
from distir.ir.values import Attrs, Value
from distir.ops._rules import broadcast_shapes, float_attr, numel, out_numel_flops, same_dtype
from distir.ops._special import gelu_tanh, normal_cdf
from distir.ops._torch import binary, unary
from distir.ops.gradrules import GradCtx, GradRule, first, is_float, unbroadcast, zeros_like
from distir.ops.registry import AttrSpec, CostClass, Fusion, Kink, OpDef, TypeCtx, register
from distir.ops.sharding import R, ShardingRule, Strategy, cast_rule, mul_rule, pointwise

if TYPE_CHECKING:
    from distir.backend.context import TorchContext

FAMILY = "elementwise"
COST_CLASS = CostClass.ELEMENTWISE  # how the family's ops are costed


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
            cost_class=COST_CLASS,
            fusion=Fusion.POINTWISE,
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
            cost_class=COST_CLASS,
            fusion=Fusion.POINTWISE,
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
MAX = _binary("Max", np.maximum, doc="C = max(A, B), numpy broadcasting (ONNX Max of two inputs)")
MIN = _binary("Min", np.minimum, doc="C = min(A, B), numpy broadcasting (ONNX Min of two inputs)")
MAX.fill("kink", Kink(0, 1))  # picks A or B by the sign of A - B
MIN.fill("kink", Kink(0, 1))


def _gelu(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU, the ONNX default: x·Φ(x), computed in float64 then cast back."""
    return x.astype(np.float64) * normal_cdf(x)


SQRT = _unary("Sqrt", np.sqrt, 1.0)
NEG = _unary("Neg", np.negative, 1.0, float_only=False, linear=True)
EXP = _unary("Exp", np.exp, 1.0)
RELU = _unary("Relu", lambda x: np.maximum(x, 0), 1.0, float_only=False)
RELU.fill("kink", Kink(0))
GELU = _unary("Gelu", _gelu, 8.0)
# the tanh approximation as one op: F.gelu(approximate="tanh"), GPT-2's gelu_new
GELU_TANH = _unary("GeluTanh", gelu_tanh, 8.0)
TANH = _unary("Tanh", np.tanh, 4.0)
SIGMOID = _unary("Sigmoid", lambda x: 1.0 / (1.0 + np.exp(-x)), 4.0)
# x·sigmoid(x) as one op: torch.nn.functional.silu, one kernel forward and one backward
SILU = _unary("Silu", lambda x: x / (1.0 + np.exp(-x)), 5.0)
# relu(x)² as one op: Megatron-Core's squared_relu (``torch.pow(F.relu(x), 2)`` under its
# ``jit_fuser``, torch.compile from PyTorch 2.2): one kernel forward, one backward, saving its
# input only (the backward is 2·relu(X)·dY)
SQUARED_RELU = _unary("SquaredRelu", lambda x: np.square(np.maximum(x, 0.0)), 2.0)
LOG = _unary("Log", np.log, 1.0)
RECIPROCAL = _unary("Reciprocal", np.reciprocal, 1.0)  # ONNX's, as exporters write RMSNorm's rsqrt
# the rotary embedding's tables (ONNX exports compute cos and sin of positions × frequencies)
SIN = _unary("Sin", np.sin, 4.0)
COS = _unary("Cos", np.cos, 4.0)
STOP_GRADIENT = register(
    OpDef(
        name="StopGradient",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("X",),
        outputs=("Y",),
        infer=_unary_rule,
        reference=lambda args, attrs: (np.array(args[0], copy=True),),
        bytes_read=lambda ins, outs, attrs: 0.0,
        bytes_written=lambda ins, outs, attrs: 0.0,  # a view (PyTorch's detach)
        doc="Y = X, through which no gradient flows (autodiff treats Y as a constant).",
        sharding=lambda ins, outs, attrs, n: [
            *pointwise("none")(ins, outs, attrs, n),
            *(Strategy((Partial(p),), (Partial(p),)) for p in PARTIAL_OPS),
        ],
    )
)
IDENTITY = register(
    OpDef(
        name="Identity",
        family=FAMILY,
        cost_class=COST_CLASS,
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
        cost_class=COST_CLASS,
        fusion=Fusion.POINTWISE,
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
        cost_class=COST_CLASS,
        fusion=Fusion.POINTWISE,
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


def round_to_bf16(x: Any) -> np.ndarray:
    """``x`` rounded to the nearest bf16 (ties to even), as the float32 array the reference
    executor holds bf16 in: the top 16 bits of the float32 pattern, rounded. NaN stays NaN,
    overflow goes to infinity."""
    x32 = np.array(x, dtype=np.float32)  # a contiguous copy, any rank (0-d too)
    bits = x32.view(np.uint32)
    up = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    r = ((bits + up) & np.uint32(0xFFFF0000)).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x32), x32, r)


def _cast_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x, to = np.asarray(args[0]), attrs["to"]
    assert isinstance(to, DType)
    if to is DType.bf16 and x.dtype.kind == "f":  # bf16 computes in float32, on the bf16 grid
        return (round_to_bf16(x),)
    return (x.astype(to.to_numpy()),)


CAST = register(
    OpDef(
        name="Cast",
        family=FAMILY,
        cost_class=COST_CLASS,
        fusion=Fusion.POINTWISE,
        inputs=("input",),
        outputs=("output",),
        infer=_cast_rule,
        attrs={"to": AttrSpec("dtype")},
        reference=_cast_ref,
        doc="Convert to dtype ``to``. The reference holds bf16 in float32 and rounds a cast to bf16 "
        "to the nearest bf16 (ties to even); casts to f16 round as numpy's float16 does.",
        sharding=cast_rule(),
    )
)


# -- Scale / FillLike -------------------------------------------------------------------------
def _scale_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[0])
    return ((float_attr(attrs, "alpha", 1.0) * x).astype(x.dtype, copy=False),)


SCALE = register(
    OpDef(
        name="Scale",
        family=FAMILY,
        cost_class=COST_CLASS,
        fusion=Fusion.POINTWISE,
        inputs=("X",),
        outputs=("Y",),
        infer=_float_unary_rule,
        attrs={"alpha": AttrSpec("float")},
        reference=_scale_ref,
        flops=out_numel_flops(1.0),
        doc="Y = alpha * X (X's dtype): scaling by a constant without a constant tensor.",
        sharding=pointwise("linear"),  # linear: a pending sum stays pending
    )
)


def _fill_like_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = ctx.tensor(0)
    return (ctx.out(t.dtype, t.shape),)


def _fill_like_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[0])
    return (np.full(x.shape, float_attr(attrs, "value", 1.0)).astype(x.dtype),)


def _fill_like_sharding(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[Strategy]:
    """The result does not depend on X's values: shards map to shards, and a pending reduction
    of X gives a replicated result (every piece has X's global shape)."""
    x = ins[0].shape if isinstance(ins[0], TensorType) else ()
    found = [Strategy((R,), (R,))]
    found += [Strategy((Shard(d),), (Shard(d),)) for d in range(len(x)) if x[d] > 1]
    found += [Strategy((Partial(op),), (R,)) for op in PARTIAL_OPS]
    return found


FILL_LIKE = register(
    OpDef(
        name="FillLike",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("X",),
        outputs=("Y",),
        infer=_fill_like_rule,
        attrs={"value": AttrSpec("float", 1.0)},
        reference=_fill_like_ref,
        bytes_read=lambda ins, outs, attrs: 0.0,  # only X's type is used
        doc="A tensor of X's dtype and shape filled with value (cast to the dtype); X's values "
        "are not read. Not differentiable.",
        sharding=_fill_like_sharding,
    )
)


# -- gradient rules (contract: distir.ops.gradrules) --------------------------------------------
def _shape_of(ctx: GradCtx, v: Value) -> tuple[int, ...]:
    return ctx.type(v).shape


def _to_inputs(ctx: GradCtx, op: Op, grads: Sequence[Value | None]) -> list[Value | None]:
    """Gradients computed at the result's shape, summed back to each (float) input's shape."""
    y = _shape_of(ctx, op.outputs[0])
    return [
        unbroadcast(ctx, g, _shape_of(ctx, x), y) if g is not None and is_float(ctx, x) else None
        for x, g in zip(op.inputs, grads, strict=True)
    ]


def _one(ctx: GradCtx, name: str, *inputs: Value, **attrs: Any) -> Value:
    (out,) = ctx.op(name, *inputs, **attrs)
    return out


def _add_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    dy = first(douts)
    return _to_inputs(ctx, op, [dy] * len(op.inputs))


def _sub_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    dy = first(douts)
    return _to_inputs(ctx, op, [dy, _one(ctx, "Neg", dy)])


def _mul_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    dy = first(douts)
    a, b = (ctx.primal(v) for v in op.inputs)
    return _to_inputs(ctx, op, [_one(ctx, "Mul", dy, b), _one(ctx, "Mul", dy, a)])


def _div_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    """C = A / B: dA = dC / B, dB = -dC · C / B."""
    dy = first(douts)
    b, c = ctx.primal(op.inputs[1]), ctx.primal(op.outputs[0])
    da = _one(ctx, "Div", dy, b)
    db = _one(ctx, "Neg", _one(ctx, "Mul", da, c))
    return _to_inputs(ctx, op, [da, db])


def _pow_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    """C = A^B: dA = dC · B · A^(B - 1). The exponent gets no gradient (it would need log A)."""
    dy = first(douts)
    a, b = ctx.primal(op.inputs[0]), ctx.primal(op.inputs[1])
    b_minus_1 = _one(ctx, "Sub", b, _one(ctx, "FillLike", b, value=1.0))
    da = _one(ctx, "Mul", _one(ctx, "Mul", dy, b), _one(ctx, "Pow", a, b_minus_1))
    return _to_inputs(ctx, op, [da, None])


def _select_grad(keep_a: str) -> GradRule:
    """Max / Min: the cotangent goes to the input the result came from (``keep_a``: the
    comparison that picks A; a tie goes to A)."""

    def rule(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
        dy = first(douts)
        a, b = (ctx.primal(v) for v in op.inputs)
        pick = _one(ctx, keep_a, a, b)
        zeros = zeros_like(ctx, dy)
        return _to_inputs(ctx, op, [_one(ctx, "Where", pick, dy, zeros), _one(ctx, "Where", pick, zeros, dy)])

    return rule


def _sqrt_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    """Y = √X: dX = dY / (2Y)."""
    return [_one(ctx, "Div", _one(ctx, "Scale", first(douts), alpha=0.5), ctx.primal(op.outputs[0]))]


def _neg_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    return [_one(ctx, "Neg", first(douts)) if is_float(ctx, op.inputs[0]) else None]


def _exp_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    return [_one(ctx, "Mul", first(douts), ctx.primal(op.outputs[0]))]


def _log_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    return [_one(ctx, "Div", first(douts), ctx.primal(op.inputs[0]))]


def _reciprocal_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    """Y = 1/X: dX = −dY·Y²."""
    y = ctx.primal(op.outputs[0])
    return [_one(ctx, "Neg", _one(ctx, "Mul", first(douts), _one(ctx, "Mul", y, y)))]


def _sin_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    """Y = sin X: dX = dY·cos X."""
    return [_one(ctx, "Mul", first(douts), _one(ctx, "Cos", ctx.primal(op.inputs[0])))]


def _cos_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    """Y = cos X: dX = −dY·sin X."""
    return [_one(ctx, "Neg", _one(ctx, "Mul", first(douts), _one(ctx, "Sin", ctx.primal(op.inputs[0]))))]


def _stop_gradient_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    return [None]


def _via(grad_op: str, of: str) -> GradRule:
    """dX = <grad_op>(dY, X or Y): activations with a dedicated gradient op."""

    def rule(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
        if not is_float(ctx, op.inputs[0]):
            return [None]
        z = op.inputs[0] if of == "X" else op.outputs[0]
        return [_one(ctx, grad_op, first(douts), ctx.primal(z))]

    return rule


def _identity_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    return [first(douts) if is_float(ctx, op.inputs[0]) else None]


def _where_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    dy = first(douts)
    cond = ctx.primal(op.inputs[0])
    zeros = zeros_like(ctx, dy)
    return _to_inputs(
        ctx, op, [None, _one(ctx, "Where", cond, dy, zeros), _one(ctx, "Where", cond, zeros, dy)]
    )


def _cast_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    """Cast back to the input's dtype (no gradient flows through a cast from or to integers)."""
    x, y = ctx.type(op.inputs[0]), ctx.type(op.outputs[0])
    if not (x.dtype.is_float and y.dtype.is_float):
        return [None]
    return [_one(ctx, "Cast", first(douts), to=x.dtype)]


def _scale_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    return [_one(ctx, "Scale", first(douts), alpha=float_attr(op.attrs, "alpha", 1.0))]


ADD.fill("grad", _add_grad)
SUB.fill("grad", _sub_grad)
MUL.fill("grad", _mul_grad)
DIV.fill("grad", _div_grad)
POW.fill("grad", _pow_grad)
MAX.fill("grad", _select_grad("GreaterOrEqual"))
MIN.fill("grad", _select_grad("LessOrEqual"))
SQRT.fill("grad", _sqrt_grad)
NEG.fill("grad", _neg_grad)
EXP.fill("grad", _exp_grad)
LOG.fill("grad", _log_grad)
RECIPROCAL.fill("grad", _reciprocal_grad)
SIN.fill("grad", _sin_grad)
COS.fill("grad", _cos_grad)
STOP_GRADIENT.fill("grad", _stop_gradient_grad)
RELU.fill("grad", _via("ReluGrad", "X"))
GELU.fill("grad", _via("GeluGrad", "X"))
GELU_TANH.fill("grad", _via("GeluTanhGrad", "X"))
TANH.fill("grad", _via("TanhGrad", "Y"))
SIGMOID.fill("grad", _via("SigmoidGrad", "Y"))
SILU.fill("grad", _via("SiluGrad", "X"))
SQUARED_RELU.fill("grad", _via("SquaredReluGrad", "X"))
IDENTITY.fill("grad", _identity_grad)
SUM.fill("grad", _add_grad)
WHERE.fill("grad", _where_grad)
CAST.fill("grad", _cast_grad)
SCALE.fill("grad", _scale_grad)


# -- torch implementations (contract: distir.ops._torch) ----------------------------------------
def _div_torch(ctx: TorchContext, a: Any, b: Any) -> Any:
    """Integers divide toward zero (ONNX), floats truly."""
    if a.dtype.is_floating_point:
        return a / b
    return ctx.torch.div(a, b, rounding_mode="trunc")


def _sum_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    acc = xs[0]
    for x in xs[1:]:
        acc = acc + x
    return (acc,)


def _cast_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """torch rounds to bf16 (and f16) to nearest, ties to even, as the reference does."""
    to = attrs["to"]
    assert isinstance(to, DType)
    return (xs[0].to(ctx.dtype(to)),)


def _fill_like_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """The value converted as numpy's ``astype`` does: truncated for integers, != 0 for bool."""
    x, value = xs[0], float_attr(attrs, "value", 1.0)
    if x.dtype == ctx.torch.bool:
        return (ctx.torch.full_like(x, value != 0.0),)
    return (ctx.torch.full_like(x, value if x.dtype.is_floating_point else int(value)),)


ADD.fill("torch", binary(lambda ctx, a, b: a + b))
MAX.fill("torch", binary(lambda ctx, a, b: ctx.torch.maximum(a, b)))
MIN.fill("torch", binary(lambda ctx, a, b: ctx.torch.minimum(a, b)))
SUB.fill("torch", binary(lambda ctx, a, b: a - b))
MUL.fill("torch", binary(lambda ctx, a, b: a * b))
DIV.fill("torch", binary(_div_torch))
POW.fill("torch", binary(lambda ctx, a, b: ctx.torch.pow(a, b)))
SQRT.fill("torch", unary(lambda ctx, x: ctx.torch.sqrt(x)))
NEG.fill("torch", unary(lambda ctx, x: ctx.torch.neg(x)))
EXP.fill("torch", unary(lambda ctx, x: ctx.torch.exp(x)))
RELU.fill("torch", unary(lambda ctx, x: ctx.torch.clamp_min(x, 0)))
GELU.fill("torch", unary(lambda ctx, x: ctx.torch.nn.functional.gelu(x)))  # exact (erf)
GELU_TANH.fill("torch", unary(lambda ctx, x: ctx.torch.nn.functional.gelu(x, approximate="tanh")))
TANH.fill("torch", unary(lambda ctx, x: ctx.torch.tanh(x)))
SIGMOID.fill("torch", unary(lambda ctx, x: ctx.torch.sigmoid(x)))
SILU.fill("torch", unary(lambda ctx, x: ctx.torch.nn.functional.silu(x)))
SQUARED_RELU.fill("torch", unary(lambda ctx, x: ctx.torch.square(ctx.torch.relu(x))))
LOG.fill("torch", unary(lambda ctx, x: ctx.torch.log(x)))
RECIPROCAL.fill("torch", unary(lambda ctx, x: ctx.torch.reciprocal(x)))
SIN.fill("torch", unary(lambda ctx, x: ctx.torch.sin(x)))
COS.fill("torch", unary(lambda ctx, x: ctx.torch.cos(x)))
STOP_GRADIENT.fill("torch", unary(lambda ctx, x: x.detach()))
IDENTITY.fill("torch", unary(lambda ctx, x: x))
SUM.fill("torch", _sum_torch)
WHERE.fill("torch", lambda ctx, xs, attrs: (ctx.torch.where(xs[0], xs[1], xs[2]),))
CAST.fill("torch", _cast_torch)
SCALE.fill("torch", lambda ctx, xs, attrs: (xs[0] * float_attr(attrs, "alpha", 1.0),))
FILL_LIKE.fill("torch", _fill_like_torch)
