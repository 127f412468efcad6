"""Adam's ``kernels`` attribute: how the update runs, for its cost. Fused, one kernel moves each
state tensor once (read w, g, m, v; write w, m, v: 7 tensors); torch.optim.AdamW(foreach=True)
and Composer's DecoupledAdamW run eight passes over the state, 12 tensors read and 8 written in
all (counted by hand from torch/optim/adamw.py ``_multi_tensor_adamw`` and Composer's
``DecoupledAdamW.adamw``). The cost model charges those bytes over the GPU's bandwidth at its
memory efficiency; the numbers do not change."""

from __future__ import annotations

import numpy as np
import pytest

from distir.autodiff.train import AutodiffError, Optimizer
from distir.hardware.cluster import parse_cluster
from distir.ir.builder import FunctionBuilder
from distir.ir.types import Device, DType, TensorType
from distir.ir.values import Attrs
from distir.ops.registry import REGISTRY
from distir.sim.cost import RooflineCostModel

N = 1 << 20  # elements of the weight


def _time(kernels: str) -> float:
    t = TensorType(DType.f32, (N,), Device(0))
    step = TensorType(DType.i64, (), Device(0))
    attrs = Attrs({"kernels": kernels}) if kernels != "fused" else Attrs()
    cost = RooflineCostModel(parse_cluster("dgx-a100"))
    return cost.compute_time(REGISTRY["Adam"], [t, t, t, t, step], [t, t, t], attrs, 0)


@pytest.mark.parametrize(("kernels", "tensors"), [("fused", 7), ("foreach", 20), ("loop", 20)])
def test_adam_costs_the_bytes_of_its_passes(kernels: str, tensors: int) -> None:
    spec = parse_cluster("dgx-a100").device_spec(0)
    by_hand = tensors * 4 * N + (8 if kernels == "fused" else 0)  # fused also reads the i64 step
    want = spec.launch_overhead_s + by_hand / (spec.memory_bandwidth * 0.8)
    assert _time(kernels) == pytest.approx(want, rel=1e-12)


def test_the_update_is_the_same_whatever_the_kernels() -> None:
    rng = np.random.default_rng(0)
    w, g, m = (rng.standard_normal(8) for _ in range(3))
    v = rng.random(8)  # a second moment is non-negative
    ref = REGISTRY["Adam"].reference
    plain = ref([w, g, m, v, np.int64(3)], Attrs())
    foreach = ref([w, g, m, v, np.int64(3)], Attrs({"kernels": "foreach"}))
    for a, b in zip(plain, foreach, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_optimizer_writes_its_kernels_on_the_update() -> None:
    from distir.ops.registry import REGISTRY as ops

    fb = FunctionBuilder("f", ops.out_arity)
    w, g, m, v, step = (fb.param(n) for n in ("w", "g", "m", "v", "step"))
    Optimizer("adam", kernels="loop").emit(fb, w, g, [m, v], step)
    Optimizer("adam").emit(fb, w, g, [m, v], step)
    looped, fused = fb.since(0)
    assert looped.attrs.get("kernels") == "loop" and "kernels" not in fused.attrs
    with pytest.raises(AutodiffError, match="kernels"):
        Optimizer("adam", kernels="unrolled")
