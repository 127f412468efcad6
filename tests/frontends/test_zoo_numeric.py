"""The zoo builders compute what the models are: tiny configurations run on the reference
executor and are compared with straightforward numpy implementations written here (loops over
batch and heads, no reshapes), and the layer functions serve any batch size."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import distir
from distir.frontends.zoo import Model, build_model
from distir.interp.loop import interpret
from distir.interp.reference import ReferenceDomain
from distir.interp.shapes import TypeDomain, type_of
from distir.ir.types import DType, TensorType

GPT = "gpt:layers=2,hidden=16,heads=2,seq=8,vocab=32"
LLAMA = "llama:layers=2,hidden=16,heads=4,kv_heads=2,ffn=24,vocab=32,seq=8"
LLAMA_MHA = "llama:layers=1,hidden=12,heads=3,kv_heads=3,ffn=10,vocab=16,seq=5"
LLAMA_MQA = "llama:layers=1,hidden=12,heads=3,kv_heads=1,ffn=10,vocab=16,seq=5"
MLP = "mlp:layers=3,hidden=8"
TRANSGAN = "transgan:wide_layers=2,narrow_layers=1,wide=12,narrow=4,heads=2,tokens=5"
TINY = [GPT, LLAMA, LLAMA_MHA, LLAMA_MQA, MLP, TRANSGAN]
TINY += [f"{s},attention=naive" for s in (GPT, LLAMA, LLAMA_MQA, TRANSGAN)]


def values(m: Model, seed: int) -> dict[str, np.ndarray]:
    """Inputs and weights at a scale where every weight matters (not the tiny init scale)."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for i in m.inputs:
        if i.type.dtype.is_int:
            out[i.name] = rng.integers(0, i.high, size=i.type.shape)
        else:
            out[i.name] = rng.standard_normal(i.type.shape)
    for w in m.weights:
        shape = w.type.shape
        if w.init_value == 1.0:  # norm scales
            out[w.name] = 1.0 + 0.3 * rng.standard_normal(shape)
        elif len(shape) == 1:  # biases
            out[w.name] = 0.3 * rng.standard_normal(shape)
        else:
            out[w.name] = rng.standard_normal(shape) / math.sqrt(shape[0]) * 1.5
    return out


def run(m: Model, vals: dict[str, np.ndarray]) -> list[Any]:
    """Every layer's result (the last is the loss), on the reference executor."""
    args = [vals[p.name] for p in m.forward.params]
    _, env = interpret(m.module, m.forward, args, ReferenceDomain())
    return [np.asarray(env[c.outputs[0]]) for c in m.layers]


# -- numpy models -----------------------------------------------------------------------------
def layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * g + b


def rms_norm(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * g


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def rope(x: np.ndarray, theta: float) -> np.ndarray:
    """(S, d): consecutive pairs as complex numbers, the pair i at position s turned by
    s·theta^(-2i/d) (Meta's Llama ``apply_rotary_emb``)."""
    s, d = x.shape
    z = x[:, 0::2] + 1j * x[:, 1::2]
    z = z * np.exp(1j * np.outer(np.arange(s), theta ** (-np.arange(0, d, 2) / d)))
    out = np.empty_like(x)
    out[:, 0::2], out[:, 1::2] = z.real, z.imag
    return out


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    heads: int,
    kv_heads: int,
    causal: bool,
    rope_theta: float | None = None,
) -> np.ndarray:
    """Per batch element and head: softmax(q_h k_g^T / sqrt(d)) v_g with g the head's kv group
    (q_h and k_g rotated by position first when ``rope_theta`` is given)."""
    b, s, hidden = q.shape
    d = hidden // heads
    out = np.zeros_like(q)
    for n in range(b):
        for h in range(heads):
            g = h // (heads // kv_heads)
            qh, kg, vg = (
                q[n, :, h * d : (h + 1) * d],
                k[n, :, g * d : (g + 1) * d],
                v[n, :, g * d : (g + 1) * d],
            )
            if rope_theta is not None:
                qh, kg = rope(qh, rope_theta), rope(kg, rope_theta)
            scores = qh @ kg.T / math.sqrt(d)
            if causal:
                for i in range(s):
                    scores[i, i + 1 :] = -np.inf
            p = np.exp(scores - scores.max(-1, keepdims=True))
            out[n, :, h * d : (h + 1) * d] = (p / p.sum(-1, keepdims=True)) @ vg
    return out


def cross_entropy_sum(logits: np.ndarray, labels: np.ndarray) -> float:
    total = 0.0
    for n in range(labels.shape[0]):
        for t in range(labels.shape[1]):
            row = logits[n, t]
            lse = row.max() + math.log(np.exp(row - row.max()).sum())
            total += lse - row[labels[n, t]]
    return total


