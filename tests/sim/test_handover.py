"""One-way hand-overs between streams (``MeshSend``/``Send`` with ``event=true``): the destination
stream waits for the work issued to the source before it, the source goes on (a CUDA event the
destination waits for). Timed against closed forms built from each op's own cost, and held alike
by every planner: the fast one, the reference one, call summaries and the materialized program."""

from __future__ import annotations

import math

import pytest

import distir
from distir.hardware.cluster import parse_cluster
from distir.ir import Device, parse_module
from distir.ir.function import Module
from distir.parallel.sharding.materialize import materialize
from distir.sim.cost import RooflineCostModel
from distir.sim.devices import DeviceMap, Slot
from distir.sim.simulate import SimResult, simulate

CLUSTER = parse_cluster("g4dn.12xlarge:1")  # 4 T4s on PCIe: a gather far slower than a Relu
COMPUTE = "mesh(dp=2; d0, d1)"
STREAM = "dp=2; d2, d3"
X = f"DTensor[f32, (512, 512), {COMPUTE}, [S(0)]]"
DMAP = DeviceMap.parse("d0=0,d1=1,d2=0:dp_reduce,d3=1:dp_reduce", [Device(i) for i in range(4)], 4)
COST = RooflineCostModel(CLUSTER, comm_interference=False)  # no stall: clocks move by op costs only


def _program(event: bool) -> Module:
    """Three Relus on the compute stream; after each of the first two, its result handed to the
    reduction stream and gathered there; the second gather handed back (an ordinary MeshSend)."""
    flag = ", event=true" if event else ""
    return distir.check(
        parse_module(
            f"""func @f(%x: {X}) {{
  %a = Relu(%x)
  %sa = MeshSend(%a, mesh="{STREAM}"{flag})
  %ga = Redistribute(%sa, to="R")
  %b = Relu(%a)
  %sb = MeshSend(%b, mesh="{STREAM}"{flag})
  %gb = Redistribute(%sb, to="R")
  %c = Relu(%b)
  %back = MeshSend(%gb, mesh="{COMPUTE[5:-1]}")
  return %c, %ga, %back
}}
"""
        )
    )


def _alone(body: str, params: str) -> float:
    """The simulated time of one op alone (its own cost)."""
    m = distir.check(parse_module(f"func @g({params}) {{\n  {body}\n  return %y\n}}\n"))
    return simulate(m, CLUSTER, DMAP, COST).step_time_s


def _costs() -> tuple[float, float]:
    relu = _alone("%y = Relu(%x)", f"%x: {X}")
    gather = _alone('%y = Redistribute(%x, to="R")', f"%x: DTensor[f32, (512, 512), mesh({STREAM}), [S(0)]]")
    return relu, gather


def _run(m: Module, **kw: object) -> SimResult:
    return simulate(m, CLUSTER, DMAP, COST, **kw)  # type: ignore[arg-type]


def _slices(r: SimResult, stream: str) -> list[tuple[str, float, float]]:
    assert r.slices is not None
    j = r.slots.index(Slot(0, stream))
    return sorted((n, s, e) for n, s, e, slot, _ in r.slices if slot == j and e > s)


def test_the_source_goes_on_while_the_destination_waits_for_it() -> None:
    """Compute: the Relus back to back (0, t, 2t). Stream: the first gather starts when ``%a``
    is made (t), the second when both the first gather and ``%b`` are done; the hand-back waits
    for the second gather, so the step ends at the later of it and the third Relu."""
    t, g = _costs()
    assert g > 2 * t  # the gathers queue on the stream
    r = _run(_program(event=True), trace=True)
    relus = sorted(s for n, s, _ in _slices(r, "compute") if n == "Relu")
    assert relus == pytest.approx([0.0, t, 2 * t], rel=1e-12, abs=1e-15)
    gathers = sorted(s for n, s, _ in _slices(r, "dp_reduce") if n == "Redistribute")
    assert gathers == pytest.approx([t, max(t + g, 2 * t)], rel=1e-12)
    assert r.step_time_s == pytest.approx(max(3 * t, t + 2 * g), rel=1e-12)


def test_without_event_each_hand_over_waits_both_ways() -> None:
    """The ordinary MeshSend occupies both streams: the second Relu's hand-over waits for the
    first gather, so the third Relu starts only after it (the stall the event removes)."""
    t, g = _costs()
    r = _run(_program(event=False), trace=True)
    relus = sorted(s for n, s, _ in _slices(r, "compute") if n == "Relu")
    assert relus == pytest.approx([0.0, t, t + g], rel=1e-12)
    assert r.step_time_s == pytest.approx(t + 2 * g, rel=1e-12)


def test_every_planner_times_a_hand_over_alike() -> None:
    """The fast planner, the reference planner, a call's summary (the same body called) and the
    materialized program (a ``Send`` with the flag per device) give the same figures."""
    m = _program(event=True)
    fast = _run(m)
    ref = _run(m, planner="reference")
    assert (ref.step_time_s, ref.busy_s, ref.comm_s, ref.peak_memory) == (
        fast.step_time_s,
        fast.busy_s,
        fast.comm_s,
        fast.peak_memory,
    )
    mat = distir.check(materialize(m))
    assert sum(1 for op in mat.entry.body if op.name == "Send" and op.attrs.get("event")) == 4
    flat = _run(mat)
    assert math.isclose(flat.step_time_s, fast.step_time_s, rel_tol=1e-12)
    z = f"DTensor[f32, (512, 512), mesh({STREAM}), [S(0)]]"
    head = f'func @main(%x: {X}, %z: {z}) {{\n  %gz = Redistribute(%z, to="R")\n'
    called = distir.check(
        parse_module(_FN_TEXT + head + "  %c, %ga, %back = @f(%x)\n  return %c, %ga, %back, %gz\n}\n")
    )
    inlined = distir.check(parse_module(head + _BODY + "  return %c, %ga, %back, %gz\n}\n"))
    t, g = _costs()
    # the stream busy with a gather first: the body's first gather starts at max(t, g)
    want = max(3 * t, max(t, g) + 2 * g)
    assert _run(called).step_time_s == pytest.approx(want, rel=1e-12)
    assert _run(inlined).step_time_s == pytest.approx(want, rel=1e-12)
    assert _run(called, planner="reference").step_time_s == pytest.approx(want, rel=1e-12)


_BODY = f"""  %a = Relu(%x)
  %sa = MeshSend(%a, mesh="{STREAM}", event=true)
  %ga = Redistribute(%sa, to="R")
  %b = Relu(%a)
  %sb = MeshSend(%b, mesh="{STREAM}", event=true)
  %gb = Redistribute(%sb, to="R")
  %c = Relu(%b)
  %back = MeshSend(%gb, mesh="{COMPUTE[5:-1]}")
"""
_FN_TEXT = f"func @f(%x: {X}) {{\n" + _BODY + "  return %c, %ga, %back\n}\n"


def test_a_hand_over_keeps_its_memory() -> None:
    """The flag changes timing only: the same peak memory per GPU as the two-way hand-over."""
    assert _run(_program(event=True)).peak_memory == _run(_program(event=False)).peak_memory
