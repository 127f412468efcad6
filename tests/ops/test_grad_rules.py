"""Every gradient rule of the registry matches central finite differences, and the ops added for
the rules and the model zoo reject bad input with typed errors.

For an op ``y = f(x...)`` with a grad rule, a test function holds the forward op and the code
the rule emits (through a GradCtx whose ``primal(v)`` is ``v`` itself), returning the outputs
and the input cotangents for the fixed random output cotangents ``r``: the rule's cotangent of
input ``x`` must be ∂/∂x Σ f(x)·r. The function is type-checked (``distir.check``: the backward
ops' shapes are right) and run on the reference executor; the finite differences use the op's
numpy reference directly. The registry is enumerated, so a rule added later needs a case here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from ops_examples import D0, In, K, R, T, b, f32, f64, i32, i64, random_value

import distir
from distir.interp.reference import run_reference
from distir.ir.builder import FunctionBuilder
from distir.ir.function import Module
from distir.ir.ops import Op
from distir.ir.types import DType, TensorType, Type
from distir.ir.values import Attrs, Value
from distir.ir.verify import OpSignatureError
from distir.ops import REGISTRY, OpTypeError

# The ops with a gradient rule (the task's list; ops not here are not differentiable).
DIFFERENTIABLE = {
    *("Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Neg", "Exp", "Relu", "Gelu", "GeluTanh", "Tanh"),
    *("Sigmoid", "Silu", "SquaredRelu"),
    *("Identity", "Sum", "Where", "Cast", "Scale", "CausalMask", "Softmax", "LayerNormalization"),
    *("RMSNormalization", "MatMul", "Gemm", "Transpose", "Reshape", "Unsqueeze", "Squeeze", "Split"),
    *("Concat", "Slice", "Gather", "Expand", "ReduceSum", "ReduceMean", "SoftmaxCrossEntropyLoss"),
    *("MSELoss", "Conv", "MaxPool", "AveragePool", "Attention", "Rope"),
    *("Log", "Reciprocal", "Sin", "Cos", "StopGradient", "SoftmaxCrossEntropyParts", "Dropout", "LogSoftmax"),
    *("NegativeLogLikelihoodLoss", "Max", "Min", "Trilu", "CumSum", "MoE"),
    *("UnpadTokens", "PadTokens", "Float8Cast", "NllLossParts"),
}


@dataclass
class GCase:
    """One op application: inputs (fixed integer ones become Constants, so shapes are known),
    attributes, results whose cotangent is None (``dead``), float inputs the rule documents as
    without gradient (``no_grad``), and the finite-difference step and tolerance."""

    op: str
    inputs: list[In | Type]
    attrs: dict[str, Any] = field(default_factory=dict)
    dead: tuple[int, ...] = ()
    no_grad: tuple[int, ...] = ()
    h: float = 1e-6
    rtol: float = 1e-5
    # the op whose derivative the rule is by definition, when not the op's own (a quantizer's
    # straight-through gradient is the identity's: Float8Cast)
    surrogate: str = ""

    def specs(self) -> list[In]:
        return [x if isinstance(x, In) else In(x) for x in self.inputs]

    @property
    def id(self) -> str:
        shapes = ",".join(str(s.type.shape) for s in self.specs() if isinstance(s.type, TensorType))
        return f"{self.op}-{shapes}-{self.attrs}-dead{self.dead}"


def t(*shape: int) -> TensorType:
    return T(f64, *shape)


def pos(*shape: int) -> In:
    return R(t(*shape), 0.5, 2.5)


def signs(*shape: int) -> In:
    """Values at least 0.2 away from 0 (Relu's kink), of both signs."""
    v = np.random.default_rng(7).uniform(0.2, 2.0, size=shape)
    return K(t(*shape), (v * np.where(np.arange(v.size).reshape(shape) % 2, 1, -1)).tolist())


_bin = [[t(2, 3), t(3)], [t(2, 1), t(1, 4)], [t(), t(2)], [t(2, 3, 4), t(1, 3, 1)]]
_gemm_ab = {
    (0, 0): (t(2, 3), t(3, 4)),
    (0, 1): (t(2, 3), t(4, 3)),
    (1, 0): (t(3, 2), t(3, 4)),
    (1, 1): (t(3, 2), t(4, 3)),
}
_pool1d_ceil = {"kernel_shape": (3,), "strides": (2,), "pads": (1, 1), "dilations": (2,), "ceil_mode": 1}
_avg1d = {"kernel_shape": (3,), "strides": (2,), "pads": (1, 2), "ceil_mode": 1, "count_include_pad": 1}

CASES: list[GCase] = [
    *(GCase(op, list(ins)) for op in ("Add", "Sub", "Mul") for ins in _bin),
    GCase("Div", [t(2, 3), pos(3)]),
    GCase("Div", [t(3, 1), pos(1, 4)]),
    GCase("Pow", [pos(2, 3), t(3)], no_grad=(1,)),
    GCase("Pow", [pos(1, 3), t(2, 3)], no_grad=(1,)),
    GCase("Sqrt", [pos(2, 3)]),
    *(GCase(op, [t(2, 3)]) for op in ("Neg", "Exp", "Gelu", "GeluTanh", "Tanh", "Sigmoid", "Silu")),
    GCase("SquaredRelu", [t(2, 3)]),
    GCase("Identity", [t(2, 3)]),
    *(GCase(op, [t(2, 3)]) for op in ("UnpadTokens", "PadTokens")),
    GCase("Relu", [signs(2, 3)]),
    GCase("Sum", [t(2, 3)]),
    GCase("Sum", [t(2, 3), t(3), t(1, 1)]),
    GCase("Where", [T(b, 2, 3), t(2, 3), t(3)]),
    GCase("Where", [T(b, 3), t(2, 1), t()]),
    GCase("Cast", [t(2, 3)], {"to": f64}),
    GCase("Cast", [t(4)], {"to": f32}, h=1e-2, rtol=1e-4),  # a linear map in f32: a large step is exact
    GCase("Scale", [t(2, 3)], {"alpha": -0.5}),
    GCase("CausalMask", [t(3, 3)], {"fill": -7.0}),  # a small fill: 1e9 would swamp the differences
    GCase("CausalMask", [t(2, 3, 4)], {"fill": 0.0}),
    GCase("CausalMask", [t(2, 4, 3)], {"fill": -3.0}),
    GCase("Softmax", [t(2, 5)]),
    GCase("Softmax", [t(3, 4, 2)], {"axis": 1}),
    GCase("LogSoftmax", [t(2, 5)]),
    GCase("LogSoftmax", [t(3, 4, 2)], {"axis": 1}),
    GCase("LayerNormalization", [t(2, 5), t(5), t(5)]),
    GCase("LayerNormalization", [t(2, 3, 4), t(3, 4)], {"axis": 1, "epsilon": 1e-3}),
    GCase("LayerNormalization", [t(3, 4, 5), t(1, 5), t(5)], {"axis": -2}),  # B shaped unlike Scale
    GCase("LayerNormalization", [t(2, 5), t(5), t(5)], {"zero_centered_gamma": True}),  # LayerNorm1p
    GCase("RMSNormalization", [t(2, 5), t(5)]),
    GCase("RMSNormalization", [t(2, 3, 4), t(3, 1)], {"axis": 1, "epsilon": 1e-2}),
    GCase("MatMul", [t(2, 3), t(3, 4)]),
    GCase("MatMul", [t(2, 3, 4), t(4, 5)]),  # a weight on a batch: the flattened weight gradient
    GCase("MatMul", [t(5, 2, 3), t(3)]),
    GCase("MatMul", [t(3), t(3)]),
    GCase("MatMul", [t(2, 1, 3, 4), t(5, 4, 2)]),
    GCase("MatMul", [t(3), t(2, 3, 4)]),
    GCase("MatMul", [t(2, 3), t(4, 3, 5)]),
    GCase("MatMul", [t(3, 2), t(3, 4)], {"transA": 1}),
    GCase("MatMul", [t(2, 3, 4), t(5, 4)], {"transB": 1}),  # the flattened weight gradient, transposed
    GCase("MatMul", [t(2, 4, 3), t(4, 5)], {"transA": 1}),  # batched A transposed: no flattening
    GCase("MatMul", [t(2, 1, 4, 3), t(5, 2, 4)], {"transA": 1, "transB": 1}),
    GCase("MatMul", [t(3), t(2, 4, 3)], {"transB": 1}),
    *(
        GCase("Gemm", [*ab, *c], {"transA": ta, "transB": tb, "alpha": al, "beta": be})
        for ((ta, tb), ab), c, al, be in zip(
            _gemm_ab.items(),
            [[t(4)], [t(2, 1)], [], [t(2, 4)]],
            [1.0, 0.5, -2.0, 1.5],
            [1.0, 2.0, 1.0, -0.5],
            strict=True,
        )
    ),
    GCase("Max", [t(2, 3), t(3)]),
    GCase("Min", [t(2, 3), t(1, 3)]),
    GCase("CumSum", [t(3, 4)], {"axis": 1}),
    GCase("CumSum", [t(5)], {"exclusive": 1, "reverse": 1}),
    GCase("Trilu", [t(3, 4)]),
    GCase("Trilu", [t(2, 3, 3)], {"upper": 0, "k": 1}),
    GCase("Transpose", [t(2, 3, 4)]),
    GCase("Transpose", [t(2, 3, 4)], {"perm": (2, 0, 1)}),
    GCase("Reshape", [t(2, 3, 4), K(T(i64, 3), [0, -1, 2])]),
    GCase("Reshape", [t(2, 3, 4)], {"shape": (4, -1)}),
    GCase("Reshape", [t(6)], {"shape": (3, 2)}),
    GCase("Unsqueeze", [t(2, 3)], {"axes": (0, -1)}),
    GCase("Squeeze", [t(1, 3, 1)]),
    GCase("Squeeze", [t(1, 3, 1)], {"axes": (-1,)}),
    GCase("Split", [t(5, 2)], {"num_splits": 2}),
    GCase("Split", [t(3, 10)], {"dim": 1, "sizes": (3, 0, 7)}, dead=(1,)),
    GCase("Split", [t(3, 10)], {"dim": -1, "sizes": (4, 6)}, dead=(0,)),
    GCase("Concat", [t(2, 3), t(4, 3)], {"axis": 0}),
    GCase("Concat", [t(2, 3), t(2, 1), t(2, 2)], {"axis": -1}),
    GCase("Slice", [t(5, 6)], {"starts": (1, -3), "ends": (4, 100), "axes": (0, 1)}),
    GCase("Slice", [t(5, 6)], {"starts": (4,), "ends": (0,), "axes": (1,), "steps": (-2,)}),
    GCase("Gather", [t(5, 3), K(T(i64, 3), [-1, 4, 1])]),  # -1 and 4 are the same row: they add up
    GCase("Gather", [t(4, 6), R(T(i64, 2, 3), -6, 6)], {"axis": 1}),
    GCase("Gather", [t(4, 3), K(T(i32), 3)]),
    GCase("Expand", [t(3, 1)], {"shape": (2, 3, 4)}),
    GCase("Expand", [t(2, 5)], {"shape": (1, 1)}),
    GCase("Expand", [t()], {"shape": (2, 3)}),
    *(
        GCase(op, [t(*s)], a)
        for op in ("ReduceSum", "ReduceMean")
        for s, a in [
            ((2, 3, 4), {}),
            ((2, 3, 4), {"axes": (0, -1), "keepdims": 0}),
            ((4,), {"keepdims": 0}),
            ((2, 3), {"axes": (1,)}),
        ]
    ),
    GCase("SoftmaxCrossEntropyLoss", [t(4, 5), R(T(i64, 4), 0, 5)]),
    GCase("SoftmaxCrossEntropyLoss", [t(2, 3, 4), R(T(i32, 2, 4), 0, 3)], {"reduction": "none"}),
    GCase("SoftmaxCrossEntropyLoss", [t(3, 2), R(T(i64, 3), 0, 2)], {"reduction": "sum"}),
    GCase("NegativeLogLikelihoodLoss", [t(4, 5), R(T(i64, 4), 0, 5)]),
    GCase("NegativeLogLikelihoodLoss", [t(2, 3, 4), R(T(i32, 2, 4), 0, 3)], {"reduction": "none"}),
    GCase("NegativeLogLikelihoodLoss", [t(3, 2), R(T(i64, 3), 0, 2)], {"reduction": "sum"}),
    GCase("NegativeLogLikelihoodLoss", [t(2, 3, 4), R(T(i64, 2, 3), 0, 4)], {"axis": -1}),  # classes last
    GCase("Log", [pos(2, 3)]),
    GCase("Reciprocal", [pos(2, 3)]),
    *(GCase(op, [t(2, 3)]) for op in ("Sin", "Cos")),
    GCase("StopGradient", [t(2, 3)], no_grad=(0,)),  # by definition: a constant for autodiff
    # by definition straight-through (torchao's casts pass the gradient on unchanged)
    GCase("Float8Cast", [t(2, 3)], {"to": DType.f8e4m3}, surrogate="Identity"),
    GCase("Float8Cast", [t(3)], {"to": DType.f8e5m2}, surrogate="Identity"),
    GCase("SoftmaxCrossEntropyParts", [t(4, 5), t(4), R(T(i64, 4), 0, 5)]),
    GCase("SoftmaxCrossEntropyParts", [t(3, 4), t(3), R(T(i64, 3), 0, 4)], dead=(0,)),
    GCase("SoftmaxCrossEntropyParts", [t(3, 4), t(3), R(T(i64, 3), 0, 4)], dead=(1,)),
    GCase("SoftmaxCrossEntropyParts", [t(2, 3, 4), t(2, 3), R(T(i64, 2, 3), 0, 4)]),  # (batch, seq) rows
    GCase("NllLossParts", [t(4, 5), R(T(i64, 4), 0, 5)]),
    GCase("NllLossParts", [t(2, 3, 4), R(T(i64, 2, 3), 0, 4)]),  # (batch, seq) rows
    GCase("MSELoss", [t(4, 3), t(4, 3)]),
    GCase("MSELoss", [t(5), t(5)], {"reduction": "sum"}),
    GCase("MSELoss", [t(2, 3), t(2, 3)], {"reduction": "none"}),
    GCase("Conv", [t(2, 3, 5, 5), t(4, 3, 3, 3)]),
    GCase(
        "Conv",
        [t(1, 4, 7), t(6, 2, 3), t(6)],
        {"group": 2, "strides": (2,), "pads": (1, 2), "dilations": (2,)},
    ),
    GCase("MaxPool", [t(2, 3, 6, 6)], {"kernel_shape": (2, 2), "strides": (2, 2)}),
    GCase("MaxPool", [t(1, 2, 7)], _pool1d_ceil),
    GCase("AveragePool", [t(2, 3, 6, 6)], {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1)}),
    GCase("AveragePool", [t(1, 2, 7)], _avg1d),
    # the log-sum-exp is a residual for the gradient, without a cotangent of its own
    GCase("Attention", [t(2, 3, 4, 2), t(2, 3, 2, 2), t(2, 3, 2, 2)], {"causal": True}, dead=(1,)),
    GCase("Attention", [t(1, 4, 3, 3), t(1, 4, 1, 3), t(1, 4, 1, 3)], {"scale": 0.7}, dead=(1,)),
    GCase("Rope", [t(2, 4, 3, 6)], {"theta": 7.0}),
    GCase("Rope", [t(1, 3, 2, 4)], {"inverse": True}),
    # the reference runs p = 0 only (DropoutGrad's formula: test_dropout); the mask is bool
    GCase("Dropout", [t(2, 3)], {"p": 0.0}, dead=(1,)),
    # top-2 of 4 experts, normalized (Mixtral), and top-1 unnormalized (Switch)
    GCase("MoE", [t(2, 3, 4), t(4, 4), t(4, 5, 4), t(4, 5, 4), t(4, 4, 5)], {"top_k": 2}),
    GCase("MoE", [t(5, 3), t(3, 3), t(3, 2, 3), t(3, 2, 3), t(3, 3, 2)], {"top_k": 1, "normalize": False}),
]


