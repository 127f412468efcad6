"""RMSNorm written out in an ONNX graph as the fused ``RMSNormalization``
(``distir.frontends.onnx_import.rmsnorm``): the chain fuses and still computes what onnxruntime
does; a chain whose intermediate is read elsewhere stays as written."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import distir  # noqa: E402
from distir.frontends.onnx_import import import_onnx  # noqa: E402
from distir.interp.reference import run_reference  # noqa: E402
from distir.ir.ops import Op  # noqa: E402

from .test_onnx_import import _model, _ort  # noqa: E402

EPS = 1e-6


def _graph(reciprocal: str, extra: bool = False) -> bytes:
    """``w · (x · 1/√(mean(x²) + ε))`` over the last dim of x (2, 3, 8); ``extra``: the mean is
    also an output."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 8])
    one = [numpy_helper.from_array(np.array(1.0, np.float32), "one")] if reciprocal == "Div" else []
    inits = [
        numpy_helper.from_array(np.random.default_rng(0).standard_normal(8).astype(np.float32), "w"),
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(EPS, np.float32), "eps"),
        *one,
    ]
    inverse = (
        helper.make_node("Reciprocal", ["s"], ["r"])
        if reciprocal == "Reciprocal"
        else helper.make_node("Div", ["one", "s"], ["r"])
    )
    nodes: list[Any] = [
        helper.make_node("Pow", ["x", "two"], ["p"]),
        helper.make_node("ReduceMean", ["p"], ["m"], axes=[-1], keepdims=1),
        helper.make_node("Add", ["m", "eps"], ["a"]),
        helper.make_node("Sqrt", ["a"], ["s"]),
        inverse,
        helper.make_node("Mul", ["x", "r"], ["n"]),
        helper.make_node("Mul", ["w", "n"], ["y"]),
    ]
    outs = [y]
    if extra:
        outs.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, [2, 3, 1]))
    return _model(nodes, [x], outs, inits, opset=17)


@pytest.mark.parametrize("reciprocal", ["Reciprocal", "Div"])
def test_the_written_out_rms_norm_is_one_op_computing_what_onnxruntime_does(reciprocal: str) -> None:
    data = _graph(reciprocal)
    imp = import_onnx(data, layers=False)
    ops = [i for f in imp.module.functions for i in f.body if isinstance(i, Op)]
    assert [op.name for op in ops] == ["RMSNormalization"]
    assert ops[0].attrs["epsilon"] == pytest.approx(EPS)
    xv = np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32)
    got = run_reference(distir.check(imp.module), imp.arguments({"x": xv}))
    np.testing.assert_allclose(np.asarray(got[0]), _ort(data, {"x": xv})[0], rtol=1e-5, atol=1e-6)


def test_a_chain_whose_mean_is_read_elsewhere_stays_as_written() -> None:
    imp = import_onnx(_graph("Reciprocal", extra=True), layers=False)
    names = {i.name for f in imp.module.functions for i in f.body if isinstance(i, Op)}
    assert "RMSNormalization" not in names and {"Pow", "ReduceMean", "Sqrt", "Reciprocal"} <= names
