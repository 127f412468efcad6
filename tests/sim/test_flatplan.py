"""The planner's one-pass fast path (``distir.sim.flatplan``) against the general path.

Contract: for every body it accepts, ``plan_flat`` builds the plan ``_walk`` + ``build_plan``
build — records, memory events in order, result roots, fresh buffers, parameter last uses —
and it declines (None) bodies with calls, so the general path plans those.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

import distir
from distir.interp.loop import InterpretError, interpret
from distir.interp.shapes import Concrete, TypeDomain, entry_args
from distir.ir import Module, parse_module
from distir.ir.rewrite import inline_calls
from distir.sim.devices import DeviceMap
from distir.sim.flatplan import plan_flat
from distir.sim.plan import FnPlan, PlanDomain, PlanOptions
from distir.sim.simulate import _program_devices, simulate
from sim.gen_programs import Feats, programs
from sim.helpers import UnitCost, tiny_cluster

CLUSTER = tiny_cluster(gpus=4)
FIELDS = (
    "devs", "costs", "comm", "names", "flops", "mem", "slots", "out_roots", "fresh", "out_types", "param_last"
)  # fmt: skip


def _plans(m: Module) -> tuple[FnPlan | None, FnPlan]:
    fn = m.entry
    dmap = DeviceMap.default(_program_devices(m, fn), CLUSTER.num_devices)
    fast = PlanDomain(m, dmap, UnitCost())
    general = PlanDomain(m, dmap, UnitCost(), PlanOptions(fast_path=False))
    args = entry_args(fn, None)
    fast.units.prepare(m, fn, args)
    return plan_flat(fast, fn, args), general.plan(fn, args)


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(programs(Feats(max_ops=12)))
def test_fast_path_builds_the_general_plan(m: Module) -> None:
    flat = Module((inline_calls(distir.check(m)),))
    fast, general = _plans(flat)
    if fast is None:  # declined: only a body with a concrete value (a Constant) may be
        _, env = interpret(flat, flat.entry, entry_args(flat.entry, None), TypeDomain())
        assert any(isinstance(x, Concrete) for x in env.values())
        return
    for f in FIELDS:
        assert getattr(fast, f) == getattr(general, f), f


def test_declines_a_body_with_calls() -> None:
    m = distir.check(
        parse_module(
            """
            func @f(%x: Tensor[f32, (2, 2), d0]) { %y = Relu(%x)  return %y }
            func @main(%x: Tensor[f32, (2, 2), d0]) { %y = @f(%x)  return %y }
            """
        )
    )
    fast, general = _plans(m)
    assert fast is None and general.names == ["@f"]


def test_declared_result_type_mismatch_is_reported_by_the_general_path() -> None:
    m = parse_module(
        """
        func @main(%x: Tensor[f32, (2, 2), d0]) {
          %y: Tensor[f32, (3, 2), d0] = Relu(%x)
          return %y
        }
        """
    )
    with pytest.raises(InterpretError, match=r"declared Tensor\[f32, \(3, 2\), d0\] but Relu gives"):
        simulate(m, CLUSTER)