# -- building and running the forward + backward function -------------------------------------
class _Ctx:
    """A GradCtx over one function holding the forward op and its backward code."""

    def __init__(self, fb: FunctionBuilder, types: dict[Value, Type]) -> None:
        self.fb = fb
        self.types = types
        self.emitted: list[str] = []  # the names of the ops the rule emits

    def op(self, name: str, *inputs: Value, n_out: int | None = None, **attrs: object) -> tuple[Value, ...]:
        self.emitted.append(name)
        return self.fb.op(name, *inputs, n_out=n_out, **attrs)

    def primal(self, v: Value) -> Value:
        return v

    def type(self, v: Value) -> TensorType:
        ty = self.types[v]
        assert isinstance(ty, TensorType), (v, ty)
        return ty


@dataclass
class Built:
    module: Module
    params: list[tuple[int, In]]  # (input index, spec) of the inputs passed as parameters
    live: list[int]  # results with a cotangent parameter
    out_types: list[TensorType]
    dins: list[Value | None]
    backward_ops: list[str]


def build(case: GCase) -> Built:
    d = REGISTRY[case.op]
    fb = FunctionBuilder("f", REGISTRY.out_arity)
    specs = case.specs()
    ins: list[Value] = []
    params: list[tuple[int, In]] = []
    for i, s in enumerate(specs):
        if s.fixed and not s.type.dtype.is_float:  # shapes, indices: known to the type rules
            assert isinstance(s.type, TensorType)
            value = np.asarray(s.value).tolist()
            (v,) = fb.op("Constant", value=_tup(value), dtype=s.type.dtype, device=D0, types=[s.type])
        else:
            v = fb.param(f"x{i}", s.type)
            params.append((i, s))
        ins.append(v)
    known = [np.asarray(s.value) if s.fixed and not s.type.dtype.is_float else None for s in specs]
    out_types = d.infer_types([s.type for s in specs], Attrs(case.attrs), known)
    outs = tuple(Value(f"y{k}", ty) for k, ty in enumerate(out_types))
    op = Op(case.op, tuple(ins), outs, Attrs(case.attrs))
    fb.append(op)
    live = [k for k in range(len(outs)) if k not in case.dead]
    douts: list[Value | None] = [None] * len(outs)
    for k in live:
        douts[k] = fb.param(f"r{k}", out_types[k])
    types: dict[Value, Type] = {
        **{v: s.type for v, s in zip(ins, specs, strict=True)},
        **dict(zip(outs, out_types, strict=True)),
    }
    assert d.grad is not None
    ctx = _Ctx(fb, types)
    dins = list(d.grad(ctx, op, douts))
    assert len(dins) == len(ins), f"{case.op}'s rule returned {len(dins)} cotangents for {len(ins)} inputs"
    # parameters: the non-constant inputs, then the cotangents (in declaration order)
    fn = fb.ret(*outs, *(x for x in dins if x is not None))
    assert all(isinstance(o, TensorType) for o in out_types)
    return Built(Module((fn,)), params, live, list(out_types), dins, ctx.emitted)  # type: ignore[arg-type]


