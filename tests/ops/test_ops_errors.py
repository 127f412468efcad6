"""Bad inputs make a rule raise ``OpTypeError`` that names the problem and says what was expected
and what it got (and which input, where there is one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from ops_examples import D0, S, T, b, f16, f32, f64, i32, i64

from distir.ir.types import Device, TensorType, Type
from distir.ir.values import Attrs
from distir.ir.verify import OpSignatureError
from distir.ops import REGISTRY, OpTypeError


@dataclass
class Bad:
    op: str
    types: list[Type]
    match: str  # a regex the message must contain
    expected: Any
    actual: Any
    index: int | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    known: dict[int, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.op}:{self.match}"


BAD = [
    Bad("MatMul", [T(f32, 2, 3), T(f32, 4, 5)], "contraction mismatch", 3, 4, 1),
    Bad("MatMul", [T(f32, 2, 3), T(f64, 3, 5)], "dtype", f32, f64, 1),
    Bad("MatMul", [T(f32, 2, 2, 3), T(f32, 3, 3, 4)], "does not broadcast", (2,), (3,)),
    Bad("MatMul", [T(f32, 3), T(f32, 3, 5)], "transA needs an operand", "rank >= 2", 1, 0, {"transA": 1}),
    Bad("MatMul", [T(f32, 2, 3), T(f32, 3, 5)], "contraction mismatch", 2, 3, 1, {"transA": 1}),
    Bad("Gemm", [T(f32, 2, 3), T(f32, 4, 3)], "contraction mismatch", 3, 4, 1),
    Bad("Gemm", [T(f32, 2, 3), T(f32, 3, 4), T(f32, 3)], "bias", (2, 4), (3,), 2),
    Bad("Concat", [T(f32, 2, 3), T(f32, 2, 4)], "does not match", (2, 3), (2, 4), 1, {"axis": 0}),
    Bad("Concat", [T(f32, 2, 3), T(i64, 2, 3)], "dtype", f32, i64, 1, {"axis": 0}),
    Bad("Reshape", [T(f32, 2, 3), T(i64, 1)], "cannot reshape", 6, 5, 1, known={1: [5]}),
    Bad(
        "Reshape",
        [T(f32, 2, 3), T(i64, 2)],
        "cannot reshape",
        "sizes dividing 6",
        [4, -1],
        1,
        known={1: [4, -1]},
    ),
    Bad(
        "Reshape",
        [T(f32, 2, 3), T(i64, 2)],
        "more than one -1",
        "at most one -1",
        [-1, -1],
        1,
        known={1: [-1, -1]},
    ),
    Bad("Where", [T(f32, 2), T(f32, 2), T(f32, 2)], "condition must be bool", b, f32, 0),
    Bad("Cast", [T(f32, 2)], "unknown dtype 'f128'", "a DType", "f128", attrs={"to": "f128"}),
    Bad("Split", [T(f32, 10)], "do not add up", 10, 7, 0, {"sizes": (3, 4)}),
    Bad("Gather", [T(f32, 4, 3), T(i64, 2)], "out of range", "-4..3", [1, 4], 1, known={1: [1, 4]}),
    Bad("Gather", [T(f32, 4, 3), T(f32, 2)], "indices must be integers", "an int dtype", f32, 1),
    Bad("Add", [T(f32, 2, 3), T(f32, 4)], "does not broadcast", (2, 3), (4,), 1),
    Bad("Sqrt", [T(i64, 2)], "floating-point", "a float dtype", i64, 0),
    Bad("ReduceSum", [T(f32, 2, 3)], "out of range", "-2..1", 2, attrs={"axes": (2,)}),
    Bad("ReduceMean", [T(f32, 2, 3)], "repeat", "distinct axes", [1, -1], attrs={"axes": (1, -1)}),
    Bad("ReduceSum", [T(b, 2)], "numeric", "a numeric dtype", b, 0),
    Bad("Softmax", [T(i32, 2, 3)], "floating-point", "a float dtype", i32, 0),
    Bad("Softmax", [T(f32)], "rank >= 1", "rank >= 1", 0, 0),
    Bad("LayerNormalization", [T(f32, 2, 5), T(f32, 4)], "Scale of shape", (5,), (4,), 1),
    Bad("LayerNormalization", [T(f32, 2, 5), T(f32, 2, 5)], "Scale of shape", (5,), (2, 5), 1),
    Bad("LayerNormalization", [T(f32, 2, 5), T(f32, 5), T(f32, 3)], "B of shape", (5,), (3,), 2),
    Bad("LayerNormalization", [T(f32, 2, 5), T(f16, 5)], "dtype", f32, f16, 1),
    Bad(
        "RMSNormalization", [T(f32, 2, 5), T(f32, 5)], "axis 2 is out of range", "-2..1", 2, attrs={"axis": 2}
    ),
    Bad("SoftmaxCrossEntropyLoss", [T(f32, 4, 5), T(i64, 3)], "labels of shape", (4,), (3,), 1),
    Bad(
        "SoftmaxCrossEntropyLoss",
        [T(f32, 4, 5), T(f32, 4)],
        "labels must be integers",
        "an int dtype",
        f32,
        1,
    ),
    Bad("SoftmaxCrossEntropyLoss", [T(f32, 4), T(i64, 4)], "rank >= 2", "rank >= 2", 1, 0),
    Bad(
        "SoftmaxCrossEntropyLoss",
        [T(f32, 2, 5), T(i64, 2)],
        "label 5 is out of range",
        "0..4",
        [5],
        1,
        known={1: [0, 5]},
    ),
    Bad("MSELoss", [T(f32, 2, 3), T(f32, 3, 2)], "shape", (2, 3), (3, 2), 1),
    Bad("SoftmaxCrossEntropyLossGrad", [T(f32, 4), T(f32, 4, 5), T(i64, 4)], "dLoss has shape", (), (4,), 0),
    Bad(
        "SoftmaxCrossEntropyLossGrad",
        [T(f32), T(f32, 4, 5), T(i64, 4)],
        "dLoss has shape",
        (4,),
        (),
        0,
        {"reduction": "none"},
    ),
    Bad("MSELossGrad", [S(f64), T(f32, 3), T(f32, 3)], "dtype", f32, f64, 0),
    Bad("TanhGrad", [T(f32, 3), T(f32, 4)], "shapes differ", (3,), (4,), 1),
    Bad("LayerNormalizationGrad", [T(f32, 2, 5), T(f32, 2, 4), T(f32, 5)], "shape", (2, 5), (2, 4), 1),
    Bad(
        "Adam",
        [T(f32, 3), T(f32, 3), T(f32, 3), T(f32, 3), T(f32)],
        "step must be an integer",
        "Scalar[i64] or Tensor[i64, ()]",
        T(f32),
        4,
    ),
    Bad(
        "Adam",
        [T(f32, 3), T(f32, 3), T(f32, 3), T(f32, 3), T(i64, 1)],
        "step must be an integer",
        "Scalar[i64] or Tensor[i64, ()]",
        T(i64, 1),
        4,
    ),
    Bad(
        "Adam",
        [T(f32, 3), T(f32, 3), T(f32, 3), T(f32, 3), S(i64)],
        "counts from 1",
        ">= 1",
        0,
        4,
        known={4: 0},
    ),
    Bad("Adam", [T(f32, 3), T(f32, 3), T(f32, 2), T(f32, 3), S(i64)], "shape", (3,), (2,), 2),
    Bad(
        "Adam",
        [T(f32, 3), T(f32, 3), T(f32, 3), T(f32, 3), S(i64)],
        "beta1 must be in",
        "[0, 1)",
        1.0,
        attrs={"beta1": 1.0},
    ),
]


def infer(
    op: str, types: list[Type], attrs: dict[str, Any] | None = None, known: dict[int, Any] | None = None
) -> tuple[Type, ...]:
    k = [None if (known or {}).get(i) is None else np.asarray((known or {})[i]) for i in range(len(types))]
    return REGISTRY[op].infer_types(types, Attrs(attrs or {}), k)


@pytest.mark.parametrize("bad", BAD, ids=[x.id for x in BAD])
def test_bad_input_raises_op_type_error(bad: Bad) -> None:
    with pytest.raises(OpTypeError, match=bad.match) as info:
        infer(bad.op, bad.types, bad.attrs, bad.known)
    e = info.value
    assert e.expected is not None and e.actual is not None
    assert e.expected == bad.expected
    assert e.actual == bad.actual
    if bad.index is not None:
        assert e.index == bad.index


def test_each_bad_case_is_one_fix_away_from_valid() -> None:
    """Guard against cases that fail for another reason: fixing the one problem makes them pass."""
    fixed: dict[str, tuple[list[Type], dict[str, Any], dict[int, Any]]] = {
        "MatMul": ([T(f32, 2, 3), T(f32, 3, 5)], {}, {}),
        "Concat": ([T(f32, 2, 3), T(f32, 4, 3)], {"axis": 0}, {}),
        "Reshape": ([T(f32, 2, 3), T(i64, 2)], {}, {1: [3, -1]}),
        "Where": ([T(b, 2), T(f32, 2), T(f32, 2)], {}, {}),
        "Cast": ([T(f32, 2)], {"to": f16}, {}),
        "Split": ([T(f32, 10)], {"sizes": (3, 7)}, {}),
        "SoftmaxCrossEntropyLoss": ([T(f32, 4, 5), T(i64, 4)], {}, {1: [0, 4, 1, 2]}),
        "Adam": ([T(f32, 3), T(f32, 3), T(f32, 3), T(f32, 3), S(i64)], {}, {4: 1}),
    }
    for op, (types, attrs, known) in fixed.items():
        assert infer(op, types, attrs, known)


def test_ops_reject_inputs_on_two_devices() -> None:
    other = TensorType(f32, (2, 3), Device(1))
    assert infer("Softmax", [other]) == (other,)  # any one device is fine
    with pytest.raises(OpTypeError, match="runs on one device") as info:
        infer("Add", [T(f32, 2, 3), other])
    assert info.value.expected == D0 and info.value.actual == Device(1)


def test_attribute_schema_rejects_bad_choices_and_kinds() -> None:
    with pytest.raises(OpSignatureError, match="keepdims"):
        REGISTRY["ReduceSum"].check_attrs(Attrs({"keepdims": 2}))
    with pytest.raises(OpSignatureError, match="reduction"):
        REGISTRY["SoftmaxCrossEntropyLoss"].check_attrs(Attrs({"reduction": "avg"}))
    with pytest.raises(OpSignatureError, match="epsilon"):
        REGISTRY["LayerNormalization"].check_attrs(Attrs({"epsilon": "small"}))
    with pytest.raises(OpSignatureError, match="no attribute"):
        REGISTRY["Adam"].check_attrs(Attrs({"momentum": 0.9}))
    with pytest.raises(OpSignatureError, match=r"takes 5 inputs"):
        REGISTRY["Adam"].check_arity(4)
    with pytest.raises(OpSignatureError, match=r"takes 2\.\.3 inputs"):
        REGISTRY["LayerNormalization"].check_arity(1)


def test_reduction_outside_the_schema_fails_in_the_rule_too() -> None:
    """The rule itself checks ``reduction`` (rules run before the verifier sometimes)."""
    with pytest.raises(OpTypeError, match="reduction must be one of") as info:
        infer("MSELoss", [T(f32, 2), T(f32, 2)], {"reduction": "avg"})
    assert info.value.actual == "avg"
    assert info.value.expected == ["mean", "sum", "none"]
