"""Autodiff end to end: the training step's gradients equal finite differences of the forward loss,
for every zoo family at a tiny size, under every recomputation policy."""

from __future__ import annotations

import numpy as np
import pytest

from distir.autodiff.reverse import RECOMPUTE_ALL, SAVE_ALL, SELECTIVE, AutodiffError, split_weight_grad, vjp
from distir.autodiff.train import Optimizer, layer_types, layer_vjps, training_step
from distir.frontends.zoo import build_model
from distir.interp.reference import run_reference
from distir.ir.types import DType
from distir.ir.verify import verify
from distir.ops.gradrules import NotDifferentiableError

TINY = {
    "mlp": "mlp:layers=3,hidden=6",
    "gpt": "gpt:layers=2,hidden=8,heads=2,seq=4,vocab=16",
    "llama": "llama:layers=2,hidden=8,heads=4,kv_heads=2,ffn=12,vocab=16,seq=4",
    "transgan": "transgan:wide_layers=2,narrow_layers=2,dim=128,bottom=1,window=4,latent=8,heads=2",
}


def _model(family: str, batch: int = 2):
    return build_model(TINY[family], batch=batch, dtype=DType.f64)


def _loss(model, vals) -> float:
    return float(run_reference(model.module, [vals[p.name] for p in model.forward.params])[0])


@pytest.mark.slow
@pytest.mark.parametrize("recompute", ["none", "full", "selective"])
@pytest.mark.parametrize("family", sorted(TINY))
def test_sgd_step_gradients_match_finite_differences(family: str, recompute: str) -> None:
    model = _model(family)
    lr = 1.0
    step = training_step(model, Optimizer("sgd", lr=lr), recompute)
    verify(step)
    vals = model.random_inputs(seed=3)
    out = run_reference(step, [vals[p.name] for p in step.entry.params])
    assert float(out[0]) == pytest.approx(_loss(model, vals), rel=1e-12)
    rng = np.random.default_rng(0)
    for k, w in enumerate(model.weights):
        g = (vals[w.name] - out[1 + k]) / lr
        d = rng.standard_normal(g.shape)
        eps = 1e-6
        plus, minus = dict(vals), dict(vals)
        plus[w.name] = vals[w.name] + eps * d
        minus[w.name] = vals[w.name] - eps * d
        fd = (_loss(model, plus) - _loss(model, minus)) / (2 * eps)
        assert float((g * d).sum()) == pytest.approx(fd, rel=1e-5, abs=1e-8), w.name


def test_adam_step_matches_numpy_adam() -> None:
    model = _model("mlp")
    opt = Optimizer("adam", lr=0.01)
    sgd = training_step(model, Optimizer("sgd", lr=1.0))
    adam = training_step(model, opt)
    vals = model.random_inputs(seed=1)
    g_out = run_reference(sgd, [vals[p.name] for p in sgd.entry.params])
    rng = np.random.default_rng(5)
    for w in model.weights:
        vals[f"m_{w.name}"] = rng.standard_normal(w.type.shape) * 0.1
        vals[f"v_{w.name}"] = np.abs(rng.standard_normal(w.type.shape)) * 0.1
    vals["step"] = np.array(4, dtype=np.int64)
    a_out = run_reference(adam, [vals[p.name] for p in adam.entry.params])
    n = len(model.weights)
    for k, w in enumerate(model.weights):
        g = vals[w.name] - g_out[1 + k]
        m = 0.9 * vals[f"m_{w.name}"] + 0.1 * g
        v = 0.999 * vals[f"v_{w.name}"] + 0.001 * g * g
        new = vals[w.name] - 0.01 * (m / (1 - 0.9**4)) / (np.sqrt(v / (1 - 0.999**4)) + 1e-8)
        np.testing.assert_allclose(a_out[1 + k], new, rtol=1e-10)
        np.testing.assert_allclose(a_out[1 + n + k], m, rtol=1e-10)
        np.testing.assert_allclose(a_out[1 + 2 * n + k], v, rtol=1e-10)


def test_recompute_policies_change_what_is_saved() -> None:
    model = _model("gpt")
    types = layer_types(model)
    saved = {}
    for policy in ("none", "selective", "full"):
        grads, _ = layer_vjps(model, types, policy)
        saved[policy] = grads[1].vjp.n_residuals  # a transformer block
    assert saved["full"] == 0
    assert 0 < saved["selective"] < saved["none"]


def _block_vjp(spec: str, policy):
    model = build_model(spec, batch=2, dtype=DType.f64)
    types = layer_types(model)
    call = model.layers[1]
    fn = model.module[call.callee]
    v = vjp(model.module, fn, types[1], list(range(len(call.inputs))), policy)
    producers = {o: op.name for op in v.fwd.body for o in op.outputs}
    saved = [producers.get(r, "param") for r in v.fwd.outputs[v.n_outputs :]]
    return saved, [op.name for op in v.bwd.body]