def _tup(v: Any) -> Any:
    return tuple(_tup(x) for x in v) if isinstance(v, list) else v


def _loss(case: GCase, values: list[Any], r: dict[int, np.ndarray]) -> float:
    d = REGISTRY[case.surrogate or case.op]
    assert d.reference is not None
    outs = d.reference(values, Attrs({} if case.surrogate else case.attrs))
    return float(sum(np.sum(np.asarray(outs[k], dtype=np.float64) * r[k]) for k in r))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_grad_rule_matches_finite_differences(case: GCase) -> None:
    built = build(case)
    assert "Constant" not in built.backward_ops, f"{case.op}'s rule made a constant: {built.backward_ops}"
    typed = distir.check(built.module)  # the backward ops type-check, at the right shapes
    rng = np.random.default_rng(0)
    specs = case.specs()
    values = [random_value(s, rng) for s in specs]
    fwd_types = built.out_types
    r = {k: rng.standard_normal(fwd_types[k].shape).astype(fwd_types[k].dtype.to_numpy()) for k in built.live}
    args = [values[i] for i, _ in built.params] + [r[k] for k in built.live]
    got = run_reference(typed, args)[len(fwd_types) :]
    grads = iter(got)
    for i, (s, din) in enumerate(zip(specs, built.dins, strict=True)):
        ty = s.type
        assert isinstance(ty, TensorType)
        if not ty.dtype.is_float or i in case.no_grad:
            assert din is None, f"{case.op}: input {i} ({ty}) must get no gradient"
            continue
        assert din is not None, f"{case.op}: float input {i} got no gradient"
        g = np.asarray(next(grads))
        assert g.shape == ty.shape and g.dtype == ty.dtype.to_numpy(), (i, g.shape, g.dtype)
        want = _numeric(lambda x, i=i: _loss(case, [*values[:i], x, *values[i + 1 :]], r), values[i], case.h)
        scale = max(float(np.max(np.abs(want), initial=0.0)), 1.0)
        np.testing.assert_allclose(
            g, want, rtol=case.rtol, atol=case.rtol * scale, err_msg=f"{case.id}: d/dx{i}"
        )


