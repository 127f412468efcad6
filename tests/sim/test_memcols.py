"""The compact plan of a flat entry (``FnPlan.columns``, ``distir.sim.memcols``) against the plain one.

Contract: an untraced simulation of a flat entry keeps one record per distinct op and its memory
events as numpy columns; its result — step time, busy and communication time per slot, peak and
parameter memory per GPU, FLOPs, op count — is bit-identical to running the plain plan (per-op
lists and ``FnPlan.mem``) through ``_run_fast``, and its peaks equal a traced run's.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

import distir
from distir.hardware.cluster import Cluster, parse_cluster
from distir.interp.loop import InterpretError
from distir.interp.shapes import entry_args
from distir.ir import Device, DTensorType, DType, Mesh, Module, parse_module
from distir.ir.dtensor import parse_placements
from distir.ir.rewrite import inline_calls
from distir.sim.cost import CostModel, RooflineCostModel
from distir.sim.devices import DeviceMap
from distir.sim.plan import PlanDomain, PlanOptions
from distir.sim.simulate import SimResult, _program_devices, _run, simulate
from sim.gen_programs import Feats, programs
from sim.helpers import UnitCost, tiny_cluster

FIELDS = ("step_time_s", "busy_s", "comm_s", "peak_memory", "param_memory", "flops", "n_ops", "peak_flops")


def _run_with(m: Module, cluster: Cluster, cost: CostModel, columnar: bool) -> tuple[SimResult, bool]:
    """Simulate untraced with the compact entry plan on or off; also say whether it was used."""
    fn = m.entry
    dmap = DeviceMap.default(_program_devices(m, fn), cluster.num_devices)
    dom = PlanDomain(m, dmap, cost, PlanOptions(entry_param_uses=False, entry_memory_columns=columnar))
    plan = dom.plan(fn, entry_args(fn, None))
    return _run(plan, dom, cluster, dmap, False, None), plan.columns is not None


def _assert_same(m: Module, cluster: Cluster, cost: CostModel) -> bool:
    compact, used = _run_with(m, cluster, cost, True)
    plain, plain_used = _run_with(m, cluster, cost, False)
    assert not plain_used
    for f in FIELDS:
        assert repr(getattr(compact, f)) == repr(getattr(plain, f)), f
    traced = simulate(m, cluster, cost_model=cost, trace=True)
    assert repr(traced.peak_memory) == repr(compact.peak_memory)
    assert repr(traced.step_time_s) == repr(compact.step_time_s)
    return used


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(programs(Feats(max_ops=14)))
def test_compact_plan_runs_like_the_plain_one(m: Module) -> None:
    flat = Module((inline_calls(distir.check(m)),))
    _assert_same(flat, tiny_cluster(gpus=4), UnitCost())


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(programs(Feats(max_ops=20, n_devices=20)))
def test_compact_plan_on_many_gpus(m: Module) -> None:
    """More GPUs than the per-GPU mask handles: events are grouped by one stable sort."""
    flat = Module((inline_calls(distir.check(m)),))
    _assert_same(flat, tiny_cluster(gpus=24), UnitCost())


def test_compact_plan_is_used_for_a_flat_entry_with_views_and_unused_results() -> None:
    m = distir.check(
        parse_module(
            """
            func @main(%x: Tensor[f32, (4, 8), d0], %w: Tensor[f32, (8, 8), d0]) {
              %h = MatMul(%x, %w)
              %r = Reshape(%h, shape=[32])
              %u = Relu(%x)
              %s = Send(%r, dst=d1)
              %g = Gelu(%s)
              %k = Relu(%g)
              return %k, %h
            }
            """
        )
    )
    assert _assert_same(m, tiny_cluster(gpus=2), UnitCost())


@pytest.mark.parametrize("keep_source", [False, True])
def test_compact_plan_of_a_multi_step_redistribution(keep_source: bool) -> None:
    """A Redistribute whose source dies at it bumps the peak by less than its allocations (the
    source is freed after the first step): that op's probe stays an event of its own."""
    ret = "%y, %x" if keep_source else "%y"
    here = Mesh((("a", 2), ("b", 2)), tuple(Device(i) for i in range(4)))
    there = Mesh(here.axes, tuple(Device(4 + i) for i in range(4)))
    src = DTensorType(DType.f32, (4, 6), there, parse_placements("S(0), S(1)"))
    m = distir.check(
        parse_module(
            f"func @f(%x0: {src}) {{\n"
            f'  %x = MeshSend(%x0, mesh="{str(here)[5:-1]}")\n'
            '  %y = Redistribute(%x, to="S(1), S(0)")\n'
            f"  return {ret}\n}}\n"
        )
    )
    cluster = parse_cluster("dgx-a100:1")
    assert _assert_same(m, cluster, RooflineCostModel(cluster))


def test_a_body_with_calls_keeps_the_plain_plan() -> None:
    m = distir.check(
        parse_module(
            """
            func @f(%x: Tensor[f32, (2, 2), d0]) { %y = Relu(%x)  return %y }
            func @main(%x: Tensor[f32, (2, 2), d0]) { %y = @f(%x)  %z = Relu(%y)  return %z }
            """
        )
    )
    assert not _assert_same(m, tiny_cluster(gpus=1), UnitCost())


def test_an_op_binding_more_results_than_it_has_is_reported() -> None:
    """The compact path counts the results it entered; a mismatch goes to the general path."""
    m = parse_module("func @main(%x: Tensor[f32, (2, 2), d0]) { %a, %b = Relu(%x)  return %a }")
    with pytest.raises(InterpretError, match=r"produces 1 results but 2 are bound"):
        simulate(m, tiny_cluster())
