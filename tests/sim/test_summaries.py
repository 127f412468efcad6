"""``summarize`` (the planner's) against ``summarize_reference`` (the plain max-plus run): the
same call summary, bit for bit, for every callee plan the planner summarizes — on random
distributed programs (``gen_programs``: nested, multi-device and repeated calls, collectives,
views), with and without stalls, and on distributed zoo models with pipelines, tensor and
sequence parallelism (several slots per callee, callee memory profiles inlined)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings

import distir
import distir.sim.plan as plan_module
from distir.autodiff.train import Optimizer
from distir.frontends.zoo.registry import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir import Module
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.cost import RooflineCostModel
from distir.sim.records import CallSummary, FnPlan
from distir.sim.simulate import simulate
from distir.sim.summaries import summarize, summarize_reference
from sim.gen_programs import Feats, programs
from sim.helpers import UnitCost, tiny_cluster

# every field a summary is made of (the pickers are functions of ``read_pos`` and the result
# positions, compared through them)
FIELDS = (
    "name", "slots", "delay", "first", "busy", "comm", "flops", "peak_extra", "out_roots",
    "fresh", "n_ops", "profile", "param_last", "read_pos", "read_last", "own_ks", "own_bytes",
    "own_allocs", "aliases",
)  # fmt: skip


def _fields(s: CallSummary) -> str:
    """The summary's fields as text: floats compared bit for bit (``repr``: -0.0, inf)."""
    return repr([getattr(s, f) for f in FIELDS])


@contextmanager
def _plans_summarized() -> Iterator[list[tuple[FnPlan, list[int]]]]:
    """Every plan the planner summarizes inside the block, with its ``slot_gpu``."""
    got: list[tuple[FnPlan, list[int]]] = []

    def keep(plan: FnPlan, slot_gpu: list[int]) -> CallSummary:
        got.append((plan, slot_gpu))
        return summarize(plan, slot_gpu)

    saved = plan_module.summarize
    plan_module.summarize = keep
    try:
        yield got
    finally:
        plan_module.summarize = saved


def _check(plans: list[tuple[FnPlan, list[int]]]) -> None:
    for plan, slot_gpu in plans:
        assert _fields(summarize(plan, slot_gpu)) == _fields(summarize_reference(plan, slot_gpu)), (
            plan.fn.name
        )


@settings(
    max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None
)
@given(programs(Feats()))
def test_summarize_is_the_reference_on_random_programs(m: Module) -> None:
    m = distir.check(m)
    with _plans_summarized() as plans:
        simulate(m, tiny_cluster(gpus=8), cost_model=UnitCost())
        simulate(m, parse_cluster("p3.8xlarge:2"), trace=True)  # the real model: stalls, fused chains
    _check(plans)


@pytest.mark.parametrize(
    "model,strategy",
    [
        ("gpt:layers=4,hidden=64,heads=4,seq=16,vocab=128", "d2.t2.sp.p2.k2.z3.1f1b"),
        ("gpt:layers=4,hidden=64,heads=4,seq=16,vocab=128", "d2.t1.p4.k4.zb1"),
        ("llama:layers=4,hidden=64,heads=4,kv_heads=2,seq=16,vocab=128", "d2.t2.p2.k4.interleaved.v2"),
    ],
)
def test_summarize_is_the_reference_on_distributed_models(model: str, strategy: str) -> None:
    s = parse_strategy(strategy)
    prog = distribute(build_model(model, 16), s, Optimizer("adam"), comm_streams=True)
    cluster = parse_cluster("p3.8xlarge:2")
    with _plans_summarized() as plans:
        simulate(prog, cluster, device_map(s, True), RooflineCostModel(cluster), batch=16)
    assert any(len(p.slots) > 1 for p, _ in plans) and any(p.call_profiles for p, _ in plans), "covered"
    _check(plans)