@pytest.mark.parametrize("case", [c for c in CASES if c.op in ("MatMul", "Gemm")], ids=lambda c: c.id)
def test_matrix_product_gradients_transpose_by_flags_not_copies(case: GCase) -> None:
    """dA = dY·Bᵀ and dB = Aᵀ·dY are GEMMs with transposed operands, as cuBLAS runs them (a
    transpose flag): the rules emit no Transpose, whose copy the cost model would charge."""
    assert "Transpose" not in build(case).backward_ops


def _numeric(f: Any, x: np.ndarray, h: float) -> np.ndarray:
    x = np.array(x, dtype=np.float64, copy=True)
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        orig = x[idx]
        x[idx] = orig + h
        up = f(x)
        x[idx] = orig - h
        down = f(x)
        x[idx] = orig
        g[idx] = (up - down) / (2 * h)
    return g


def test_the_ops_with_grad_rules_are_the_documented_ones() -> None:
    with_rules = {d.name for d in REGISTRY if d.grad is not None}
    assert with_rules == DIFFERENTIABLE, (
        f"undocumented: {sorted(with_rules - DIFFERENTIABLE)}, missing: {sorted(DIFFERENTIABLE - with_rules)}"
    )


def test_every_op_with_a_grad_rule_has_cases() -> None:
    covered = {c.op for c in CASES}
    assert {d.name for d in REGISTRY if d.grad is not None} <= covered