def gpt_block(x: np.ndarray, w: dict[str, np.ndarray], i: int, heads: int, causal: bool) -> np.ndarray:
    p = {k[: -len(f"_{i}")]: v for k, v in w.items() if k.endswith(f"_{i}")}
    h = layer_norm(x, p["ln1_scale"], p["ln1_bias"])
    q, k, v = (h @ p[f"w{c}"] + p[f"b{c}"] for c in "qkv")
    x = x + attention(q, k, v, heads, heads, causal) @ p["wo"] + p["bo"]
    h = layer_norm(x, p["ln2_scale"], p["ln2_bias"])
    return x + gelu(h @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def numpy_gpt(c: dict[str, Any], w: dict[str, np.ndarray]) -> tuple[np.ndarray, float]:
    ids = w["ids"]
    x = w["wte"][ids] + w["wpe"][: ids.shape[1]]
    for i in range(c["layers"]):
        x = gpt_block(x, w, i, c["heads"], causal=True)
    logits = layer_norm(x, w["lnf_scale"], w["lnf_bias"]) @ w["wlm"]
    return logits, cross_entropy_sum(logits, w["labels"]) / ids.size


def numpy_llama(c: dict[str, Any], w: dict[str, np.ndarray]) -> tuple[np.ndarray, float]:
    x = w["tok_emb"][w["ids"]]
    for i in range(c["layers"]):
        h = rms_norm(x, w[f"attn_norm_{i}"])
        q, k, v = h @ w[f"wq_{i}"], h @ w[f"wk_{i}"], h @ w[f"wv_{i}"]
        a = attention(q, k, v, c["heads"], c["kv_heads"], causal=True, rope_theta=c["rope_theta"])
        x = x + a @ w[f"wo_{i}"]
        h = rms_norm(x, w[f"ffn_norm_{i}"])
        a = h @ w[f"w1_{i}"]
        x = x + ((a / (1.0 + np.exp(-a))) * (h @ w[f"w3_{i}"])) @ w[f"w2_{i}"]
    logits = rms_norm(x, w["norm"]) @ w["wlm"]
    return logits, cross_entropy_sum(logits, w["labels"]) / w["ids"].size


def numpy_mlp(c: dict[str, Any], w: dict[str, np.ndarray]) -> tuple[np.ndarray, float]:
    x = w["x"]
    for i in range(c["layers"]):
        x = np.maximum(x @ w[f"w_{i}"], 0.0)
    return x, float(((x - w["y"]) ** 2).sum() / w["y"].size)


def numpy_transgan(c: dict[str, Any], w: dict[str, np.ndarray]) -> tuple[np.ndarray, float]:
    x = w["x"]
    for i in range(c["wide_layers"]):
        x = gpt_block(x, w, i, c["heads"], causal=False)
    x = x @ w["proj_w"] + w["proj_b"]
    for i in range(c["wide_layers"], c["wide_layers"] + c["narrow_layers"]):
        x = gpt_block(x, w, i, c["heads"], causal=False)
    return x, float(((x - w["y"]) ** 2).sum() / w["y"].size)


NUMPY = {"gpt": numpy_gpt, "llama": numpy_llama, "mlp": numpy_mlp, "transgan": numpy_transgan}


@pytest.mark.parametrize("spec", TINY)
def test_tiny_models_match_numpy(spec: str) -> None:
    m = build_model(spec, 3, DType.f64)
    distir.check(m.module)  # verifies and type-checks every layer
    for seed in (0, 1):
        vals = values(m, seed)
        got = run(m, vals)
        want_out, want_loss = NUMPY[str(m.config["family"])](dict(m.config), vals)
        np.testing.assert_allclose(got[-2], want_out, rtol=1e-9, atol=1e-9)
        assert got[-1].shape == ()
        assert float(got[-1]) == pytest.approx(want_loss, rel=1e-9)


def test_causal_mask_matters_in_gpt() -> None:
    """Changing a later token does not change earlier positions' logits, but changes its own."""
    m = build_model(GPT, 2, DType.f64)
    vals = values(m, 3)
    before = run(m, vals)[-2]
    vals["ids"] = vals["ids"].copy()
    vals["ids"][:, 5] = (vals["ids"][:, 5] + 1) % 32
    after = run(m, vals)[-2]
    np.testing.assert_array_equal(before[:, :5], after[:, :5])
    assert not np.allclose(before[:, 5:], after[:, 5:])


# -- batch polymorphism -----------------------------------------------------------------------
@pytest.mark.parametrize("spec", TINY)
def test_layers_do_not_bake_in_the_batch(spec: str) -> None:
    """The batch-4 module run on 2 samples gives those samples' results, and types at batch 2;
    the two microbatch losses add up to the full-batch loss."""
    m = build_model(spec, 4, DType.f64)
    vals = values(m, 5)
    full = run(m, vals)
    halves = []
    for part in (slice(0, 2), slice(2, 4)):
        sub = {k: (v[part] if k in {i.name for i in m.inputs} else v) for k, v in vals.items()}
        halves.append(run(m, sub))
    for k in range(len(m.layers) - 1):  # every activation, per sample
        np.testing.assert_allclose(
            np.concatenate([halves[0][k], halves[1][k]]), full[k], rtol=1e-12, atol=1e-12
        )
    assert float(halves[0][-1] + halves[1][-1]) == pytest.approx(float(full[-1]), rel=1e-12)
    types: list[Any] = []
    for k, p in enumerate(m.forward.params):
        t = p.type
        assert isinstance(t, TensorType)
        types.append(TensorType(t.dtype, (2, *t.shape[1:]), t.device) if k < len(m.inputs) else t)
    _, env = interpret(m.module, m.forward, types, TypeDomain())
    for c, value in zip(m.layers[:-1], full[:-1], strict=True):
        assert type_of(env[c.outputs[0]]).shape == (2, *value.shape[1:])  # type: ignore[union-attr]
    assert type_of(env[m.layers[-1].outputs[0]]).shape == ()  # type: ignore[union-attr]


def test_dropping_the_loss_layer_leaves_the_inference_program() -> None:
    m = build_model(LLAMA, 2, DType.f64)
    loss = m.layers[-1]
    assert [v.name for v in loss.inputs] == ["logits", "labels"]
    assert not set(loss.inputs) & set(m.forward.params[len(m.inputs) :])  # no weights
