"""Shared helpers: a unit cost model (exact binary floats), a tiny cluster, and comparison of a
program with calls against its inlined form."""

from __future__ import annotations

from typing import Any

import distir
from distir.hardware.cluster import Cluster
from distir.hardware.specs import DeviceSpec, LinkSpec, NodeSpec
from distir.ir import Module, parse_module
from distir.ir.rewrite import inline_calls
from distir.sim.cost import FixedCostModel
from distir.sim.simulate import SimResult, simulate


class UnitCost(FixedCostModel):
    """Every op that does any work costs 1 s, MatMul 2 s; every communication 0.5 s
    (the same model as ``tests/sim/test_simulate.py``)."""

    def __init__(self) -> None:
        super().__init__(compute=1.0, comm=0.5, by_op={"MatMul": 2.0})


def tiny_cluster(memory_bytes: int = 1 << 30, gpus: int = 2) -> Cluster:
    dev = DeviceSpec("tiny", 1e12, 1e12, 1e12, 1e12, 1e11, memory_bytes, 0.0)
    node = NodeSpec("tinynode", dev, gpus, LinkSpec(1e10, 1e-6), LinkSpec(1e9, 1e-5))
    return Cluster("tiny", (node,))


def sim_both(text: str, **kw: Any) -> tuple[SimResult, SimResult]:
    """Simulate a program with calls (summaries) and its inlined form (unit costs)."""
    m = distir.check(parse_module(text))
    flat = Module((inline_calls(m),))
    cl = kw.pop("cluster", tiny_cluster())
    cost = kw.pop("cost", UnitCost())
    return simulate(m, cl, cost_model=cost, **kw), simulate(flat, cl, cost_model=cost, **kw)
