"""The rotary embedding written out in an ONNX graph as the fused ``Rope``
(``distir.frontends.onnx_import.rope``): the tables lined up with x's positions and features fuse
and compute what onnxruntime does; tables indexed by something else (positions broadcast against
the frequencies element by element, or lined up with the heads) stay as written, and still match."""

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

H, S, D = 4, 4, 8  # S == D / 2 and H == S: the misaligned tables type as well as the right ones


def _graph(positions: list[int]) -> bytes:
    """x (1, H, S, D) · cos + rotate_half(x) · sin, the positions 0 … S − 1 unsqueezed at
    ``positions`` (Hugging Face's: [0, 2], a (1, S, 1) column) before the product with the
    frequencies."""
    half = D // 2
    ints = {"zero": 0, "s": S, "one": 1}
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in ints.items()]
    vecs = {"pax": positions, "ax1": [1], "ax3": [3], "lo": [0], "mid": [half], "hi": [D]}
    inits += [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in vecs.items()]
    inits.append(numpy_helper.from_array(np.array([1.0, 0.3, 0.1, 0.03], np.float32), "inv_freq"))
    nodes: list[Any] = [
        helper.make_node("Range", ["zero", "s", "one"], ["ar"]),
        helper.make_node("Unsqueeze", ["ar", "pax"], ["ar2"]),
        helper.make_node("Cast", ["ar2"], ["pos"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["pos", "inv_freq"], ["f"]),
        helper.make_node("Concat", ["f", "f"], ["emb"], axis=-1),
        helper.make_node("Cos", ["emb"], ["c"]),
        helper.make_node("Sin", ["emb"], ["sn"]),
        helper.make_node("Unsqueeze", ["c", "ax1"], ["cu"]),
        helper.make_node("Unsqueeze", ["sn", "ax1"], ["su"]),
        helper.make_node("Slice", ["x", "lo", "mid", "ax3"], ["x1"]),
        helper.make_node("Slice", ["x", "mid", "hi", "ax3"], ["x2"]),
        helper.make_node("Neg", ["x2"], ["nx2"]),
        helper.make_node("Concat", ["nx2", "x1"], ["rot"], axis=-1),
        helper.make_node("Mul", ["x", "cu"], ["a"]),
        helper.make_node("Mul", ["rot", "su"], ["b"]),
        helper.make_node("Add", ["a", "b"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, H, S, D])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, H, S, D])
    return _model(nodes, [x], [y], inits)


@pytest.mark.parametrize(("positions", "fused"), [([0, 2], True), ([0], False), ([1], False)])
def test_only_tables_lined_up_with_the_positions_fuse_and_every_form_matches_onnxruntime(
    positions: list[int], fused: bool
) -> None:
    data = _graph(positions)
    imp = import_onnx(data, layers=False)
    names = [i.name for f in imp.module.functions for i in f.body if isinstance(i, Op)]
    assert ("Rope" in names) is fused and ("Cos" not in names) is fused
    xv = np.random.default_rng(0).standard_normal((1, H, S, D)).astype(np.float32)
    got = run_reference(distir.check(imp.module), imp.arguments({"x": xv}))
    np.testing.assert_allclose(np.asarray(got[0]), _ort(data, {"x": xv})[0], rtol=1e-5, atol=1e-6)