def test_the_check_catches_a_wrong_rule() -> None:
    """The finite-difference check rejects a rule that forgets to sum over a broadcast dim."""
    case = GCase("Mul", [t(2, 3), t(3)])
    built = build(case)
    rng = np.random.default_rng(0)
    a, w = rng.standard_normal((2, 3)), rng.standard_normal(3)
    r = {0: rng.standard_normal((2, 3))}
    want = _numeric(lambda x: _loss(case, [a, x], r), w, 1e-6)
    wrong = (r[0] * a)[0]  # only the first row's contribution
    assert not np.allclose(wrong, want, rtol=1e-5)
    got = run_reference(distir.check(built.module), [a, w, r[0]])
    np.testing.assert_allclose(got[2], want, rtol=1e-5)


def test_non_float_inputs_get_no_gradient() -> None:
    """Integer elementwise ops and casts from integers: the rules return None."""
    for case in [
        GCase("Relu", [T(i64, 3)]),
        GCase("Neg", [T(i32, 2)]),
        GCase("Add", [T(i64, 2), T(i64, 2)]),
        GCase("Cast", [T(i64, 3)], {"to": f64}),
        GCase("Transpose", [T(i64, 2, 3)]),
        GCase("ReduceSum", [T(i64, 2, 3)]),
    ]:
        assert build(case).dins == [None] * len(case.inputs), case.id


