"""The zoo's eager forms: llama's ``norm=composite``, ``rope=fp32``, ``silu=fused``
(torchtitan's RMSNorm module, its ``apply_rotary_emb`` and ``F.silu`` as eager PyTorch runs
them, op by op) and gpt's ``unpad=1`` (llm-foundry's copies around flash attention). They
compute what the fused forms compute (numpy, without RMSNorm's epsilon, which the composite
leaves out), cast to f32 and back only in a low-precision model, and cost what their kernels
move: the bytes of each op counted by hand from its shapes and dtypes, over the GPU's bandwidth
at the cost model's efficiency, plus one launch per kernel."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import distir
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.interp.loop import interpret
from distir.interp.shapes import TypeDomain
from distir.ir.types import Device, DType, TensorType
from distir.ops.registry import REGISTRY
from distir.sim.cost import RooflineCostModel
from frontends.test_zoo_numeric import GPT, LLAMA, numpy_gpt, numpy_llama, run, values

EAGER = f"{LLAMA},norm=composite,rope=fp32,silu=fused"


def _assert_matches_numpy(m: Any, oracle: Callable[..., tuple[np.ndarray, float]]) -> None:
    """``m`` checks, and its output and loss on the first example equal ``oracle``'s (numpy)."""
    distir.check(m.module)
    vals = values(m, 0)
    got = run(m, vals)
    want_out, want_loss = oracle(dict(m.config), vals)
    np.testing.assert_allclose(got[-2], want_out, rtol=1e-9, atol=1e-9)
    assert float(got[-1]) == pytest.approx(want_loss, rel=1e-9)


def test_eager_forms_compute_rms_norm_without_epsilon_and_rope(monkeypatch: pytest.MonkeyPatch) -> None:
    import frontends.test_zoo_numeric as oracle

    def rms_norm_no_eps(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True)) * g

    monkeypatch.setattr(oracle, "rms_norm", rms_norm_no_eps)
    m = build_model(EAGER, 3, DType.f64)
    _assert_matches_numpy(m, numpy_llama)


def _ops(spec: str, dtype: DType) -> Counter[str]:
    m = build_model(spec, 2, dtype)
    block = next(f for f in m.module.functions if f.name == "block")
    return Counter(op.name for op in block.ops())


def test_casts_only_in_a_low_precision_model() -> None:
    fused, eager = _ops(LLAMA, DType.bf16), _ops(EAGER, DType.bf16)
    # two norms (a cast in and out each) and q, k (a cast in and out each)
    assert eager["Cast"] - fused["Cast"] == 2 * 2 + 2 * 2
    assert eager["RMSNormalization"] == 0 and fused["RMSNormalization"] == 2
    assert eager["Rope"] == fused["Rope"] == 2
    assert eager["ReduceMean"] == 2 and eager["Sqrt"] == 2 and eager["Div"] == 2
    assert eager["Silu"] == fused["Silu"] == 1 and eager["Sigmoid"] == fused["Sigmoid"] == 0
    assert _ops(EAGER, DType.f32)["Cast"] == _ops(LLAMA, DType.f32)["Cast"]


def test_composite_norm_costs_its_kernels_bytes() -> None:
    """The head's RMSNorm of (B, S, h) bf16 activations on an A100: per op, bytes read and
    written by hand (n = B·S·h elements, r = B·S rows), each op one kernel."""
    b, s, h, v = 2, 64, 256, 32
    spec = f"llama:layers=1,hidden={h},heads=4,kv_heads=2,ffn=64,vocab={v},seq={s},norm=composite"
    m = build_model(spec, b, DType.bf16)
    head = next(f for f in m.module.functions if f.name == "head")
    d0 = Device(0)
    args = [TensorType(DType.bf16, shape, d0) for shape in ((b, s, h), (h,), (h, v))]
    _, env = interpret(m.module, head, args, TypeDomain())
    cluster = parse_cluster("dgx-a100")
    cost = RooflineCostModel(cluster, fuse=False)
    norm_ops = [op for op in head.ops() if op.name != "MatMul"]
    got = sum(
        cost.compute_time(
            REGISTRY[op.name], [env[x] for x in op.inputs], [env[y] for y in op.outputs], op.attrs, 0
        )
        for op in norm_ops
    )
    n, r = b * s * h, b * s
    by_hand = {  # bytes read + written
        "Cast": 2 * n + 4 * n,  # x.float()
        "Mul": 4 * n + 4 * n + 4 * n,  # x·x
        "ReduceMean": 4 * n + 4 * r,
        "Sqrt": 4 * r + 4 * r,
        "Div": 4 * n + 4 * r + 4 * n,  # x / rms
        "Cast2": 4 * n + 2 * n,  # type_as(x)
        "Mul2": 2 * n + 2 * h + 2 * n,  # · weight
    }
    spec = cluster.device_spec(0)
    want = sum(spec.launch_overhead_s + x / (spec.memory_bandwidth * 0.8) for x in by_hand.values())
    assert [op.name for op in norm_ops] == ["Cast", "Mul", "ReduceMean", "Sqrt", "Div", "Cast", "Mul"]
    assert got == pytest.approx(want, rel=1e-9)


