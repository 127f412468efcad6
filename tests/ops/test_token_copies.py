"""UnpadTokens and PadTokens (flash-attn's ``index_first_axis`` and ``pad_input`` keeping every
token): the identity on the values, each the other's gradient, costed as their copies — a
gather reads and writes each element once, a pad writes zeros then puts the rows (two writes,
a read) — counted by hand over the GPU's bandwidth at the cost model's memory efficiency."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from distir.hardware.cluster import parse_cluster
from distir.ir.types import Device, DType, TensorType
from distir.ir.values import Attrs
from distir.ops.registry import REGISTRY
from distir.sim.cost import RooflineCostModel

SHAPE = (2, 512, 16, 64)  # (B, S, heads, head_dim)


@pytest.mark.parametrize(("name", "moved"), [("UnpadTokens", 2), ("PadTokens", 3)])
def test_copies_cost_their_bytes(name: str, moved: int) -> None:
    t = TensorType(DType.bf16, SHAPE, Device(0))
    cluster = parse_cluster("dgx-a100")
    spec = cluster.device_spec(0)
    n = int(np.prod(SHAPE))
    want = spec.launch_overhead_s + moved * 2 * n / (spec.memory_bandwidth * 0.8)
    got = RooflineCostModel(cluster, fuse=False).compute_time(REGISTRY[name], [t], [t], Attrs(), 0)
    assert got == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("name", ["UnpadTokens", "PadTokens"])
def test_the_values_pass_unchanged(name: str) -> None:
    x = np.random.default_rng(0).standard_normal(SHAPE[:2])
    (y,) = REGISTRY[name].reference([x], Attrs())
    np.testing.assert_array_equal(y, x)
    assert y is not x


def test_each_is_the_others_gradient() -> None:
    from distir.autodiff.reverse import vjp
    from distir.frontends.zoo import build_model

    def grads(spec: str) -> Counter[str]:
        m = build_model(spec, 2, DType.f32)
        block = next(f for f in m.module.functions if f.name == "block")
        layer = {w.name: w.type for w in m.weights}
        x = TensorType(DType.f32, (2, 8, 16), Device(0))
        types = [x, *(layer[f"{p.name}_0"] for p in block.params[1:])]
        wrt = list(range(len(block.params)))
        return Counter(op.name for op in vjp(m.module, block, types, wrt).bwd.ops())

    got = grads("gpt:layers=1,hidden=16,heads=2,seq=8,vocab=32,unpad=1")
    assert got["PadTokens"] == 3 and got["UnpadTokens"] == 1  # q, k, v back; the output forth
