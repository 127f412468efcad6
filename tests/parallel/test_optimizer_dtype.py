"""An optimizer in the compute dtype (``Precision.with_optimizer_dtype("bf16")``): NeMo's
``optim.dtype: bf16``, Apex's DistributedFusedAdam with ``store_params=False``. The step keeps no
masters: it updates the bf16 weights (ZeRO-1/2: this rank's shard, then all-gathered) with bf16
``m`` and ``v``, and computes what the sequential step in that precision computes; the simulated
tensor peak falls by 8 bytes per optimizer-shard parameter against fp32 masters."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from distir.autodiff.precision import MIXED, PURE, PrecisionError, state_bytes
from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir.dtensor import DTensorType
from distir.ir.types import DType
from distir.parallel.check import check_against_sequential
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.cost import RooflineCostModel
from distir.sim.simulate import simulate

from .helpers import elements_per_device

GPT = "gpt:layers=4,hidden=8,heads=2,seq=4,vocab=16"
LLAMA = "llama:layers=4,hidden=8,heads=2,kv_heads=1,ffn=16,seq=4,vocab=16"
BF16_OPT = MIXED.with_optimizer_dtype("bf16")


@pytest.mark.parametrize("spec", [GPT, LLAMA])
@pytest.mark.parametrize(
    ("strategy", "kw"),
    [
        ("d1.t1.p1.k1.1f1b", {}),
        ("d2.t1.p1.k2.1f1b", {}),
        ("d2.t1.p1.k2.1f1b.z1", {}),
        ("d2.t1.p1.k2.1f1b.z3", {}),
        ("d2.t2.sp.p2.k4.1f1b.z1", {}),
        ("d2.t1.p2.k4.1f1b.z1", {"overlap_param_gather": True, "megatron_ddp": True}),
    ],
)
def test_the_step_equals_the_sequential_step(spec: str, strategy: str, kw: dict[str, Any]) -> None:
    s = parse_strategy(strategy)
    model = build_model(spec, batch=s.k * s.d, dtype=DType.bf16)
    cmp = check_against_sequential(model, s, Optimizer("adam", lr=0.01), precision=BF16_OPT, **kw)
    err, where = cmp.update_error()
    # the same bf16 numbers in another summation order: fp32 noise, far under bf16's 2^-8
    assert err < 1e-5, f"{strategy}: {where} differs by {err:.2e}"
    for name, (kind, _x0, a, b) in cmp.results.items():
        if kind != "loss":
            assert np.asarray(b).dtype == np.asarray(a).dtype, name


def test_the_weights_are_the_bf16_copies_and_no_gradient_is_cast() -> None:
    s = parse_strategy("d2.t1.p1.k2.1f1b.z1")
    model = build_model(GPT, batch=4, dtype=DType.bf16)
    prog = distribute(model, s, Optimizer("adam"), precision=BF16_OPT)
    names = {w.name for w in model.weights}
    params = {p.name: p.type for p in prog.entry.params}
    for name in names:
        t, m = params[name], params[f"m_{name}"]
        assert isinstance(t, DTensorType) and t.dtype is DType.bf16, name
        assert isinstance(m, DTensorType) and m.dtype is DType.bf16, name
        assert f"{name}_bf16" not in params  # no second copy
    assert all(
        not (isinstance(p.type, DTensorType) and p.type.dtype is DType.f32 and p.name in names)
        for p in prog.entry.params
    )
    casts = [op for op in prog.entry.ops() if op.name == "Cast" and op.outputs[0].name.startswith("g_")]
    assert casts == []


def _peaks(spec: str, s: Any, prec: Any) -> dict[int, float]:
    cl = parse_cluster("dgx-a100")
    model = build_model(spec, batch=s.k * s.d, dtype=DType.bf16)
    prog = distribute(model, s, Optimizer("adam"), precision=prec)
    r = simulate(prog, cl, device_map(s), RooflineCostModel(cl))
    return {g: r.peak_memory[g] - r.runtime_memory[g] for g in r.peak_memory}  # tensors only


@pytest.mark.parametrize(
    "strategy", ["d2.t1.p1.k2.1f1b", "d2.t1.p1.k2.1f1b.z1", "d2.t2.sp.p2.k4.1f1b.z1", "d2.t1.p1.k2.1f1b.z3"]
)
def test_the_peak_falls_by_eight_bytes_per_state_parameter(strategy: str) -> None:
    """fp32 master (4) and m, v (4 + 4) against bf16 m, v (2 + 2): 8 bytes per element of each
    rank's optimizer shard."""
    spec = "gpt:layers=4,hidden=512,heads=8,seq=128,vocab=512"
    s = parse_strategy(strategy)
    model = build_model(spec, batch=s.k * s.d, dtype=DType.bf16)
    prog = distribute(model, s, Optimizer("adam"), precision=MIXED)
    shard = elements_per_device(prog, lambda n: n.startswith("m_"))  # the elements of m each GPU holds
    before, after = _peaks(spec, s, MIXED), _peaks(spec, s, BF16_OPT)
    for g in before:
        assert before[g] - after[g] == pytest.approx(8 * shard[g], rel=0.01), g


def test_state_bytes_without_masters() -> None:
    assert state_bytes(2, BF16_OPT, DType.bf16) == {"master": 0, "weights": 2, "grads": 2, "optimizer": 4}
    assert sum(state_bytes(2, MIXED, DType.bf16).values()) == 16


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: PURE.with_optimizer_dtype("bf16"), "applies to mixed precision"),
        (lambda: MIXED.with_optimizer_dtype("fp8"), "must be f32, bf16 or f16"),
    ],
)
def test_refused_where_it_does_not_apply(build: Any, match: str) -> None:
    with pytest.raises(PrecisionError, match=match):
        build()


@pytest.mark.parametrize(
    ("dtype", "kw", "match"),
    [
        (DType.bf16, {"fp32_grad_accum": True}, "fp32 gradient accumulation"),
        (DType.bf16, {"reduce_fp32": True}, "reduced in fp32"),
        (DType.bf16, {"master_remainders": True}, "master remainders"),
        (DType.f16, {}, "f32 or the compute dtype f16"),
    ],
)
def test_distribute_refuses_what_feeds_fp32_masters(dtype: DType, kw: dict[str, Any], match: str) -> None:
    s = parse_strategy("d2.t1.p1.k2.1f1b.z1")
    model = build_model(GPT, batch=4, dtype=dtype)
    with pytest.raises(PrecisionError, match=match):
        distribute(model, s, Optimizer("adam"), precision=BF16_OPT, **kw)


def test_the_same_dtype_as_the_masters_is_the_precision_itself() -> None:
    assert MIXED.with_optimizer_dtype("f32") is MIXED
    assert PURE.with_optimizer_dtype("f32") is PURE