# -- typed errors of the new ops -----------------------------------------------------------------
def _infer(op: str, ins: Sequence[Type], known: Sequence[Any] | None = None, **attrs: Any) -> Any:
    d = REGISTRY[op]
    d.check_attrs(Attrs(attrs))
    return d.infer_types(list(ins), Attrs(attrs), list(known) if known is not None else [None] * len(ins))


@pytest.mark.parametrize(
    ("op", "ins", "attrs", "match"),
    [
        ("Scale", [T(i64, 2)], {"alpha": 2.0}, "floating-point"),
        ("CausalMask", [t(3)], {}, "rank >= 2"),
        ("CausalMask", [T(i64, 3, 3)], {}, "floating-point"),
        ("Expand", [t(2, 3)], {"shape": (4, 3)}, r"does not broadcast to \[4, 3\] \(dim 0: 2 vs 4\)"),
        ("Expand", [t(3)], {"shape": (2, -1)}, "negative dim"),
        ("Reshape", [t(2, 3)], {}, "needs a target shape"),
        ("Reshape", [t(2, 3)], {"shape": (4, -1)}, r"cannot reshape \(2, 3\) to \[4, -1\]"),
        ("Reshape", [t(2, 3)], {"shape": (-1, -1)}, "more than one -1"),
        ("Reshape", [t(2, 3)], {"shape": (0, 0, 0)}, "0 \\(copy\\) but the input has rank 2"),
        ("GatherGrad", [t(2, 3), T(f64, 2)], {"size": 4}, "indices must be integers"),
        ("GatherGrad", [t(2, 3), T(i64, 3)], {"size": 4}, "does not hold the indices' shape"),
        ("GatherGrad", [t(2, 3), T(i64, 2)], {"size": 0}, "size must be positive"),
        ("GatherGrad", [t(2), T(i64, 2, 2)], {"size": 3}, "too small for indices"),
        (
            "SliceGrad",
            [t(2, 2)],
            {"shape": (5, 6), "starts": (1,), "ends": (4,)},
            r"slice of \(5, 6\) has shape \(3, 6\)",
        ),
        ("SliceGrad", [t(3)], {"shape": (5,), "starts": (1, 2), "ends": (4, 3), "axes": (0,)}, "same length"),
        ("SliceGrad", [t(3)], {"shape": (-1,), "starts": (1,), "ends": (4,)}, "-1 at a sliced axis"),
        (
            "SliceGrad",
            [t(3)],
            {"shape": (5, 2), "starts": (1,), "ends": (4,)},
            "has rank 2 but dY has rank 1",
        ),
        ("SliceGrad", [t(3)], {"shape": (-2,), "starts": (1,), "ends": (4,)}, "negative dim"),
    ],
)
def test_new_ops_reject_bad_input(op: str, ins: list[Type], attrs: dict[str, Any], match: str) -> None:
    with pytest.raises(OpTypeError, match=match):
        _infer(op, ins, **attrs)


