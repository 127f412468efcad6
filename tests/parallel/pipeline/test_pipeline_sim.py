"""Simulated pipelines against the textbook: bubble fraction (p−1)/(k+p−1) for GPipe and 1F1B with
uniform stages, and activation memory that follows the in-flight microbatches (k for GPipe, p−r for
1F1B on stage r)."""

from __future__ import annotations

import pytest

from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.cost import FixedCostModel
from distir.sim.simulate import SimResult, simulate

# every matmul costs one unit, everything else (and communication) nothing: uniform stages
UNIT = FixedCostModel(compute=0.0, comm=0.0, by_op={"MatMul": 1.0}, free_local=True)
N = 16  # layers per stage


def _run(p: int, k: int, schedule: str, mb: int = 64) -> SimResult:
    model = build_model(f"mlp:layers={p * N},hidden=64", batch=k * mb)
    s = parse_strategy(f"p{p}.k{k}.{schedule}")  # N blocks per stage; the loss joins the last
    prog = distribute(model, s, comm_streams=True)
    return simulate(prog, parse_cluster("dgx2-v100"), device_map(s, True), UNIT)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "k"), [(2, 4), (4, 8), (4, 16), (8, 16), (4, 32)])
def test_bubble_fraction_matches_the_formula(schedule: str, p: int, k: int) -> None:
    r = _run(p, k, schedule)
    # within 2 points; the remainder is stage 0's missing input-gradient matmul (1 of 3·16 units)
    assert r.bubble_fraction == pytest.approx((p - 1) / (k + p - 1), abs=0.02)


def _activations(r: SimResult, gpu: int) -> float:
    return r.peak_memory[gpu] - r.runtime_memory[gpu] - r.param_memory[gpu]


def test_activation_memory_follows_in_flight_microbatches() -> None:
    p = 4
    g8, g16 = _run(p, 8, "gpipe"), _run(p, 16, "gpipe")
    o8, o16 = _run(p, 8, "1f1b"), _run(p, 16, "1f1b")
    # GPipe keeps all k microbatches alive: memory grows with k; 1F1B keeps p − r, whatever k is
    per_mb = (_activations(g16, 0) - _activations(g8, 0)) / 8
    assert per_mb > 0
    for r in range(p):
        assert _activations(o16, r) == pytest.approx(_activations(o8, r), rel=1e-3)
    # on 1F1B each stage further down holds one microbatch fewer
    for r in range(p - 2):
        assert _activations(o8, r) - _activations(o8, r + 1) == pytest.approx(per_mb, rel=0.15)
    # and GPipe's stage 0 holds k − p microbatches more than 1F1B's
    assert _activations(g16, 0) - _activations(o16, 0) == pytest.approx((16 - p) * per_mb, rel=0.15)
