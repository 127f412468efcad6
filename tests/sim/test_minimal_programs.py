"""Simulator bugs found in review, each as a minimal program. A test marked xfail(strict) fails
today because of the bug named in its reason; it starts passing (and so must be unmarked) when
the bug is fixed.

Sizes: ``T`` is 256 f32 = 1024 bytes; the entry parameter is live throughout.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

import distir
from distir.hardware.cluster import parse_cluster
from distir.ir import Attrs, Device, Type, parse_module
from distir.ops.registry import OpDef
from distir.sim.collectives import gather_time, scatter_time
from distir.sim.devices import DeviceMap
from distir.sim.simulate import simulate
from sim.helpers import UnitCost, sim_both, tiny_cluster

T = "Tensor[f32, (256,), d0]"
KIB = 1024.0


def _peaks(text: str) -> tuple[float, float]:
    summ, flat = sim_both(text)
    assert (summ.step_time_s, summ.busy_s, summ.comm_s) == (flat.step_time_s, flat.busy_s, flat.comm_s)
    return summ.peak_memory[0], flat.peak_memory[0]


# -- memory: every result of one op ---------------------------------------------------------------
def test_peak_counts_every_result_of_a_multi_output_op() -> None:
    m = distir.check(
        parse_module(f"""func @m(%x: {T}) {{
  %a, %b, %c, %d = Split(%x, dim=0, num_splits=4)
  return %a, %b, %c, %d
}}""")
    )
    r = simulate(m, tiny_cluster(), cost_model=UnitCost())
    # x (1 KiB) + four quarters (1 KiB) are all live at the end; the simulator reports 1280
    assert r.peak_memory == {0: 2 * KIB}


def test_peak_of_an_adam_step() -> None:
    w = "Tensor[f32, (256, 1024), d0]"  # 1 MiB each
    m = distir.check(
        parse_module(f"""func @m(%w: {w}, %g: {w}, %m: {w}, %v: {w}, %t: Tensor[i64, (), d0]) {{
  %w2, %m2, %v2 = Adam(%w, %g, %m, %v, %t)
  return %w2, %m2, %v2
}}""")
    )
    r = simulate(m, tiny_cluster(), cost_model=UnitCost())
    assert r.peak_memory == {0: 7.0 * (1 << 20) + 8}  # 4 inputs, step, 3 results; reported: 5 MiB


def test_peak_counts_collective_results_on_streams_of_one_gpu() -> None:
    t = "Tensor[f32, (256,), d{}]"
    m = distir.check(
        parse_module(f"""func @m(%x: {t.format(0)}, %y: {t.format(1)}) {{
  %a, %b = AllReduce(%x, %y)
  return %a, %b
}}""")
    )
    dm = DeviceMap.parse("d0=0,d1=0:comm", set(), 2)
    r = simulate(m, tiny_cluster(), dm, cost_model=UnitCost())
    assert r.peak_memory == {0: 4 * KIB}  # reported: 3 KiB


# -- memory: call summaries vs the inlined program -------------------------------------------------
def test_value_returned_twice() -> None:
    summ, flat = _peaks(f"""func @f(%p) {{
  %a = Relu(%p)
  return %a, %a
}}
func @m(%x: {T}) {{
  %y1, %y2 = @f(%x)
  %z = Add(%y1, %y2)
  return %z
}}""")
    assert summ == flat == 3 * KIB  # x, a, z; the summary says 4 KiB


def test_result_viewing_param_and_fresh_value() -> None:
    summ, flat = _peaks(f"""func @f(%p) {{
  %a = Relu(%p)
  %t = MakeTuple(%p, %a)
  return %t
}}
func @m(%x: {T}) {{
  %t = @f(%x)
  %u, %v = UnpackTuple(%t)
  %w = Relu(%v)
  return %w
}}""")
    assert summ == flat == 3 * KIB  # x, a, w; the summary says 4 KiB


def test_result_viewing_two_fresh_values() -> None:
    summ, flat = _peaks(f"""func @f(%p) {{
  %a = Relu(%p)
  %b = Relu(%p)
  %t = MakeTuple(%a, %b)
  %u, %v = UnpackTuple(%t)
  return %u
}}
func @m(%x: {T}) {{
  %y = @f(%x)
  %w = Relu(%y)
  %w2 = Relu(%w)
  return %w2
}}""")
    assert summ == flat  # inlined: 4 KiB (u keeps a and b); summary: 3 KiB


def test_result_is_a_reshape_of_a_fresh_value() -> None:
    summ, flat = _peaks(f"""func @f(%p) {{
  %s = Constant(value=[16, 16], device=d0)
  %a = Relu(%p)
  %r = Reshape(%a, %s)
  return %r
}}
func @m(%x: {T}) {{
  %y = @f(%x)
  %z = Relu(%y)
  return %z
}}""")
    assert summ == flat  # 3072 vs 3088


def test_unused_call_result() -> None:
    summ, flat = _peaks(f"""func @f(%p) {{
  %a = Relu(%p)
  %b = Relu(%p)
  %c = Relu(%p)
  return %a, %c
}}
func @m(%x: {T}) {{
  %a, %c = @f(%x)
  return %c
}}""")
    assert summ == flat == 2 * KIB  # the summary says 3 KiB


def test_returned_param_whose_result_is_unused() -> None:
    summ, flat = _peaks(f"""func @f(%p, %q) {{
  %a = Relu(%q)
  %b = Relu(%q)
  return %p, %b
}}
func @m(%x: {T}) {{
  %y = Relu(%x)
  %u, %v = @f(%y, %x)
  return %v
}}""")
    assert summ == flat == 2 * KIB  # the summary says 3 KiB


def test_unused_callee_parameter() -> None:
    summ, flat = _peaks(f"""func @f(%p, %k) {{
  %a = Relu(%k)
  return %a
}}
func @m(%x: {T}) {{
  %b = Relu(%x)
  %c = Relu(%b)
  %d = Relu(%c)
  %e = Relu(%d)
  %y = @f(%b, %e)
  return %y
}}""")
    assert summ == flat == 3 * KIB  # the summary says 4 KiB


NESTED_CALLEE = """func @g(%q) {
  %r = Relu(%q)
  %s = Relu(%r)
  %t = Relu(%s)
  return %t
}
"""


def test_dying_argument_one_call_level_is_exact() -> None:
    """Control for the next test: one level of call, the dying argument is freed inside."""
    summ, flat = _peaks(
        NESTED_CALLEE
        + f"""func @m(%x: {T}) {{
  %b = Relu(%x)
  %y = @g(%b)
  return %y
}}"""
    )
    assert summ == flat == 3 * KIB


def test_dying_argument_through_two_call_levels() -> None:
    """An argument dying at a call and passed on to a nested call is freed inside the nested
    call, as in the inlined program (call summaries track last uses by inlined op position)."""
    summ, flat = _peaks(
        NESTED_CALLEE
        + f"""func @f(%p) {{
  %y = @g(%p)
  return %y
}}
func @m(%x: {T}) {{
  %b = Relu(%x)
  %y = @f(%b)
  return %y
}}"""
    )
    assert summ == flat == 3 * KIB  # the summary said 4 KiB before


# -- timing / robustness ----------------------------------------------------------------------------
def test_call_of_a_callee_touching_no_device() -> None:
    summ, flat = sim_both(f"""func @id(%p) {{
  return %p
}}
func @m(%x: {T}) {{
  %y = @id(%x)
  %z = Relu(%y)
  return %z
}}""")
    assert summ.step_time_s == flat.step_time_s == 1.0


class _NumpyCost(UnitCost):
    def compute_time(
        self, opdef: OpDef, ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, gpu: int
    ) -> float:
        return np.float64(super().compute_time(opdef, ins, outs, attrs, gpu))  # type: ignore[return-value]


class _IntCost(UnitCost):
    def compute_time(
        self, opdef: OpDef, ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, gpu: int
    ) -> float:
        return int(super().compute_time(opdef, ins, outs, attrs, gpu))


@pytest.mark.parametrize("cost", [_NumpyCost(), _IntCost()], ids=["np.float64", "int"])
def test_cost_model_returning_numpy_or_int(cost: UnitCost) -> None:
    m = distir.check(
        parse_module(f"""func @m(%x: {T}) {{
  %a = Relu(%x)
  return %a
}}""")
    )
    assert simulate(m, tiny_cluster(), cost_model=cost).step_time_s == 1.0


# -- cost of rooted collectives -----------------------------------------------------------------------
TBIG = "Tensor[f32, (1024, 1024), d{}]"
MB4 = 4.0 * 1024 * 1024
TWO_NODES = "d0=0,d1=1,d2=4"  # d0, d1 on node 0; d2 on node 1 (p3.8xlarge: 4 GPUs per node)


def _time(text: str) -> float:
    cl = parse_cluster("p3.8xlarge:2")
    m = distir.check(parse_module(text))
    return simulate(m, cl, DeviceMap.parse(TWO_NODES, set(), cl.num_devices)).step_time_s


def test_scatter_cost_uses_the_source_as_root() -> None:
    cl = parse_cluster("p3.8xlarge:2")
    t = _time(f"""func @m(%x: {TBIG.format(0)}) {{
  %c, %a, %b = Scatter(%x, devices=[d2, d0, d1])
  return %a, %b, %c
}}""")
    assert t == pytest.approx(scatter_time(cl, MB4, [0, 1, 4], root=0))


def test_gather_cost_uses_the_root() -> None:
    cl = parse_cluster("p3.8xlarge:2")
    t = _time(f"""func @m(%x: {TBIG.format(0)}, %y: {TBIG.format(1)}, %z: {TBIG.format(2)}) {{
  %g = MPIGather(%z, %x, %y, root=d0)
  return %g
}}""")
    assert t == pytest.approx(gather_time(cl, 3 * MB4, [0, 1, 4], root=0))


# -- device map ------------------------------------------------------------------------------------
def test_unreachable_function_does_not_take_a_gpu() -> None:
    text = f"""func @unused(%p) {{
  %c = Constant(value=[1.0], device=d2)
  return %c
}}
func @m(%x: {T}) {{
  %y = Send(%x, dst=d1)
  return %y
}}"""
    m = distir.check(parse_module(text))
    r = simulate(m, tiny_cluster(gpus=2), cost_model=UnitCost())
    assert r.step_time_s == 0.5 and Device(2) not in {d for ds in r.slot_devices for d in ds}


def test_summary_of_a_zero_time_step_is_valid_json() -> None:
    import json

    from distir.sim.summary import summary_dict

    m = distir.check(parse_module(f"func @m(%x: {T}) {{\n  return %x\n}}"))
    r = simulate(m, tiny_cluster(), cost_model=UnitCost())
    json.dumps(summary_dict(r), allow_nan=False)
