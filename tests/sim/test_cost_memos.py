"""``distir.sim.costmemo``: planning domains on equal cost models share their cost memos, and a
simulation gives the figures it gives on memos of its own."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from distir.autodiff.train import Optimizer
from distir.frontends.zoo.registry import build_model
from distir.hardware.cluster import parse_cluster
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.cost import FixedCostModel, RooflineCostModel
from distir.sim.costmemo import cost_memos, cost_token
from distir.sim.simulate import SimResult, simulate

# two node kinds (V100s and T4s): an op costs differently on each
CLUSTER = "p3.8xlarge:1+g4dn.12xlarge:1"
GPT = "gpt:layers=4,hidden=64,heads=4,seq=16,vocab=128"


@dataclass(frozen=True)
class _ListCost(FixedCostModel):
    """A cost model with a field that is not hashable: no memo is shared with it."""

    extra: list[float] = field(default_factory=list)


def test_equal_cost_models_share_memos_and_others_do_not() -> None:
    cl = parse_cluster(CLUSTER)
    a, b = RooflineCostModel(cl), RooflineCostModel(cl)
    assert a is not b and cost_memos(a) is cost_memos(b)
    assert cost_memos(RooflineCostModel(cl, tp_comm_overlap=True)) is not cost_memos(a)
    assert cost_memos(RooflineCostModel(cl, flop_efficiency={"linalg": 0.5})) is not cost_memos(a)
    assert cost_memos(RooflineCostModel(copy.copy(cl))) is not cost_memos(a)  # another cluster object
    assert cost_memos(FixedCostModel(by_op={"MatMul": 2.0})) is cost_memos(
        FixedCostModel(by_op={"MatMul": 2.0})
    )
    assert cost_token(_ListCost()) is None and cost_memos(_ListCost()) is not cost_memos(_ListCost())
    assert cost_token(object()) is None


def _figures(r: SimResult) -> tuple[object, ...]:
    return (r.step_time_s, r.busy_s, r.comm_s, r.peak_memory, r.flops, r.n_ops)


def test_a_simulation_on_shared_memos_gives_its_own_figures() -> None:
    """The same program on the V100s and on the T4s (placements swapped), and another microbatch
    count, simulated one after another on equal cost models (memos shared, filled by the others)
    give the figures each gives on a cluster object of its own (memos of its own)."""
    model = build_model(GPT, 16)
    cl = parse_cluster(CLUSTER)
    runs = ["d2.t2.p2.k2.1f1b", "d2.t2.p2.k2.1f1b.@4-5-6-7-0-1-2-3", "d2.t2.sp.p2.k4.zb1.@4-5-6-7-0-1-2-3"]
    progs = {s: distribute(model, parse_strategy(s), Optimizer("adam"), comm_streams=True) for s in runs}
    shared = []
    for s in runs:
        shared.append(
            _figures(simulate(progs[s], cl, device_map(parse_strategy(s), True), RooflineCostModel(cl)))
        )
    assert cost_memos(RooflineCostModel(cl)).local_costs
    for s, got in zip(runs, shared, strict=True):
        own = copy.copy(cl)
        alone = simulate(progs[s], own, device_map(parse_strategy(s), True), RooflineCostModel(own))
        assert _figures(alone) == got, s
