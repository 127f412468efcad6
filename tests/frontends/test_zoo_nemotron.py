"""The zoo's Nemotron family (``distir.frontends.zoo.nemotron``): the published parameter counts,
the tiny model against a numpy Nemotron written here in Megatron-Core's layout (LayerNorm1p,
squared ReLU, partial RoPE rotating the first channels of each head in halves), the ops it is
made of, and its distributed training step against the sequential one."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import pytest

import distir
from distir.frontends.zoo import ModelError, build_model
from distir.frontends.zoo.nemotron import rope_freqs
from distir.frontends.zoo.registry import ZOO, zoo_table
from distir.ir.types import Device, DType, TensorType
from distir.parallel.check import check_against_sequential
from distir.parallel.strategy import parse_strategy

from .test_zoo_numeric import cross_entropy_sum, run, values

TINY = "nemotron:layers=2,hidden=32,heads=4,kv_heads=2,ffn=24,vocab=32,seq=8"


def test_published_parameter_count() -> None:
    """Nemotron-4 340B: 9.4B embedding and 331.6B non-embedding parameters (NVIDIA, "Nemotron-4
    340B Technical Report", 2024, Table 1)."""
    params = {r.name: r.params for r in zoo_table()}
    c = ZOO["nemotron-340b"].config
    emb = 2 * c.vocab * c.hidden  # untied: the token embedding and the output layer
    assert round(emb / 1e8) == 94
    assert round((params["nemotron-340b"] - emb) / 1e8) == 3316


def layer_norm_1p(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * (1.0 + w) + b


def partial_rope(x: np.ndarray, theta: float, rot: int) -> np.ndarray:
    """(S, d): Megatron-Core's rotation of the first ``rot`` channels in halves (``rotate_half``:
    channel i with i + rot/2, turned by s·theta^(-2i/rot) at position s), the rest as they are."""
    s = x.shape[0]
    half = rot // 2
    ang = np.outer(np.arange(s), theta ** (-2.0 * np.arange(half) / rot))
    a, b = x[:, :half], x[:, half:rot]
    out = x.copy()
    out[:, :half] = a * np.cos(ang) - b * np.sin(ang)
    out[:, half:rot] = b * np.cos(ang) + a * np.sin(ang)
    return out


def causal_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, heads: int, kv_heads: int, rotate: Any
) -> Any:
    """Per batch element and query head h (kv group g): softmax(rotate(q_h) rotate(k_g)^T /
    sqrt(d), causal) v_g."""
    b, s, hidden = q.shape
    d = hidden // heads
    out = np.zeros_like(q)
    for n in range(b):
        for h in range(heads):
            g = h // (heads // kv_heads)
            qh, kg = rotate(q[n, :, h * d : (h + 1) * d]), rotate(k[n, :, g * d : (g + 1) * d])
            scores = qh @ kg.T / math.sqrt(d) + np.triu(np.full((s, s), -np.inf), 1)
            p = np.exp(scores - scores.max(-1, keepdims=True))
            out[n, :, h * d : (h + 1) * d] = (p / p.sum(-1, keepdims=True)) @ v[n, :, g * d : (g + 1) * d]
    return out


def megatron_columns(d: int, rot: int) -> np.ndarray:
    """Megatron-Core's head channel m is the zoo's channel ``perm[m]``: the zoo rotates the pairs
    (i, i + d/2) of its first rot/2 frequencies and passes the other channels through."""
    half = rot // 2
    rest = [*range(half, d // 2), *range(d // 2 + half, d)]
    return np.array([*range(half), *range(d // 2, d // 2 + half), *rest])


def numpy_nemotron(c: dict[str, Any], w: dict[str, np.ndarray]) -> tuple[np.ndarray, float]:
    heads, kv_heads = c["heads"], c["kv_heads"]
    d = c["hidden"] // heads
    rot = d * c["rotary_percent"] // 100
    perm = megatron_columns(d, rot)
    x = w["tok_emb"][w["ids"]]
    for i in range(c["layers"]):
        h = layer_norm_1p(x, w[f"ln1_scale_{i}"], w[f"ln1_bias_{i}"])
        q, k, v = h @ w[f"wq_{i}"], h @ w[f"wk_{i}"], h @ w[f"wv_{i}"]
        q = np.concatenate([q[..., j * d + perm] for j in range(heads)], axis=-1)
        k = np.concatenate([k[..., j * d + perm] for j in range(kv_heads)], axis=-1)
        a = causal_attention(q, k, v, heads, kv_heads, lambda t: partial_rope(t, c["rope_theta"], rot))
        x = x + a @ w[f"wo_{i}"]
        h = layer_norm_1p(x, w[f"ln2_scale_{i}"], w[f"ln2_bias_{i}"])
        x = x + np.maximum(h @ w[f"w1_{i}"], 0.0) ** 2 @ w[f"w2_{i}"]
    logits = layer_norm_1p(x, w["lnf_scale"], w["lnf_bias"]) @ w["wlm"]
    return logits, cross_entropy_sum(logits, w["labels"]) / w["ids"].size


@pytest.mark.parametrize("spec", [TINY, f"{TINY},attention=naive", f"{TINY},rotary_percent=100"])
def test_tiny_nemotron_matches_numpy(spec: str) -> None:
    m = build_model(spec, 2, DType.f64)
    distir.check(m.module)
    for seed in (0, 1):
        vals = values(m, seed)
        got = run(m, vals)
        want_out, want_loss = numpy_nemotron(dict(m.config), vals)
        np.testing.assert_allclose(got[-2], want_out, rtol=1e-9, atol=1e-9)
        assert float(got[-1]) == pytest.approx(want_loss, rel=1e-9)


def test_the_layer_is_one_kernel_per_piece() -> None:
    """One SquaredRelu per layer, its gradient one SquaredReluGrad of its input; LayerNorm1p as
    LayerNormalization with zero_centered_gamma (scales stored 0); no bias on any product; the
    partial rotation as Rope's frequencies, a quarter of the head's channels' pairs left as
    they are (50%: half the pairs)."""
    from distir.autodiff.reverse import vjp

    m = build_model(TINY, 2)
    block = next(f for f in m.module.functions if f.name == "block")
    names = Counter(op.name for op in block.ops())
    assert names["SquaredRelu"] == 1 and names["MatMul"] == 6
    assert names["Add"] == 2  # the two residuals only: no linear bias
    norms = [op for op in block.ops() if op.name == "LayerNormalization"]
    assert len(norms) == 2 and all(op.attrs["zero_centered_gamma"] for op in norms)
    d = 32 // 4
    freqs = rope_freqs(d, 50, 10000.0)
    assert freqs is not None and sum(f == 0.0 for f in freqs) == d // 4
    assert [op.attrs["freqs"] for op in block.ops() if op.name == "Rope"] == [freqs, freqs]
    scales = [w for w in m.weights if "scale" in w.name]
    assert scales and all(w.init_value == 0.0 for w in scales)
    layer = {w.name: w.type for w in m.weights}
    x = TensorType(DType.f32, (2, 8, 32), Device(0))
    types = [x, *(layer[f"{p.name}_0"] for p in block.params[1:])]
    bwd = vjp(m.module, block, types, list(range(len(block.params)))).bwd
    grads = [op for op in bwd.ops() if op.name == "SquaredReluGrad"]
    assert len(grads) == 1 and not any(op.name == "ReluGrad" for op in bwd.ops())


def test_rotary_percent_must_rotate_whole_pairs() -> None:
    with pytest.raises(ModelError, match="rotary_percent"):
        build_model("nemotron:layers=1,hidden=32,heads=4,kv_heads=4,ffn=8,vocab=8,seq=4,rotary_percent=30", 1)
    with pytest.raises(ModelError, match="rotary_percent"):
        build_model("nemotron-8b:rotary_percent=150", 1)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["d1.t2.sp.p2.k2.1f1b", "d2.t2.sp.p2.k2.1f1b.z1"])
def test_distributed_step_matches_sequential(strategy: str) -> None:
    """Tensor parallelism with sequence parallelism and two pipeline stages train the tiny
    Nemotron as the sequential step does (reference executor, f64; ``qkv=fused`` as NeMo runs it)."""
    s = parse_strategy(strategy)
    spec = "nemotron:layers=2,hidden=16,heads=4,kv_heads=2,ffn=12,vocab=16,seq=4,qkv=fused"
    model = build_model(spec, batch=s.k * s.d, dtype=DType.f64)
    cmp = check_against_sequential(model, s)
    assert cmp.max_rel_diff < 1e-7, f"{spec} {s}: {cmp.worst} differs by {cmp.max_rel_diff:.2e}"
    assert math.isfinite(cmp.max_rel_diff)
