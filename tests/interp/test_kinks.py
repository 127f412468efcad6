"""The reference executor with piecewise decisions observed and reversed: units within the
bound are recorded with their op application and element, a reversal changes that element's
branch only, and every op whose result is piecewise in an input declares its kink."""

from __future__ import annotations

import numpy as np

import distir
from distir.interp.kinks import run_with_kinks
from distir.interp.reference import run_reference
from distir.ir import Device, DType, FunctionBuilder, Module, TensorType
from distir.ops import REGISTRY


def _relu_then_max() -> Module:
    d0 = Device(0)
    fb = FunctionBuilder("f", REGISTRY.out_arity)
    x = fb.param("x", TensorType(DType.f32, (2, 3), d0))
    b = fb.param("b", TensorType(DType.f32, (3,), d0))
    (r,) = fb.op("Neg", x)  # application 0: not piecewise
    (y,) = fb.op("Relu", r)  # application 1
    (m,) = fb.op("Max", y, b)  # application 2: b broadcast over rows
    return distir.check(Module((fb.ret(y, m),)))


X = np.array([[1.0, -2e-6, 3.0], [-4.0, 5.0, 1e-3]])
B = np.array([0.5, 5.0 + 1e-6, -1.0])


def test_units_within_the_bound_are_recorded_with_their_application_and_element() -> None:
    run = run_with_kinks(_relu_then_max(), [X, B], tol=1e-4)
    # Relu of -X: bound 1e-4 x max(1, max|-X|) = 5e-4; only -X[0, 1] = 2e-6 is within it
    # (-X[1, 2] = -1e-3 is not). Max(y, b) with y = [[0, 2e-6, 0], [4, 0, 0]]: every y - b is
    # at least 0.5 away from 0, against a bound of 1e-4 x 5.000001
    assert [(u.application, u.element, u.op) for u in run.units] == [(1, 1, "Relu")]
    assert np.isclose(run.units[0].distance, 2e-6) and np.isclose(run.units[0].bound, 1e-4 * 5.0)
    near = run_with_kinks(_relu_then_max(), [X, np.array([0.5, 1e-5, -1.0])], tol=1e-4).units
    # now y[0, 1] - b[1] = 2e-6 - 1e-5 and y[1, 1] - b[1] = -1e-5 are within 1e-4 x 4 of Max's kink
    assert {(u.application, u.element) for u in near if u.op == "Max"} == {(2, 1), (2, 4)}


def test_a_reversed_unit_takes_the_other_branch_and_nothing_else_changes() -> None:
    m = _relu_then_max()
    exact = run_reference(m, [X, B])
    y, mx = run_with_kinks(m, [X, B], tol=1e-4, flips=[(1, 1)]).outputs
    want = np.maximum(-X, 0)
    want[0, 1] = 0.0  # -X[0, 1] = 2e-6 > 0 in exact arithmetic; reversed, the unit is off
    np.testing.assert_array_equal(y, want)
    assert not np.array_equal(y, exact[0])
    np.testing.assert_array_equal(mx, np.maximum(want, B))


def test_a_reversed_comparison_against_a_broadcast_threshold_flips_that_element() -> None:
    d0 = Device(0)
    fb = FunctionBuilder("f", REGISTRY.out_arity)
    a = fb.param("a", TensorType(DType.f32, (2, 3), d0))
    b = fb.param("b", TensorType(DType.f32, (3,), d0))
    (g,) = fb.op("Greater", a, b)
    m = distir.check(Module((fb.ret(g),)))
    av = np.array([[0.5 + 1e-7, 0.0, 0.0], [0.0, 9.0, 0.0]])
    run = run_with_kinks(m, [av, B], tol=1e-4)
    assert (0, 0) in {(u.application, u.element) for u in run.units}
    (flipped,) = run_with_kinks(m, [av, B], tol=1e-4, flips=[(0, 0)]).outputs
    want = av > B
    want[0, 0] = not want[0, 0]
    np.testing.assert_array_equal(flipped, want)


def test_piecewise_ops_declare_their_kink() -> None:
    # the ops whose result jumps or bends where an input crosses a threshold
    expect = {"Relu": (0, None), "ReluGrad": (1, None), "Max": (0, 1), "Min": (0, 1)}
    expect |= {c: (0, 1) for c in ("Less", "LessOrEqual", "Greater", "GreaterOrEqual")}
    got = {d.name: (d.kink.x, d.kink.at) for d in REGISTRY if d.kink is not None}
    assert got == expect
    # and the declared input does decide: ReluGrad(dY, X) = dY where X > 0
    relu_grad = REGISTRY["ReluGrad"].reference
    assert relu_grad is not None
    (dx,) = relu_grad([np.array([2.0, 2.0]), np.array([1e-9, -1e-9])], {})
    assert dx.tolist() == [2.0, 0.0]
