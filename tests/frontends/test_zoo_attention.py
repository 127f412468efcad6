"""The zoo's two attention forms (``attention=fused|naive``): the same training step on the
reference executor, and what the fused form changes in the simulated memory — no S×S value, so
a GPT-2 step's activation memory grows linearly with the sequence, not quadratically; and the
recomputation policies order as the trainers' (none > selective > full)."""

from __future__ import annotations

import numpy as np
import pytest

from distir.autodiff.reverse import value_types
from distir.autodiff.train import Optimizer, layer_types, training_step
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.interp.reference import run_reference
from distir.ir.types import DType, TensorType
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.simulate import simulate

TINY = {
    "gpt": "gpt:layers=2,hidden=16,heads=2,seq=6,vocab=24",
    "llama": "llama:layers=2,hidden=16,heads=4,kv_heads=2,ffn=20,vocab=24,seq=6",
    "transgan": "transgan:wide_layers=1,narrow_layers=1,dim=128,bottom=1,window=4,latent=6,heads=2",
}


@pytest.mark.parametrize("family", sorted(TINY))
def test_a_fused_training_step_equals_the_naive_one(family: str) -> None:
    steps = {}
    for form in ("fused", "naive"):
        model = build_model(f"{TINY[family]},attention={form}", batch=3, dtype=DType.f64)
        step = training_step(model, Optimizer("sgd", lr=0.5))
        vals = model.random_inputs(seed=2)
        steps[form] = run_reference(step, [vals[p.name] for p in step.entry.params])
    assert len(steps["fused"]) == len(steps["naive"])
    for a, b in zip(steps["fused"], steps["naive"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_the_fused_block_has_no_sequence_by_sequence_value(family: str) -> None:
    seq = 6
    for form, quadratic in (("fused", False), ("naive", True)):
        model = build_model(f"{TINY[family]},attention={form}", batch=3, dtype=DType.f64)
        fn = model.module[model.layers[1].callee]
        types = value_types(model.module, fn, layer_types(model)[1])
        square = [v for v, t in types.items() if isinstance(t, TensorType) and t.shape.count(seq) >= 2]
        assert bool(square) == quadratic, (form, square)


def _activation_mib(spec: str, strategy: str = "d1.t1.p1.k1") -> float:
    """Simulated peak minus parameters (and the runtime memory) on the one GPU of a training step
    (batch 2), MiB."""
    model = build_model(spec, batch=2)
    st = parse_strategy(strategy)
    res = simulate(distribute(model, st, Optimizer("sgd", lr=0.1)), parse_cluster("h100"), device_map(st))
    return (res.peak_memory[0] - res.runtime_memory[0] - res.param_memory[0]) / 2**20


# GPT-2 small's blocks (4 of them), a small vocabulary so the head does not hide the blocks
GPT2 = "gpt2-117m:layers=4,vocab=64"


def test_gpt2_step_memory_grows_linearly_with_the_sequence_when_fused() -> None:
    fused = {s: _activation_mib(f"{GPT2},seq={s}") for s in (512, 1024)}
    naive = {s: _activation_mib(f"{GPT2},seq={s},attention=naive") for s in (512, 1024)}
    assert fused[1024] / fused[512] < 2.05  # linear in S (plus a constant)
    assert naive[1024] / naive[512] > 2.5  # the S×S scores and probabilities
    assert fused[1024] < 0.5 * naive[1024]


@pytest.mark.slow
@pytest.mark.parametrize("form", ["fused", "naive"])
def test_recomputation_policies_order_none_selective_full(form: str) -> None:
    spec = f"{GPT2},seq=1024,attention={form}"
    none, sel, full = (_activation_mib(spec, f"d1.t1.p1.k1{r}") for r in ("", ".rsel", ".rfull"))
    assert none > sel > full
    if form == "naive":  # selective drops the S×S probabilities: most of the way to fused
        assert none - sel > 0.25 * none
