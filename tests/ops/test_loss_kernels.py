"""SoftmaxCrossEntropyParts is costed as the kernels that run it. Unfused, it is Megatron-LM's
vocabulary-parallel cross entropy after the max (``megatron/core/tensor_parallel/
cross_entropy.py``, counted by hand): ``logits -= max`` (read, write), ``torch.exp(logits,
out=logits)`` (read, write), ``.sum(-1)`` (read), the gather of the picked logits (one score per
row) and ``exp.div_(sum)`` (read, write) — 4 reads and 3 writes of the fp32 scores. Fused
(``acc=f32``: flash-attn's xentropy kernel), it reads the scores once. The values it computes
do not depend on the form."""

from __future__ import annotations

import numpy as np
import pytest

from distir.hardware.cluster import parse_cluster
from distir.ir.types import Device, DType, TensorType
from distir.ir.values import Attrs
from distir.ops.registry import REGISTRY
from distir.sim.cost import RooflineCostModel

ROWS, CLASSES = 512, 4096


def _types(dtype: DType) -> tuple[list[TensorType], list[TensorType]]:
    d = Device(0)
    scores = TensorType(dtype, (ROWS, CLASSES), d)
    shift = TensorType(dtype, (ROWS,), d)
    labels = TensorType(DType.i64, (ROWS,), d)
    acc = DType.f32
    return [scores, shift, labels], [TensorType(acc, (ROWS,), d), TensorType(acc, (ROWS,), d)]


def test_unfused_parts_move_megatrons_bytes() -> None:
    ins, outs = _types(DType.f32)
    op, attrs = REGISTRY["SoftmaxCrossEntropyParts"], Attrs()
    scores = ROWS * CLASSES * 4
    vectors_in = ROWS * 4 + ROWS * 8  # the max and the labels
    assert op.bytes_read(ins, outs, attrs) == 4 * scores + vectors_in
    assert op.bytes_written(ins, outs, attrs) == 3 * scores + 2 * ROWS * 4


def test_fused_parts_read_the_scores_once() -> None:
    ins, outs = _types(DType.bf16)
    op, attrs = REGISTRY["SoftmaxCrossEntropyParts"], Attrs({"acc": DType.f32})
    assert op.bytes_read(ins, outs, attrs) == ROWS * CLASSES * 2 + ROWS * 2 + ROWS * 8
    assert op.bytes_written(ins, outs, attrs) == 2 * ROWS * 4


def test_the_unfused_time_is_its_bytes_over_the_bandwidth() -> None:
    ins, outs = _types(DType.f32)
    cl = parse_cluster("h100")
    spec = cl.device_spec(0)
    op = REGISTRY["SoftmaxCrossEntropyParts"]
    t = RooflineCostModel(cl).compute_time(op, ins, outs, Attrs(), 0)
    nbytes = 7 * ROWS * CLASSES * 4 + ROWS * 12 + ROWS * 8
    assert t == pytest.approx(spec.launch_overhead_s + nbytes / (spec.memory_bandwidth * 0.8), rel=1e-12)


def test_the_form_changes_no_value() -> None:
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((4, 7)).astype(np.float32)
    shift = scores.max(-1)
    labels = rng.integers(0, 7, 4)
    ref = REGISTRY["SoftmaxCrossEntropyParts"].reference
    assert ref is not None
    plain = ref([scores, shift, labels], Attrs())
    fused = ref([scores, shift, labels], Attrs({"acc": DType.f32}))
    for a, b in zip(plain, fused, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    e = np.exp(scores.astype(np.float64) - shift[:, None])
    np.testing.assert_allclose(plain[0], e.sum(-1), rtol=1e-6)