def test_reshape_rejects_both_shape_forms() -> None:
    with pytest.raises(OpTypeError, match="either as the shape input or as the shape attribute") as info:
        _infer("Reshape", [t(2, 3), T(i64, 2)], [None, np.array([3, 2])], shape=(3, 2))
    assert info.value.index == 1


def test_gather_grad_index_out_of_range_is_named() -> None:
    with pytest.raises(OpTypeError, match="out of range for size 3") as info:
        _infer("GatherGrad", [t(2, 4), T(i64, 2)], [None, np.array([0, 3])], size=3)
    assert info.value.index == 1


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("Scale", {}),  # alpha is required
        ("Scale", {"alpha": "two"}),
        ("FillLike", {"value": (1.0,)}),
        ("Expand", {}),
        ("Expand", {"shape": (2.5,)}),
        ("CausalMask", {"fill": "x"}),
        ("GatherGrad", {}),  # size is required
        ("SliceGrad", {"starts": (0,), "ends": (1,)}),  # shape is required
        ("Reshape", {"shape": (2, "3")}),
    ],
)
def test_new_ops_reject_bad_attributes(op: str, attrs: dict[str, Any]) -> None:
    with pytest.raises(OpSignatureError):
        REGISTRY[op].check_attrs(Attrs(attrs))