def test_backward_of_the_fused_silu_is_one_kernel() -> None:
    """SwiGLU's silu as one op (the default): its gradient is one SiluGrad (torch's
    silu_backward), where ``silu=composite``'s a·Sigmoid(a) differentiates into a Sigmoid's
    gradient, two products and a sum."""
    from distir.autodiff.reverse import vjp

    def grads(spec: str) -> Counter[str]:
        m = build_model(spec, 2, DType.f32)
        block = next(f for f in m.module.functions if f.name == "block")
        layer = {w.name: w.type for w in m.weights}
        x = TensorType(DType.f32, (2, 8, 16), Device(0))
        types = [x, *(layer[f"{p.name}_0"] for p in block.params[1:])]
        wrt = list(range(len(block.params)))
        return Counter(op.name for op in vjp(m.module, block, types, wrt).bwd.ops())

    one, two = grads(LLAMA), grads(f"{LLAMA},silu=composite")
    assert one["SiluGrad"] == 1 and one["SigmoidGrad"] == 0
    assert two["SigmoidGrad"] == 1 and two["Mul"] - one["Mul"] == 2


def test_gpt_unpad_copies_around_attention_change_no_number() -> None:
    """llm-foundry's flash attention (``unpad=1``): q, k, v through UnpadTokens and the output
    through PadTokens in every layer; the model computes what numpy's GPT does."""
    m = build_model(f"{GPT},unpad=1", 3, DType.f64)
    distir.check(m.module)
    block = next(f for f in m.module.functions if f.name == "block")
    ops = Counter(op.name for op in block.ops())
    assert ops["UnpadTokens"] == 3 and ops["PadTokens"] == 1
    vals = values(m, 0)
    got = run(m, vals)
    want_out, want_loss = numpy_gpt(dict(m.config), vals)
    np.testing.assert_allclose(got[-2], want_out, rtol=1e-9, atol=1e-9)
    assert float(got[-1]) == pytest.approx(want_loss, rel=1e-9)


def test_kv_copy_computes_the_same_and_copies_k_and_v() -> None:
    """llama ``kv=copy`` (torchtitan's ``repeat_kv`` before SDPA): the model computes what numpy's
    Llama does (grouped heads), with one Expand of k and of v per layer, each handing the kernel
    all ``heads`` heads; the default hands it the kv heads."""
    m = build_model(f"{LLAMA},kv=copy", 3, DType.f64)
    _assert_matches_numpy(m, numpy_llama)
    assert _ops(f"{LLAMA},kv=copy", DType.bf16)["Expand"] == 2
    assert _ops(LLAMA, DType.bf16)["Expand"] == 0


def test_kv_copy_costs_a_copy_forward_and_a_sum_backward() -> None:
    """The copies' kernels move, by hand: forward each reads the kv heads (B·S·kv·d) and writes
    ``heads`` heads (B·S·heads·d); its gradient (PyTorch's expand backward, a sum over the group
    axis) reads the ``heads`` heads and writes the kv heads. bf16 on an A100, one kernel each."""
    from distir.autodiff.reverse import vjp

    b, s, heads, kv, d = 2, 64, 8, 2, 32
    spec = f"llama:layers=1,hidden={heads * d},heads={heads},kv_heads={kv},ffn=64,vocab=32,seq={s},kv=copy"
    m = build_model(spec, b, DType.bf16)
    block = next(f for f in m.module.functions if f.name == "block")
    layer = {w.name: w.type for w in m.weights}
    d0 = Device(0)
    types = [TensorType(DType.bf16, (b, s, heads * d), d0), *(layer[f"{p.name}_0"] for p in block.params[1:])]
    _, env = interpret(m.module, block, types, TypeDomain())
    cluster = parse_cluster("dgx-a100")
    cost, gpu = RooflineCostModel(cluster, fuse=False), cluster.device_spec(0)
    copies = [op for op in block.ops() if op.name == "Expand"]
    got = [
        cost.compute_time(
            REGISTRY[op.name], [env[x] for x in op.inputs], [env[y] for y in op.outputs], op.attrs, 0
        )
        for op in copies
    ]
    kv_bytes, all_bytes = 2 * b * s * kv * d, 2 * b * s * heads * d
    want = gpu.launch_overhead_s + (kv_bytes + all_bytes) / (gpu.memory_bandwidth * 0.8)
    assert got == pytest.approx([want, want], rel=1e-9)
    assert [env[op.outputs[0]].shape for op in copies] == [(b, s, kv, heads // kv, d)] * 2
    bwd = vjp(m.module, block, types, list(range(len(block.params)))).bwd
    sums = [op for op in bwd.ops() if op.name == "ReduceSum" and tuple(op.attrs["axes"]) == (3,)]
    assert len(sums) == 2
    big, small = (TensorType(DType.bf16, sh, d0) for sh in ((b, s, kv, heads // kv, d), (b, s, kv, 1, d)))
    for op in sums:
        t = cost.compute_time(REGISTRY["ReduceSum"], [big], [small], op.attrs, 0)
        assert t == pytest.approx(want, rel=1e-9)
