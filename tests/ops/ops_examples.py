"""Valid example inputs for every LOCAL op with a reference (``EXAMPLES``), and helpers to make
types and random values for them. ``test_ops_generic`` fails when a registered op has no entry,
so a new op must add its examples here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distir.ir.types import Device, DType, ScalarType, TensorType, TupleType, Type
from distir.ir.values import Attrs

D0 = Device(0)
f16, f32, f64, i32, i64, b = DType.f16, DType.f32, DType.f64, DType.i32, DType.i64, DType.bool


def T(dtype: DType, *shape: int) -> TensorType:
    return TensorType(dtype, tuple(shape), D0)


def S(dtype: DType) -> ScalarType:
    return ScalarType(dtype, D0)


@dataclass(frozen=True)
class In:
    """One input: its type, and either a fixed value (also given to the rule as known) or a
    range [lo, hi) for random ints / uniform floats (default: ints in [0, 3), floats ~ N(0, 1))."""

    type: Type
    value: Any = None
    lo: float | None = None
    hi: float | None = None

    @property
    def fixed(self) -> bool:
        return self.value is not None


def K(t: Type, value: Any) -> In:
    return In(t, value)


def R(t: Type, lo: float, hi: float) -> In:
    return In(t, None, lo, hi)


@dataclass
class Case:
    inputs: list[In | Type]
    attrs: dict[str, Any] = field(default_factory=dict)

    def specs(self) -> list[In]:
        return [x if isinstance(x, In) else In(x) for x in self.inputs]

    def types(self) -> list[Type]:
        return [s.type for s in self.specs()]

    def attr_map(self) -> Attrs:
        return Attrs(self.attrs)


def random_value(spec: In, rng: np.random.Generator) -> Any:
    t = spec.type
    if isinstance(t, TupleType):
        return tuple(random_value(In(e), rng) for e in t.elements)
    assert isinstance(t, TensorType | ScalarType)
    shape = t.shape if isinstance(t, TensorType) else ()
    npdt = t.dtype.to_numpy()
    if spec.fixed:
        return np.asarray(spec.value, dtype=npdt).reshape(shape)
    if t.dtype.is_float:
        if spec.lo is not None and spec.hi is not None:
            return rng.uniform(spec.lo, spec.hi, size=shape).astype(npdt)
        return rng.standard_normal(shape).astype(npdt)
    if t.dtype.is_int:
        lo = int(spec.lo) if spec.lo is not None else 0
        hi = int(spec.hi) if spec.hi is not None else 3
        return rng.integers(lo, hi, size=shape).astype(npdt)
    return rng.random(shape) < 0.5


def random_inputs(case: Case, rng: np.random.Generator) -> list[Any]:
    return [random_value(s, rng) for s in case.specs()]


def known_inputs(case: Case, values: list[Any]) -> list[Any]:
    """Only the fixed inputs are known (what abstract interpretation would see)."""
    return [np.asarray(v) if s.fixed else None for s, v in zip(case.specs(), values, strict=True)]


_bin = [
    Case([T(f32, 2, 3), T(f32, 3)]),
    Case([T(i64, 2, 1), T(i64, 1, 4)]),
    Case([T(f16, 4), T(f16, 1)]),
    Case([T(f64), T(f64, 2)]),
]
_float_unary = [Case([T(f32, 2, 3)]), Case([T(f64, 5)]), Case([T(f16, 3, 1)]), Case([T(f32)])]
_any_unary = [*_float_unary, Case([T(i32, 4)]), Case([T(i64, 2, 2)])]
_pos_unary = [Case([R(T(f32, 2, 3), 0.1, 4.0)]), Case([R(T(f64, 5), 0.0, 9.0)])]
_like = [Case([T(f32, 2, 3), T(f32, 2, 3)]), Case([T(f64, 4), T(f64, 4)])]
_reduce = [
    Case([T(f32, 2, 3, 4)]),
    Case([T(f32, 2, 3, 4)], {"axes": (0, -1), "keepdims": 0}),
    Case([T(i32, 3, 5)], {"axes": (1,)}),
    Case([T(f64, 4)], {"keepdims": 0}),
    Case([T(f32, 2, 3)], {"axes": ()}),
    Case([T(i64, 2, 0)], {"axes": (0,)}),
]
_pred = [
    Case([T(f32, 4, 3), T(f32, 4, 3)]),
    Case([T(f64, 5), T(f64, 5)], {"reduction": "sum"}),
    Case([T(f32, 2, 3), T(f32, 2, 3)], {"reduction": "none"}),
]
_pool1d_ceil = {"kernel_shape": (3,), "strides": (2,), "pads": (1, 1), "dilations": (2,), "ceil_mode": 1}
_avg1d_ceil = {"kernel_shape": (3,), "strides": (2,), "pads": (1, 2), "ceil_mode": 1, "count_include_pad": 1}

EXAMPLES: dict[str, list[Case]] = {
    # shape
    "Shape": [Case([T(f32, 2, 3)]), Case([T(i64)])],
    "Constant": [
        Case([], {"value": ((1, 2), (3, 4)), "device": D0}),
        Case([], {"value": 1.5, "device": D0}),
        Case([], {"value": (True, False), "device": D0}),
        Case([], {"value": (1, 2), "dtype": f64, "device": D0}),
    ],
    "Gather": [
        Case([T(f32, 5, 3), K(T(i64, 2), [-1, 2])]),
        Case([T(f32, 4, 6), R(T(i64, 2, 3), -6, 6)], {"axis": 1}),
        Case([T(f64, 4, 3), K(T(i32), 3)]),
        Case([T(f32, 5, 3), K(T(i64, 2, 2), [[0, 1], [1, 4]])], {"padding": 1}),
    ],
    "Concat": [
        Case([T(f32, 2, 3), T(f32, 4, 3)], {"axis": 0}),
        Case([T(i64, 2, 3), T(i64, 2, 1), T(i64, 2, 2)], {"axis": -1}),
    ],
    "Reshape": [Case([T(f32, 2, 3, 4), K(T(i64, 3), [0, -1, 2])]), Case([T(f64, 6), K(T(i64, 2), [3, 2])])],
    "Unsqueeze": [Case([T(f32, 2, 3)], {"axes": (0, -1)}), Case([T(i64)], {"axes": (0,)})],
    "Squeeze": [Case([T(f32, 1, 3, 1)]), Case([T(f32, 1, 3, 1)], {"axes": (-1,)})],
    "Transpose": [Case([T(f32, 2, 3, 4)]), Case([T(i32, 2, 3, 4)], {"perm": (1, 0, 2)})],
    "Split": [
        Case([T(f32, 127, 2)], {"num_splits": 2}),
        Case([T(f32, 3, 10)], {"dim": 1, "sizes": (3, 0, 7)}),
    ],
    "Range": [
        Case([K(T(i64), 0), K(T(i64), 5), K(T(i64), 2)]),
        Case([K(T(f32), 1.0), K(T(f32), -1.0), K(T(f32), -0.5)]),
    ],
    "ConstantOfShape": [
        Case([K(T(i64, 2), [2, 3])], {"value": 1.5}),
        Case([K(T(i64, 1), [4])], {"dtype": i64}),
    ],
    "Trilu": [Case([T(f32, 3, 4)]), Case([T(f32, 2, 3, 3)], {"upper": 0, "k": -1})],
    "Slice": [
        Case([T(f32, 5, 6)], {"starts": (1, -3), "ends": (4, 100), "axes": (0, 1)}),
        Case([T(f32, 5, 6)], {"starts": (4,), "ends": (0,), "axes": (1,), "steps": (-2,)}),
    ],
    # elementwise
    "Add": _bin,
    "Sub": _bin,
    "Mul": _bin,
    "Div": [Case([T(f32, 2, 3), R(T(f32, 3), 0.5, 2.0)]), Case([T(i64, 2, 3), R(T(i64, 3), 1, 5)])],
    "Pow": [Case([R(T(f32, 2, 3), 0.1, 3.0), T(f32, 3)]), Case([R(T(i64, 4), 0, 5), R(T(i64, 4), 0, 3)])],
    "CumSum": [
        Case([T(f32, 2, 3)], {"axis": 1}),
        Case([T(i64, 4)], {"exclusive": 1, "reverse": 1}),
        Case([T(f64, 3, 2)], {"axis": -2, "reverse": 1}),
    ],
    "Max": _bin,
    "Min": _bin,
    "Sqrt": _pos_unary,
    "Exp": _float_unary,
    "Log": _pos_unary,
    "Reciprocal": _pos_unary,
    "Sin": _float_unary,
    "Cos": _float_unary,
    "StopGradient": _any_unary,
    "Gelu": _float_unary,
    "GeluTanh": _float_unary,
    "Tanh": _float_unary,
    "Sigmoid": _float_unary,
    "Silu": _float_unary,
    "SquaredRelu": _float_unary,
    "UnpadTokens": _float_unary,
    "PadTokens": _float_unary,
    "Neg": _any_unary,
    "Relu": _any_unary,
    "Identity": [*_any_unary, Case([T(b, 3)])],
    "Sum": [
        Case([T(f32, 2, 3)]),
        Case([T(f32, 2, 3), T(f32, 3), T(f32, 1, 1)]),
        Case([T(i64, 4), T(i64, 4)]),
    ],
    # compare
    "Equal": [Case([T(i64, 2, 3), T(i64, 3)]), Case([T(f32, 4), T(f32, 1)])],
    "Less": _bin,
    "LessOrEqual": _bin,
    "Greater": _bin,
    "GreaterOrEqual": [Case([T(i64, 2, 1), T(i64, 1, 4)])],
    "IsNaN": [Case([K(T(f32, 3), [1.0, float("nan"), 0.0])]), Case([T(f64, 2, 2)])],
    "Not": [Case([T(b, 2, 3)])],
    "And": [Case([T(b, 2, 3), T(b, 3)])],
    "Or": [Case([T(b, 1, 3), T(b, 2, 1)])],
    "Where": [Case([T(b, 2, 3), T(f32, 2, 3), T(f32, 3)]), Case([T(b), T(i64, 2), T(i64)])],
    "Float8Cast": [
        Case([T(f32, 2, 3)], {"to": DType.f8e4m3}),
        Case([T(DType.bf16, 4)], {"to": DType.f8e5m2}),
        Case([T(f32, 5, 2, 3)], {"to": DType.f8e4m3}),
    ],
    "Cast": [
        Case([T(f32, 2, 3)], {"to": f16}),
        Case([T(f32, 4)], {"to": i32}),
        Case([T(i64, 2)], {"to": b}),
        Case([T(b, 2)], {"to": f64}),
    ],
    # linalg
    "MatMul": [
        Case([T(f32, 2, 3), T(f32, 3, 4)]),
        Case([T(f32, 5, 2, 3), T(f32, 3)]),
        Case([T(f64, 3), T(f64, 3)]),
        Case([T(f32, 2, 1, 3, 4), T(f32, 5, 4, 2)]),
        Case([T(f32, 3), T(f32, 2, 3, 4)]),
        Case([T(f32, 3, 2), T(f32, 3, 4)], {"transA": 1}),
        Case([T(f32, 5, 2, 3), T(f32, 4, 3)], {"transB": 1}),
        Case([T(f32, 2, 1, 4, 3), T(f32, 5, 2, 4)], {"transA": 1, "transB": 1}),
        # float8 operands (Float8Cast's): the product comes out in bf16
        Case([T(DType.f8e4m3, 2, 3), T(DType.f8e4m3, 3, 4)]),
        Case([T(DType.f8e5m2, 4, 2), T(DType.f8e4m3, 4, 3)], {"transA": 1}),
        Case([T(f64, 3), T(f64, 2, 4, 3)], {"transB": 1}),
    ],
    "Gemm": [
        Case([T(f32, 2, 3), T(f32, 3, 4)]),
        Case([T(f32, 3, 2), T(f32, 4, 3), T(f32, 4)], {"transA": 1, "transB": 1}),
        Case([T(f64, 2, 3), T(f64, 3, 4), T(f64, 2, 1)], {"alpha": 0.5, "beta": 2.0}),
    ],
    # optim
    "SGD": [Case([T(f32, 3, 2), T(f32, 3, 2)], {"lr": 0.1}), Case([T(f64, 4), T(f64, 4)])],
    "Adam": [
        Case([T(f32, 3, 2), T(f32, 3, 2), T(f32, 3, 2), R(T(f32, 3, 2), 0, 1), K(T(i64), 3)]),
        Case(
            [T(f64, 4), T(f64, 4), T(f64, 4), R(T(f64, 4), 0, 1), K(S(i64), 1)],
            {"lr": 0.01, "beta1": 0.8, "beta2": 0.99, "epsilon": 1e-6},
        ),
    ],
    "AdamRemainder": [
        Case(
            [
                T(DType.bf16, 3, 2),
                R(T(DType.i16, 3, 2), -32768, 32768),
                T(f32, 3, 2),
                T(f32, 3, 2),
                R(T(f32, 3, 2), 0, 1),
                K(T(i64), 3),
            ]
        ),
        Case(
            [
                T(DType.bf16, 4),
                R(T(DType.i16, 4), -8, 8),
                T(f32, 4),
                T(f32, 4),
                R(T(f32, 4), 0, 1),
                K(S(i64), 1),
            ],
            {"lr": 0.01, "beta1": 0.8, "beta2": 0.99, "epsilon": 1e-6},
        ),
    ],
    "GradNormSq": [Case([T(f32, 3, 2)]), Case([T(f64, 5)])],
    "ClipByNorm": [
        Case([T(f32, 3, 2), R(T(f32), 0, 4)], {"max_norm": 1.0}),
        Case([T(f64, 4), R(T(f32), 0, 1)], {"max_norm": 0.5, "scale": "if_over"}),
    ],
    # tuples
    "MakeTuple": [Case([T(f32, 2), S(i64)]), Case([T(f32, 2, 3), T(f64, 1), T(b)])],
    "UnpackTuple": [
        Case([TupleType((T(f32, 2, 3), T(i64, 4)))]),
        Case([TupleType((TupleType((T(f32, 1),)), S(f32)))]),
    ],
    # reduce
    "ReduceSum": _reduce,
    "ReduceMean": _reduce,
    "ReduceMax": [c for c in _reduce if 0 not in c.types()[0].shape],  # type: ignore[union-attr]
    # nn
    "Softmax": [Case([T(f32, 2, 5)]), Case([T(f64, 3, 4, 2)], {"axis": 1}), Case([T(f16, 7)])],
    "LogSoftmax": [Case([T(f32, 2, 5)]), Case([T(f64, 3, 4, 2)], {"axis": 1}), Case([T(f16, 7)])],
    "LayerNormalization": [
        Case([T(f32, 2, 5), T(f32, 5), T(f32, 5)]),
        Case([T(f64, 2, 4, 5), T(f64, 4, 5)], {"axis": 1, "epsilon": 1e-3}),
        Case([T(f32, 3, 4, 5), T(f32, 1, 5), T(f32, 5)], {"axis": -2}),
        Case([T(f32, 2, 5), T(f32, 5), T(f32, 5)], {"zero_centered_gamma": True}),  # LayerNorm1p
    ],
    "RMSNormalization": [
        Case([T(f32, 2, 5), T(f32, 5)]),
        Case([T(f64, 2, 4, 5), T(f64, 1, 5)], {"axis": 1, "epsilon": 1e-3}),
    ],
    # loss
    "SoftmaxCrossEntropyLoss": [
        Case([T(f32, 4, 5), R(T(i64, 4), 0, 5)]),
        Case([T(f64, 2, 3, 4), R(T(i32, 2, 4), 0, 3)], {"reduction": "none"}),
        Case([T(f32, 3, 2), R(T(i64, 3), 0, 2)], {"reduction": "sum"}),
    ],
    "NegativeLogLikelihoodLoss": [
        Case([T(f32, 4, 5), R(T(i64, 4), 0, 5)]),
        Case([T(f64, 2, 3, 4), R(T(i32, 2, 4), 0, 3)], {"reduction": "none"}),
        Case([T(f32, 3, 2), R(T(i64, 3), 0, 2)], {"reduction": "sum"}),
        Case([T(f64, 2, 3, 4), R(T(i64, 2, 3), 0, 4)], {"axis": -1}),  # classes last
        Case([T(f32, 2, 3, 4), R(T(i32, 2, 3), 0, 4)], {"axis": 2, "reduction": "none"}),
    ],
    "MSELoss": _pred,
    "NllLossParts": [
        Case([T(f32, 4, 5), R(T(i64, 4), 0, 5)]),
        Case([T(f64, 3, 4), K(T(i32, 3), [0, 5, 11])], {"rows": (4, 12)}),  # a piece
        Case([T(f64, 2, 3, 5), R(T(i64, 2, 3), 0, 5)]),  # rows (batch, sequence)
    ],
    "SoftmaxCrossEntropyParts": [
        Case([T(f32, 4, 5), T(f32, 4), R(T(i64, 4), 0, 5)]),
        Case([T(f64, 3, 4), T(f64, 3), K(T(i32, 3), [0, 5, 11])], {"rows": (4, 12)}),  # a piece
        Case([T(f16, 4, 5), T(f16, 4), R(T(i64, 4), 0, 5)], {"acc": f32}),  # fused: f16 in, f32 out
        Case([T(f64, 2, 3, 5), T(f64, 2, 3), R(T(i64, 2, 3), 0, 5)]),  # rows (batch, sequence)
    ],
    # conv
    "Conv": [
        Case([T(f32, 2, 3, 5, 5), T(f32, 4, 3, 3, 3)]),
        Case(
            [T(f64, 1, 4, 7), T(f64, 6, 2, 3), T(f64, 6)],
            {"group": 2, "strides": (2,), "pads": (1, 2), "dilations": (2,)},
        ),
        Case(
            [T(f32, 1, 2, 4, 3, 3), T(f32, 2, 1, 2, 2, 2), T(f32, 2)],
            {"group": 2, "pads": (1, 0, 1, 0, 1, 1)},
        ),
        Case([T(f16, 1, 2, 6, 5), T(f16, 2, 2, 3, 2)], {"strides": (2, 1), "kernel_shape": (3, 2)}),
    ],
    "MaxPool": [
        Case([T(f32, 2, 3, 6, 6)], {"kernel_shape": (2, 2), "strides": (2, 2)}),
        Case([T(f64, 1, 2, 7)], _pool1d_ceil),
        Case([T(f16, 1, 1, 5, 4, 3)], {"kernel_shape": (2, 2, 2), "strides": (2, 2, 2), "ceil_mode": 1}),
    ],
    "AveragePool": [
        Case([T(f32, 2, 3, 6, 6)], {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1)}),
        Case([T(f64, 1, 2, 7)], _avg1d_ceil),
    ],
    # grad
    "ReluGrad": [*_like, Case([T(i64, 3), T(i64, 3)])],
    "GeluGrad": _like,
    "GeluTanhGrad": _like,
    "SiluGrad": _like,
    "SquaredReluGrad": _like,
    "TanhGrad": _like,
    "SigmoidGrad": _like,
    "SoftmaxGrad": [*_like, Case([T(f32, 3, 4), T(f32, 3, 4)], {"axis": 0})],
    "LogSoftmaxGrad": [*_like, Case([T(f32, 3, 4), T(f32, 3, 4)], {"axis": 0})],
    "LayerNormalizationGrad": [
        Case([T(f32, 2, 5), T(f32, 2, 5), T(f32, 5)]),
        Case([T(f64, 2, 4, 5), T(f64, 2, 4, 5), T(f64, 1, 5)], {"axis": 1}),
        Case([T(f32, 2, 5), T(f32, 2, 5), T(f32, 5)], {"zero_centered_gamma": True}),
    ],
    "RMSNormalizationGrad": [
        Case([T(f32, 2, 5), T(f32, 2, 5), T(f32, 5)]),
        Case([T(f64, 2, 4, 5), T(f64, 2, 4, 5), T(f64, 4, 1)], {"axis": -2}),
    ],
    "SoftmaxCrossEntropyLossGrad": [
        Case([T(f32), T(f32, 4, 5), R(T(i64, 4), 0, 5)]),
        Case([S(f64), T(f64, 3, 2), R(T(i64, 3), 0, 2)], {"reduction": "sum"}),
        Case([T(f64, 2, 4), T(f64, 2, 3, 4), R(T(i32, 2, 4), 0, 3)], {"reduction": "none"}),
    ],
    "NegativeLogLikelihoodLossGrad": [
        Case([T(f32), T(f32, 4, 5), R(T(i64, 4), 0, 5)]),
        Case([S(f64), T(f64, 3, 2), R(T(i64, 3), 0, 2)], {"reduction": "sum"}),
        Case([T(f64, 2, 4), T(f64, 2, 3, 4), R(T(i32, 2, 4), 0, 3)], {"reduction": "none"}),
        Case([T(f64), T(f64, 2, 3, 4), R(T(i64, 2, 3), 0, 4)], {"axis": -1}),  # classes last
        Case([T(f32, 2, 3), T(f32, 2, 3, 4), R(T(i64, 2, 3), 0, 4)], {"axis": -1, "reduction": "none"}),
    ],
    "SoftmaxCrossEntropyPartsGrad": [
        Case([T(f32, 4), T(f32, 4), T(f32, 4, 5), T(f32, 4), R(T(i64, 4), 0, 5)]),
        Case([T(f64, 3), T(f64, 3), T(f64, 3, 4), T(f64, 3), K(T(i64, 3), [3, 4, 9])], {"rows": (4, 10)}),
        Case([T(f64, 2, 3), T(f64, 2, 3), T(f64, 2, 3, 4), T(f64, 2, 3), R(T(i64, 2, 3), 0, 4)]),
    ],
    "NllLossPartsGrad": [
        Case([T(f32, 4), T(f32, 4, 5), R(T(i64, 4), 0, 5)]),
        Case([T(f64, 3), T(f64, 3, 4), K(T(i64, 3), [3, 4, 9])], {"rows": (4, 10)}),
        Case([T(f64, 2, 3), T(f64, 2, 3, 4), R(T(i64, 2, 3), 0, 4)]),
    ],
    "MSELossGrad": [
        Case([T(f32), T(f32, 4, 3), T(f32, 4, 3)]),
        Case([S(f64), T(f64, 5), T(f64, 5)], {"reduction": "sum"}),
        Case([T(f32, 2, 3), T(f32, 2, 3), T(f32, 2, 3)], {"reduction": "none"}),
    ],
    "ConvGrad": [
        Case([T(f32, 2, 4, 3, 3), T(f32, 2, 3, 5, 5), T(f32, 4, 3, 3, 3)]),
        Case(
            [T(f64, 1, 6, 3), T(f64, 1, 4, 7), T(f64, 6, 2, 3)],
            {"group": 2, "strides": (2,), "pads": (1, 2), "dilations": (2,)},
        ),
    ],
    "MaxPoolGrad": [
        Case([T(f32, 2, 3, 3, 3), T(f32, 2, 3, 6, 6)], {"kernel_shape": (2, 2), "strides": (2, 2)}),
        Case([T(f64, 1, 2, 3), T(f64, 1, 2, 7)], _pool1d_ceil),
    ],
    "AveragePoolGrad": [
        Case([T(f32, 2, 3, 6, 6), T(f32, 2, 3, 6, 6)], {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1)}),
        Case([T(f64, 1, 2, 4), T(f64, 1, 2, 7)], _avg1d_ceil),
    ],
}

__all__ = [
    "D0",
    "EXAMPLES",
    "Case",
    "In",
    "K",
    "R",
    "S",
    "T",
    "known_inputs",
    "random_inputs",
    "random_value",
]

# -- ops the model zoo and the gradient rules need ------------------------------------------------
EXAMPLES["Reshape"] += [
    Case([T(f32, 2, 3, 4)], {"shape": (0, -1, 2)}),
    Case([T(i64, 6)], {"shape": (3, 2)}),
    Case([T(f32, 2, 0, 3)], {"shape": (2, 3, 0), "allowzero": 1}),
]
EXAMPLES.update(
    {
        "Scale": [Case([T(f32, 2, 3)], {"alpha": 0.5}), Case([T(f64)], {"alpha": -3})],
        "FillLike": [
            Case([T(f32, 2, 3)]),
            Case([T(i64, 4)], {"value": 7.0}),
            Case([T(f16)], {"value": -2.5}),
        ],
        "CausalMask": [
            Case([T(f32, 3, 3)]),
            Case([T(f64, 2, 3, 4, 5)], {"fill": 0.0}),
            Case([T(f16, 1, 5, 2)], {"fill": -1e4}),
        ],
        "Expand": [
            Case([T(f32, 3, 1)], {"shape": (2, 3, 4)}),
            Case([T(i64, 4)], {"shape": (4,)}),
            Case([T(f64, 2, 5)], {"shape": (1, 1)}),
            Case([T(f32)], {"shape": (2, 0)}),
        ],
        "GatherGrad": [
            Case([T(f32, 2, 3), K(T(i64, 2), [1, 1])], {"size": 4}),
            Case([T(f64, 2, 3, 4, 5), R(T(i32, 3, 4), -6, 6)], {"axis": 1, "size": 6}),
            Case([T(f32, 4, 5), K(T(i64), 2)], {"axis": -1, "size": 3}),
            Case([T(f32, 2, 3), K(T(i64, 2), [1, 3]), T(f32, 4, 3)], {"size": 4}),  # with the data
            Case([T(f64, 2, 3), K(T(i64, 2), [1, 6]), T(f64, 3, 3)], {"size": 3, "rows": (1, 7)}),  # a piece
            # nn.Embedding's padding_idx: row 1 (of the whole table) stays zero, here and in a piece
            Case([T(f32, 3, 3), K(T(i64, 3), [1, 2, 1])], {"size": 4, "padding": 1}),
            Case(
                [T(f64, 2, 3), K(T(i64, 2), [2, 3]), T(f64, 3, 3)], {"size": 3, "rows": (1, 7), "padding": 2}
            ),
        ],
        "SliceGrad": [
            Case([T(f32, 3, 3)], {"shape": (5, 6), "starts": (1, -3), "ends": (4, 100), "axes": (0, 1)}),
            Case(
                [T(f64, 5, 2)], {"shape": (5, 6), "starts": (4,), "ends": (0,), "axes": (1,), "steps": (-2,)}
            ),
        ],
    }
)
EXAMPLES["SliceGrad"].append(Case([T(f32, 3, 3)], {"shape": (5, -1), "starts": (1,), "ends": (4,)}))

# -- attention (distir.ops.attention) -------------------------------------------------------------
# global positions of 2 queries and of 4 keys (every query sees a key under a causal mask)
QPOS = K(T(i64, 2, 2), [[3, 0], [1, 2]])
KPOS = K(T(i64, 2, 4), [[0, 1, 2, 3], [2, 0, 3, 1]])
# 8 positions in the load-balanced order over a ring of 2 (chunks 0, 3 | 1, 2): ``ring_order``
RING2 = K(T(i64, 1, 8), [[0, 1, 6, 7, 2, 3, 4, 5]])
EXAMPLES.update(
    {
        "Attention": [
            Case([T(f32, 2, 3, 4, 2), T(f32, 2, 3, 2, 2), T(f32, 2, 3, 2, 2)], {"causal": True}),
            Case([T(f64, 1, 4, 3, 5), T(f64, 1, 4, 1, 5), T(f64, 1, 4, 1, 5)], {"scale": 0.3}),
            Case([T(f16, 2, 2, 2, 4), T(f16, 2, 2, 2, 4), T(f16, 2, 2, 2, 4)]),
            # ALiBi: a slope per query head (BLOOM's)
            Case(
                [T(f32, 2, 3, 4, 2), T(f32, 2, 3, 2, 2), T(f32, 2, 3, 2, 2)],
                {"causal": True, "alibi": (0.5, 0.25, 0.125, 0.0625)},
            ),
            # a sliding window of 2 keys (Mistral's); capped scores (Gemma 2's softcapping)
            Case([T(f32, 2, 5, 4, 2), T(f32, 2, 5, 2, 2), T(f32, 2, 5, 2, 2)], {"causal": True, "window": 2}),
            Case(
                [T(f64, 2, 4, 4, 2), T(f64, 2, 4, 2, 2), T(f64, 2, 4, 2, 2)], {"causal": True, "softcap": 0.5}
            ),
            # positions: 2 queries (a context-parallel rank's, at global positions) over 4 keys
            Case([T(f32, 2, 2, 4, 2), T(f32, 2, 4, 2, 2), T(f32, 2, 4, 2, 2), QPOS, KPOS], {"causal": True}),
            Case([T(f64, 2, 2, 2, 3), T(f64, 2, 4, 1, 3), T(f64, 2, 4, 1, 3), QPOS, KPOS]),
            Case(
                [T(f64, 2, 2, 2, 3), T(f64, 2, 4, 1, 3), T(f64, 2, 4, 1, 3), QPOS, KPOS],
                {"causal": True, "alibi": (0.5, 0.25)},
            ),
            # the ring's promise (``ring=2``): the same attention, its positions in the balanced order
            Case(
                [T(f32, 1, 8, 2, 2), T(f32, 1, 8, 1, 2), T(f32, 1, 8, 1, 2), RING2, RING2],
                {"causal": True, "ring": 2},
            ),
        ],
        "AttentionGrad": [
            # dout, q, k, v, out, lse
            Case(
                [*[T(f32, 2, 3, 4, 2)] * 2, *[T(f32, 2, 3, 2, 2)] * 2, T(f32, 2, 3, 4, 2), T(f32, 2, 4, 3)],
                {"causal": True},
            ),
            Case([*[T(f64, 1, 4, 3, 2)] * 5, T(f64, 1, 3, 4)]),
            Case([*[T(f64, 1, 4, 3, 2)] * 5, T(f64, 1, 3, 4)], {"causal": True, "alibi": (0.5, 0.25, 0.125)}),
            Case([*[T(f64, 1, 4, 3, 2)] * 5, T(f64, 1, 3, 4)], {"causal": True, "window": 2}),
            Case([*[T(f64, 1, 4, 3, 2)] * 5, T(f64, 1, 3, 4)], {"causal": True, "softcap": 0.5}),
            Case(
                [
                    *[T(f64, 2, 2, 4, 2)] * 2,
                    *[T(f64, 2, 4, 2, 2)] * 2,
                    T(f64, 2, 2, 4, 2),
                    T(f64, 2, 4, 2),
                    QPOS,
                    KPOS,
                ],
                {"causal": True},
            ),
        ],
        "AttentionMerge": [
            # out1, lse1, out2, lse2
            Case([T(f32, 2, 3, 4, 2), T(f32, 2, 4, 3), T(f32, 2, 3, 4, 2), T(f32, 2, 4, 3)]),
            Case([T(f64, 1, 5, 2, 3), T(f64, 1, 2, 5), T(f64, 1, 5, 2, 3), T(f64, 1, 2, 5)]),
            Case([T(f16, 1, 2, 2, 4), T(f32, 1, 2, 2), T(f16, 1, 2, 2, 4), T(f32, 1, 2, 2)]),
        ],
        "Rope": [
            Case([T(f32, 2, 5, 3, 4)]),
            Case([T(f64, 1, 3, 2, 6)], {"theta": 500000.0, "inverse": True}),
            Case([T(f64, 2, 4, 3, 6)], {"halves": True}),
            Case([T(f32, 1, 5, 2, 4)], {"halves": True, "freqs": (1.0, 0.05), "inverse": True}),
            Case([T(f32, 2, 3, 2, 4)], {"offset": 5}),
            Case([T(f32, 1, 3, 2, 4)], {"halves": True, "offset": 2}),
            Case([T(f64, 2, 2, 3, 4), QPOS]),
            Case([T(f32, 2, 2, 3, 4), QPOS], {"halves": True, "inverse": True}),
        ],
    }
)

# -- dropout (distir.ops.nn): the reference runs p = 0 only; DropoutGrad any p --------------------
EXAMPLES.update(
    {
        "Dropout": [
            Case([T(f32, 2, 3)], {"p": 0.0}),
            Case([T(f64, 4, 1, 5)], {"p": 0.0}),
            Case([T(f16)], {"p": 0.0}),
        ],
        "DropoutGrad": [
            Case([T(f32, 2, 3), T(b, 2, 3)], {"p": 0.1}),
            Case([T(f64, 4, 5), T(b, 4, 5)], {"p": 0.0}),
            Case([T(f16, 3), T(b, 3)], {"p": 0.5}),
        ],
    }
)

# -- mixture of experts (distir.ops.moe): X, Wg (E, H), W1, W3 (E, F, H), W2 (E, H, F) ------------
EXAMPLES.update(
    {
        "MoE": [
            Case(
                [T(f32, 2, 3, 4), T(f32, 4, 4), T(f32, 4, 5, 4), T(f32, 4, 5, 4), T(f32, 4, 4, 5)],
                {"top_k": 2},
            ),
            Case(
                [T(f64, 6, 3), T(f64, 3, 3), T(f64, 3, 2, 3), T(f64, 3, 2, 3), T(f64, 3, 3, 2)],
                {"top_k": 1, "normalize": False},
            ),
        ],
        "MoEGrad": [
            Case(
                [
                    T(f32, 2, 3, 4),
                    T(f32, 2, 3, 4),
                    T(f32, 4, 4),
                    T(f32, 4, 5, 4),
                    T(f32, 4, 5, 4),
                    T(f32, 4, 4, 5),
                ],
                {"top_k": 2},
            ),
            Case(
                [T(f64, 6, 3), T(f64, 6, 3), T(f64, 3, 3), T(f64, 3, 2, 3), T(f64, 3, 2, 3), T(f64, 3, 3, 2)],
                {"top_k": 3, "normalize": False},
            ),
        ],
    }
)