@pytest.mark.parametrize(
    ("op", "x", "attrs", "want"),
    [
        ("Scale", np.arange(6.0).reshape(2, 3), {"alpha": -2.0}, -2.0 * np.arange(6.0).reshape(2, 3)),
        ("FillLike", np.arange(3), {"value": 4.0}, np.full(3, 4)),
        ("CausalMask", np.ones((2, 3)), {"fill": -5.0}, np.array([[1.0, -5, -5], [1, 1, -5]])),
        ("Expand", np.array([[1.0], [2.0]]), {"shape": (3, 2, 2)}, np.tile([[1.0, 1], [2, 2]], (3, 1, 1))),
        ("Reshape", np.arange(6.0), {"shape": (-1, 2)}, np.arange(6.0).reshape(3, 2)),
    ],
)
def test_new_ops_compute_what_numpy_does(op: str, x: np.ndarray, attrs: dict[str, Any], want: Any) -> None:
    d = REGISTRY[op]
    assert d.reference is not None
    (got,) = d.reference([x], Attrs(attrs))
    np.testing.assert_array_equal(got, want)
    assert got.dtype == x.dtype


def test_gather_grad_and_slice_grad_are_adjoints() -> None:
    """⟨Gather(x), y⟩ = ⟨x, GatherGrad(y)⟩ and likewise for Slice / SliceGrad, on random data."""
    rng = np.random.default_rng(3)
    x, idx = rng.standard_normal((5, 4)), np.array([[0, 4], [4, -1], [2, 2]])
    (gx,) = REGISTRY["Gather"].reference([x, idx], Attrs({}))  # type: ignore[misc]
    y = rng.standard_normal(gx.shape)
    (gy,) = REGISTRY["GatherGrad"].reference([y, idx], Attrs({"size": 5}))  # type: ignore[misc]
    np.testing.assert_allclose(np.sum(gx * y), np.sum(x * gy), rtol=1e-12)
    sl = {"starts": (4, 1), "ends": (0, 4), "axes": (0, 1), "steps": (-2, 1)}
    (sx,) = REGISTRY["Slice"].reference([x], Attrs(sl))  # type: ignore[misc]
    y = rng.standard_normal(sx.shape)
    (sy,) = REGISTRY["SliceGrad"].reference([y], Attrs({"shape": (5, 4), **sl}))  # type: ignore[misc]
    np.testing.assert_allclose(np.sum(sx * y), np.sum(x * sy), rtol=1e-12)
