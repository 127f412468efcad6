"""distribute(..., master_remainders=True): Apex DistributedFusedAdam's store_param_remainders, as
NeMo runs it. Each master shard is an int16 remainder beside the bf16 copy; the step computes the
same numbers as with fp32 masters (the joined master is the fp32 master bit for bit), and the
simulated tensor peak falls by 2 bytes per master-shard parameter."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from distir.autodiff.precision import PrecisionError
from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir.dtensor import DTensorType
from distir.ir.types import DType
from distir.ops.optim import join_remainder, split_remainder
from distir.parallel.check import _cast, initial_values, run_distributed
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import StrategyError, parse_strategy
from distir.sim.cost import RooflineCostModel
from distir.sim.simulate import simulate

from .helpers import elements_per_device

GPT = "gpt:layers=4,hidden=8,heads=2,seq=4,vocab=16"
LLAMA = "llama:layers=4,hidden=8,heads=2,kv_heads=1,ffn=16,seq=4,vocab=16"


def _bits(x: Any) -> np.ndarray[Any, Any]:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def _run(spec: str, strategy: str, remainders: bool, **kw: Any) -> tuple[Any, list[Any]]:
    s = parse_strategy(strategy)
    model = build_model(spec, batch=s.k * s.d, dtype=DType.bf16)
    opt = Optimizer("adam", lr=0.01)
    vals = initial_values(model, opt, 0, "mixed")
    for w in model.weights:  # the compute copy as Apex holds it: the master's high half, rounded
        high, rem = split_remainder(vals[w.name])
        assert np.array_equal(high, _cast(vals[w.name], DType.bf16)), "no ties in these masters"
        vals[f"{w.name}_bf16"], vals[f"{w.name}_rem"] = high, rem
    prog = distribute(model, s, opt, precision="mixed", master_remainders=remainders, **kw)
    return model, run_distributed(prog, model, s, vals)[1]


@pytest.mark.parametrize("spec", [GPT, LLAMA])
@pytest.mark.parametrize(
    ("strategy", "kw"),
    [
        ("d2.t1.p1.k2.1f1b.z1", {}),
        ("d2.t2.sp.p2.k4.1f1b.z1", {}),
        ("d2.t1.p2.k4.1f1b.z1", {"overlap_param_gather": True, "megatron_ddp": True}),
    ],
)
def test_the_step_equals_the_step_with_fp32_masters(spec: str, strategy: str, kw: dict[str, bool]) -> None:
    model, want = _run(spec, strategy, False, **kw)
    _, got = _run(spec, strategy, True, **kw)
    n = len(model.weights)
    assert np.array_equal(got[0], want[0])  # the loss
    for k in range(n):
        master, rem = want[1 + k], got[1 + k]
        high = got[1 + 3 * n + k]  # the new compute copy, after the new masters, m and v
        assert rem.dtype == np.int16
        assert np.array_equal(_bits(join_remainder(high, rem)), _bits(master)), model.weights[k].name
        assert np.array_equal(high, want[1 + 3 * n + k])  # the bf16 copy: the master rounded
    for k in range(1 + n, 1 + 3 * n):  # m and v
        assert np.array_equal(got[k], want[k])


def test_the_masters_are_int16_shards_and_the_update_is_adam_remainder() -> None:
    s = parse_strategy("d2.t1.p1.k2.1f1b.z1")
    model = build_model(GPT, batch=4, dtype=DType.bf16)
    prog = distribute(model, s, Optimizer("adam"), precision="mixed", master_remainders=True)
    rems = [p for p in prog.entry.params if p.name.endswith("_rem")]
    assert len(rems) == len(model.weights)
    assert all(isinstance(p.type, DTensorType) and p.type.dtype is DType.i16 for p in rems)
    ops = [op.name for op in prog.entry.ops()]
    assert ops.count("AdamRemainder") == len(model.weights) and "Adam" not in ops


def _peak(spec: str, strategy: str, remainders: bool) -> dict[int, float]:
    s = parse_strategy(strategy)
    cl = parse_cluster("dgx-a100")
    model = build_model(spec, batch=s.k * s.d, dtype=DType.bf16)
    prog = distribute(model, s, Optimizer("adam"), precision="mixed", master_remainders=remainders)
    r = simulate(prog, cl, device_map(s), RooflineCostModel(cl))
    return {g: r.peak_memory[g] - r.runtime_memory[g] for g in r.peak_memory}  # tensors only


@pytest.mark.parametrize("strategy", ["d2.t1.p1.k2.1f1b.z1", "d2.t2.sp.p2.k4.1f1b.z1"])
def test_the_peak_falls_by_two_bytes_per_master_shard_parameter(strategy: str) -> None:
    spec = "gpt:layers=4,hidden=512,heads=8,seq=128,vocab=512"
    s = parse_strategy(strategy)
    model = build_model(spec, batch=s.k * s.d, dtype=DType.bf16)
    prog = distribute(model, s, Optimizer("adam"), precision="mixed", master_remainders=True)
    shard = elements_per_device(prog, lambda n: n.endswith("_rem"))  # the remainder elements each GPU holds
    before, after = _peak(spec, strategy, False), _peak(spec, strategy, True)
    for g in before:
        saved = before[g] - after[g]
        assert saved == pytest.approx(2 * shard[g], rel=0.02), (g, saved, shard[g])


@pytest.mark.parametrize(
    ("strategy", "precision", "err"),
    [
        ("d2.t1.p1.k2.1f1b.z3", "mixed", StrategyError),
        ("d2.t1.p1.k2.1f1b.z2", "mixed", StrategyError),
        ("d2.t1.p1.k2.1f1b", "mixed", StrategyError),
        ("d2.t1.p1.k2.1f1b.z1", "pure", PrecisionError),
    ],
)
def test_refused_outside_a_zero1_mixed_adam_step(strategy: str, precision: str, err: type) -> None:
    s = parse_strategy(strategy)
    model = build_model(GPT, batch=4, dtype=DType.bf16)
    with pytest.raises(err, match="master remainders"):
        distribute(model, s, Optimizer("adam"), precision=precision, master_remainders=True)


def test_refused_for_sgd_and_unfused_adam() -> None:
    s = parse_strategy("d2.t1.p1.k2.1f1b.z1")
    model = build_model(GPT, batch=4, dtype=DType.bf16)
    for opt in (Optimizer("sgd"), Optimizer("adam", kernels="foreach")):
        with pytest.raises(StrategyError, match="fused Adam"):
            distribute(model, s, opt, precision="mixed", master_remainders=True)
