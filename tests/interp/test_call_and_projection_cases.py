"""Interpreter, projection and communication bugs found in review, each as a minimal program.
All fixed since; they stay as regression tests (a test still marked xfail(strict) names an open bug)."""

from __future__ import annotations

import numpy as np
import pytest

import distir
from distir.interp.lockstep import DeadlockError, check_deadlock_free, run_ranks
from distir.interp.placement import placement
from distir.interp.project import project
from distir.interp.reference import run_reference
from distir.interp.shapes import infer_types
from distir.ir import Device, parse_module
from distir.report.demo import rank_inputs
from distir.sim.simulate import simulate
from sim.helpers import UnitCost, tiny_cluster

# -- type propagation through calls -------------------------------------------------------------------
SHAPE_CALLEE = """func @shp(%p) {
  %s = Shape(%p)
  return %s
}
func @m(%x: Tensor[f32, (4, 2), d0]) {
  %s1 = @shp(%x)
  %y1 = Reshape(%x, %s1)
  %s2 = @shp(%x)
  %y2 = Reshape(%x, %s2)
  return %y1, %y2
}"""


def test_shape_callee_passes_check() -> None:
    """Control: distir.check (which records, so never caches calls) accepts the program."""
    distir.check(parse_module(SHAPE_CALLEE))


def test_call_cache_keeps_concrete_results() -> None:
    m = parse_module(SHAPE_CALLEE)
    outs, _ = infer_types(m)
    assert [str(t) for t in outs] == ["Tensor[f32, (4, 2), d0]"] * 2


def test_placement_of_a_shape_callee() -> None:
    assert placement(parse_module(SHAPE_CALLEE)).all_devices == (Device(0),)


def test_simulate_a_shape_callee() -> None:
    m = distir.check(parse_module(SHAPE_CALLEE))
    # two Shapes (one per call) and two Reshapes: n_ops counts primitive ops with calls expanded
    assert simulate(m, tiny_cluster(), cost_model=UnitCost()).n_ops == 4


def test_declared_call_result_type_is_checked() -> None:
    m = parse_module("""func @f(%p) {
  %y = Relu(%p)
  return %y
}
func @m(%x: Tensor[f32, (4, 2), d0]) {
  %y: Tensor[f32, (9, 9), d1] = @f(%x)
  return %y
}""")
    with pytest.raises(ValueError):  # InterpretError or VerifyError naming %y
        distir.check(m)


def test_annotate_callee_whose_result_depends_on_a_concrete_argument() -> None:
    m = parse_module("""func @r(%x, %s) {
  %y = Reshape(%x, %s)
  return %y
}
func @m(%x: Tensor[f32, (4, 2), d0]) {
  %s1 = Constant(value=[2, 4], device=d0)
  %s2 = Constant(value=[8, 1], device=d0)
  %a = @r(%x, %s1)
  %b = @r(%x, %s2)
  return %a, %b
}""")
    outs, _ = infer_types(m)  # the program is fine
    assert [str(t) for t in outs] == ["Tensor[f32, (2, 4), d0]", "Tensor[f32, (8, 1), d0]"]
    distir.check(m)


# -- projection ----------------------------------------------------------------------------------------
def test_one_member_collective_inside_a_callee() -> None:
    m = distir.check(
        parse_module("""func @f(%p) {
  %y = AllReduce(%p)
  return %y
}
func @m(%x: Tensor[f32, (4, 2), d0]) {
  %y = @f(%x)
  return %y
}""")
    )
    x = np.ones((4, 2), np.float32)
    ranks = project(m)
    check_deadlock_free(ranks)
    np.testing.assert_array_equal(run_ranks(ranks, {Device(0): [x]})[Device(0)][0], run_reference(m, [x])[0])


def test_projected_scalar_send_type_checks() -> None:
    m = distir.check(
        parse_module("""func @m(%x: Scalar[f32, d0]) {
  %y = Send(%x, dst=d1)
  return %y
}""")
    )
    for rm in project(m).values():
        distir.check(rm)


SCALAR_ALLREDUCE = """func @m(%a: Scalar[f32, d0], %b: Scalar[f32, d1]) {
  %x, %y = AllReduce(%a, %b)
  return %x, %y
}"""


def test_collective_over_scalars_projects() -> None:
    m = distir.check(parse_module(SCALAR_ALLREDUCE))
    args = [np.float32(1.0), np.float32(2.0)]
    per = run_ranks(project(m), rank_inputs(m, args))
    assert float(per[Device(0)][0]) == float(per[Device(1)][0]) == 3.0


def test_collective_over_scalars_simulates() -> None:
    m = distir.check(parse_module(SCALAR_ALLREDUCE))
    assert simulate(m, tiny_cluster(), cost_model=UnitCost()).step_time_s == 0.5


# -- rendezvous ------------------------------------------------------------------------------------------
def test_mismatched_send_recv_shapes_are_rejected() -> None:
    r0 = parse_module("""func @r(%x: Tensor[f32, (4,), d0]) {
  rank.Send(%x, dst=d1)
  return
}""")
    r1 = parse_module("""func @r() {
  %y = rank.Recv(src=d0, dtype=f32, shape=[3], device=d1)
  return %y
}""")
    for r in (r0, r1):
        distir.check(r)  # each rank program is well typed on its own
    with pytest.raises(DeadlockError):
        check_deadlock_free({Device(0): r0, Device(1): r1})


def test_wrong_call_argument_is_named() -> None:
    m = parse_module("""func @f(%p: Tensor[f32, (4, 2), d0], %q: Tensor[f32, (9, 9), d0]) {
  return %p
}
func @m(%x: Tensor[f32, (4, 2), d0]) {
  %a = Relu(%x)
  %b = Relu(%x)
  %y = @f(%a, %b)
  return %y
}""")
    with pytest.raises(ValueError, match=r"\[input %b\]"):  # it says [input %a]
        distir.check(m)
