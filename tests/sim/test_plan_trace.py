"""The planner's reuse of ``Units.prepare``'s walk of the entry (``Units.take_trace``).

Contract: planning a DTensor program's entry with the final state, per-instruction arguments and
call results that ``prepare`` computed builds exactly the plan that the planner's own walk builds
without them (records, summaries, memory events, result roots), so the simulation is the same; a
call site reuses an earlier site's summary only when prepare gave both the very same results
tuple (same callee, same argument types); and an error in the entry is still reported precisely.
"""

from __future__ import annotations

from typing import Any

import pytest

from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.interp.loop import InterpretError
from distir.interp.shapes import entry_args
from distir.ir import DType, Module, parse_module
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.cost import RooflineCostModel
from distir.sim.devices import DeviceMap
from distir.sim.plan import FnPlan, PlanDomain, PlanOptions
from distir.sim.records import CallSummary
from distir.sim.simulate import _program_devices, simulate
from distir.sim.units import Units

CLUSTER = parse_cluster("dgx-a100:2")
FIELDS = ("devs", "comm", "names", "flops", "mem", "slots", "out_roots", "fresh", "out_types", "param_last")


def _summary_fields(c: CallSummary) -> tuple[Any, ...]:
    return (
        c.name, c.slots, c.delay, c.first, c.busy, c.comm, c.flops, c.peak_extra, c.out_roots,
        c.fresh, c.n_ops, c.profile, c.param_last,
    )  # fmt: skip


def _cost_fields(costs: list[float | CallSummary]) -> list[Any]:
    return [_summary_fields(c) if isinstance(c, CallSummary) else c for c in costs]


def _plan(m: Module, dmap: DeviceMap, traced: bool, monkeypatch: pytest.MonkeyPatch) -> FnPlan:
    taken: list[object] = []
    real = Units.take_trace

    def take(self: Units, fn: Any, args: Any) -> Any:
        got = real(self, fn, args) if traced else None
        taken.append(got)
        return got

    monkeypatch.setattr(Units, "take_trace", take)
    dom = PlanDomain(m, dmap, RooflineCostModel(CLUSTER), PlanOptions(entry_param_uses=False))
    plan = dom.plan(m.entry, entry_args(m.entry))
    monkeypatch.undo()
    assert (taken[0] is not None) == traced  # the entry was planned from prepare's walk, or not
    return plan


def _assert_same_plans(m: Module, dmap: DeviceMap, monkeypatch: pytest.MonkeyPatch) -> FnPlan:
    traced, walked = _plan(m, dmap, True, monkeypatch), _plan(m, dmap, False, monkeypatch)
    for f in FIELDS:
        assert getattr(traced, f) == getattr(walked, f), f
    assert _cost_fields(traced.costs) == _cost_fields(walked.costs)
    return traced


@pytest.mark.slow
@pytest.mark.parametrize(
    "model, strategy, dtype, kw",
    [
        ("gpt2-117m:layers=2", "d2.t2.p2.k4.1f1b", DType.f32, {"comm_streams": True}),
        ("gpt2-117m:layers=2", "d1.t2.p2.k4.zb1", DType.f32, {}),
        ("gpt2-117m:layers=2", "d2.t1.p2.k2.1f1b.z3", DType.bf16, {"precision": "mixed"}),
        ("mlp-1b", "d2.t2.p2.k2.gpipe", DType.f32, {"train": False}),
    ],
)
def test_the_trace_builds_the_plan_the_walk_builds(
    model: str, strategy: str, dtype: DType, kw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = parse_strategy(strategy)
    cs = bool(kw.get("comm_streams", False))
    m = distribute(build_model(model, batch=16, dtype=dtype), s, **kw)
    plan = _assert_same_plans(m, device_map(s, cs), monkeypatch)
    calls = [c for c in plan.costs if isinstance(c, CallSummary)]
    assert len(calls) > len({id(c) for c in calls})  # call sites did share summaries
    traced = simulate(m, CLUSTER, device_map(s, cs), trace=True)
    monkeypatch.setattr(Units, "take_trace", lambda self, fn, args: None)
    assert simulate(m, CLUSTER, device_map(s, cs), trace=True) == traced


MESH = "mesh(dp=2; d0, d1)"
ROWS, COLS = f"DTensor[f32, (8, 4), {MESH}, [S(0)]]", f"DTensor[f32, (8, 4), {MESH}, [S(1)]]"
ALTERNATING = f"""func @f(%x) {{
  %y = Relu(%x)
  return %y
}}
func @g(%x) {{
  %y = Neg(%x)
  return %y
}}
func @main(%a: {ROWS}, %b: {COLS}) {{
  %a1 = @f(%a)
  %b1 = @f(%b)
  %a2 = @f(%a1)
  %b2 = @g(%b1)
  %b3 = @f(%b2)
  %c = Redistribute(%b3, to="S(0)")
  %d = Add(%a2, %c)
  return %d
}}
"""


def test_call_sites_share_a_summary_only_for_the_same_callee_and_types(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = parse_module(ALTERNATING)
    dmap = DeviceMap.default(_program_devices(m, m.entry), CLUSTER.num_devices)
    plan = _assert_same_plans(m, dmap, monkeypatch)
    f_rows, f_cols, f_rows2, g_cols, f_cols2 = plan.costs[:5]
    assert f_rows is f_rows2 and f_cols is f_cols2  # the same callee on the same types
    assert len({id(f_rows), id(f_cols), id(g_cols)}) == 3  # another layout, another callee


def test_an_error_in_the_entry_is_reported_precisely() -> None:
    bad = parse_module(
        f"""func @main(%a: {ROWS}, %b: {COLS}) {{
  %c = Add(%a, %b)
  return %c
}}
"""
    )
    with pytest.raises(InterpretError, match=r"while interpreting `%c = Add\(%a, %b\)` in @main"):
        simulate(bad, CLUSTER)
