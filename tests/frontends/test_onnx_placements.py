"""Tensor-parallel placements of an ONNX graph's weights by the modules reading them
(``distir.frontends.onnx_import.placements``): the node scopes name a renamed weight, and a
matrix read transposed takes the other dim."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from distir.frontends.onnx_import import import_onnx  # noqa: E402
from distir.ir.dtensor import Shard  # noqa: E402

from .test_onnx_import import _model  # noqa: E402


def _scoped(node: Any, scope: str) -> Any:
    entry = node.metadata_props.add()
    entry.key = "pkg.torch.onnx.name_scopes"
    entry.value = repr(["", "blk", scope, f"{scope}.node"])  # the last: the node itself
    return node


def _init(name: str, *shape: int) -> Any:
    rng = np.random.default_rng(len(name) + sum(shape))
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)


def test_weights_are_named_by_their_modules_and_placed_in_the_layout_they_are_read() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    nodes = [
        # (in, out) as MatMul's B: column-parallel is Shard(1), its bias Shard(0)
        _scoped(helper.make_node("MatMul", ["x", "val_1"], ["h"]), "blk.up_proj"),
        _scoped(helper.make_node("Add", ["h", "val_2"], ["hb"]), "blk.up_proj"),
        # (out, in) read by Gemm(transB=1): row-parallel is Shard(1) of what is stored
        _scoped(helper.make_node("Gemm", ["hb", "val_3"], ["g"], transB=1), "blk.down_proj"),
        # (in, out) through a Transpose: q_proj column-parallel is Shard(0) of the stored (out, in)
        _scoped(helper.make_node("Transpose", ["val_4"], ["w4t"], perm=[1, 0]), "blk.q_proj"),
        _scoped(helper.make_node("MatMul", ["g", "w4t"], ["q"]), "blk.q_proj"),
        # a matrix of no pattern stays whole
        _scoped(helper.make_node("MatMul", ["q", "val_5"], ["y"]), "blk.gate"),
    ]
    inits = [_init("val_1", 4, 6), _init("val_2", 6), _init("val_3", 4, 6), _init("val_4", 4, 4)]
    inits.append(_init("val_5", 4, 4))
    tp = dict(import_onnx(_model(nodes, [x], [y], inits), layers=False).tp)
    assert tp == {"val_1": Shard(1), "val_2": Shard(0), "val_3": Shard(1), "val_4": Shard(0)}


def test_a_weight_read_in_ways_that_disagree_stays_whole() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    nodes = [
        _scoped(helper.make_node("MatMul", ["x", "w"], ["h"]), "blk.up_proj"),  # column: Shard(1)
        _scoped(helper.make_node("MatMul", ["h", "w"], ["y"]), "blk.down_proj"),  # row: Shard(0)
    ]
    assert import_onnx(_model(nodes, [x], [y], [_init("w", 4, 4)]), layers=False).tp == ()
