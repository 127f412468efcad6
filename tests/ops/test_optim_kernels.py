"""Adam's ``kernels`` attribute: how the update runs, for its cost. Fused, one kernel moves each
state tensor once (read w, g, m, v; write w, m, v: 7 tensors); torch.optim.AdamW(foreach=True)
and Composer's DecoupledAdamW run eight passes over the state, 12 tensors read and 8 written in
all (counted by hand from torch/optim/adamw.py ``_multi_tensor_adamw`` and Composer's
``DecoupledAdamW.adamw``). The cost model charges those bytes over the GPU's bandwidth at its
memory efficiency; the numbers do not change."""

from __future__ import annotations

import numpy as np
import pytest

from distir.autodiff.train import AutodiffError, Optimizer, update_traffic
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


def test_clip_scaling_moves_the_gradient_once_or_not_at_all() -> None:
    """``ClipByNorm``'s multiplication reads and writes the gradient (torch's ``_foreach_mul_``,
    every step); ``if_over`` (Megatron-LM's and DeepSpeed's host-side test) is not costed: no
    bytes, no kernel. ``GradNormSq`` reads the gradient once."""
    t, s = TensorType(DType.f32, (N,), Device(0)), TensorType(DType.f32, (), Device(0))
    clip, norm = REGISTRY["ClipByNorm"], REGISTRY["GradNormSq"]
    always, if_over = Attrs({"scale": "always"}), Attrs({"scale": "if_over"})
    assert clip.bytes_read([t, s], [t], always) == t.nbytes + s.nbytes
    assert clip.bytes_written([t, s], [t], always) == t.nbytes
    assert clip.bytes_read([t, s], [t], if_over) == clip.bytes_written([t, s], [t], if_over) == 0
    assert norm.bytes_read([t], [s], Attrs()) == t.nbytes
    cost = RooflineCostModel(parse_cluster("dgx-a100"))
    assert cost.compute_time(clip, [t, s], [t], if_over, 0) == 0.0
    assert cost.compute_time(clip, [t, s], [t], always, 0) > cost.compute_time(norm, [t], [s], Attrs(), 0) > 0


def test_update_traffic_counts_the_clip() -> None:
    """Per parameter, fp32 master: the norm reads the gradient (4 bytes), the scaling reads and
    writes it (8) — or nothing under ``if_over``."""
    base = update_traffic(Optimizer("adam"), DType.bf16, True)
    always = update_traffic(Optimizer("adam", max_norm=1.0), DType.bf16, True)
    if_over = update_traffic(Optimizer("adam", max_norm=1.0, clip_scale="if_over"), DType.bf16, True)
    assert always.bytes_per_param == pytest.approx(base.bytes_per_param + 12)
    assert if_over.bytes_per_param == pytest.approx(base.bytes_per_param + 4)
    assert (always.kernels, if_over.kernels) == (base.kernels + 2, base.kernels + 1)