_FORWARD_ONLY = {"LayerNormalization", "Gelu", "Softmax", "CausalMask", "Attention"}  # never in a gradient


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_selective_recomputes_only_the_attention_core_of_the_naive_form(family: str) -> None:
    """Megatron's selective recomputation: the backward re-runs QKᵀ, scale, mask, softmax (and
    ·V), nothing else; the S×S values are never saved, everything else is."""
    spec = TINY[family] + ",attention=naive"
    saved, bwd = _block_vjp(spec, SELECTIVE)
    recomputed = {n for n in bwd if n in _FORWARD_ONLY}
    assert recomputed == {"CausalMask", "Softmax"}
    assert not {"Softmax", "CausalMask", "Scale"} & set(saved)
    everything, _ = _block_vjp(spec, SAVE_ALL)
    assert "Softmax" in everything  # what selective drops: the probabilities
    assert sorted(saved) == sorted(n for n in everything if n != "Softmax")


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_selective_reruns_the_fused_attention_and_saves_the_rest(family: str) -> None:
    saved, bwd = _block_vjp(TINY[family], SELECTIVE)
    assert {n for n in bwd if n in _FORWARD_ONLY} == {"Attention"}
    assert "Attention" not in saved
    everything, bwd_all = _block_vjp(TINY[family], SAVE_ALL)
    assert not {n for n in bwd_all if n in _FORWARD_ONLY}
    assert everything.count("Attention") == 2  # out and lse
    assert sorted(saved) == sorted(n for n in everything if n != "Attention")


def test_full_recomputation_saves_only_the_layer_input() -> None:
    saved, bwd = _block_vjp(TINY["gpt"], RECOMPUTE_ALL)
    assert saved == []
    assert {"LayerNormalization", "Gelu", "Attention"} <= set(bwd)


def test_split_weight_grad_computes_the_same_gradients() -> None:
    model = _model("gpt")
    types = layer_types(model)
    call = model.layers[1]
    fn = model.module[call.callee]
    wrt = list(range(len(call.inputs)))
    v = vjp(model.module, fn, types[1], wrt, SAVE_ALL)
    bi, bw = split_weight_grad(v.bwd, 1)
    # the weight part holds every op that only feeds weight gradients, and nothing else
    assert len(bi.body) + len(bw.body) == len(v.bwd.body)
    assert {op.name for op in bw.body} <= {"MatMul", "Transpose", "Reshape", "ReduceSum", "Add", "Expand"}
    from distir.ir.function import Module

    mod = Module((v.fwd, v.bwd, bi, bw))
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(t.shape) for t in types[1]]
    fwd_args = run_reference(mod, args, fn=v.fwd)
    dy = rng.standard_normal(np.shape(fwd_args[0]))
    b_args = [args[j] for j in v.bwd_params] + list(fwd_args[v.n_outputs :]) + [dy]
    full = run_reference(mod, b_args, fn=v.bwd)
    first = run_reference(mod, b_args, fn=bi)
    rest = run_reference(mod, list(first[1:]), fn=bw)
    np.testing.assert_allclose(first[0], full[0], rtol=1e-12)
    for a, b in zip(rest, full[1:], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_recompute_all_saves_nothing_and_same_gradients() -> None:
    model = _model("mlp")
    types = layer_types(model)
    call = model.layers[1]
    fn = model.module[call.callee]
    a = vjp(model.module, fn, types[1], [0, 1], SAVE_ALL)
    b = vjp(model.module, fn, types[1], [0, 1], RECOMPUTE_ALL)
    assert a.n_residuals > 0 and b.n_residuals == 0


def test_errors_name_the_problem() -> None:
    model = _model("gpt")
    types = layer_types(model)
    embed = model.module[model.layers[0].callee]
    with pytest.raises(AutodiffError, match="not a floating-point tensor"):
        vjp(model.module, embed, types[0], [0])
    with pytest.raises(AutodiffError, match="recompute must be one of"):
        layer_vjps(model, types, "sometimes")
    with pytest.raises(AutodiffError, match="optimizer must be sgd or adam"):
        Optimizer("lamb")
    from distir.ir.builder import FunctionBuilder
    from distir.ir.function import Module
    from distir.ir.types import Device, TensorType
    from distir.ops.registry import REGISTRY

    fb = FunctionBuilder("f", REGISTRY.out_arity)
    x = fb.param("x")
    (y,) = fb.op("ReluGrad", x, x)
    f = fb.ret(y)
    with pytest.raises(NotDifferentiableError, match="ReluGrad has no gradient rule"):
        vjp(Module((f,)), f, [TensorType(DType.f64, (3,), Device(0))], [0])
