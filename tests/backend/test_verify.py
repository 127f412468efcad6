"""Checking a real run against the reference: the allowance per precision, exact integers, the
count of elements outside the allowance, the precision a program computes in, and the kink-aware
check: a unit at a ReLU's kink decided the other way verifies, counted; a real error still fails
(numpy only; the "run" outputs are computed by numpy directly)."""

from __future__ import annotations

import numpy as np

import distir
from distir.backend.verify import TOLERANCE, compare, compute_dtype, reference_outputs, verify
from distir.ir import Device, DType, FunctionBuilder, Module, TensorType
from distir.ops import REGISTRY


def _program(dtype: DType) -> Module:
    d0, d1 = Device(0), Device(1)
    fb = FunctionBuilder("f", REGISTRY.out_arity)
    x = fb.param("x", TensorType(dtype, (4, 3), d0))
    i = fb.param("i", TensorType(DType.i64, (2,), d1))
    (y,) = fb.op("Neg", x)
    (j,) = fb.op("Neg", i)
    return distir.check(Module((fb.ret(y, j),)))


def _want(m: Module) -> dict[Device, tuple[np.ndarray, ...]]:
    x = np.arange(12, dtype=np.float32).reshape(4, 3) * 10.0  # max |y| = 110
    return reference_outputs(m, [x, np.array([1, 2])])


def test_a_float_output_passes_within_its_precisions_allowance_and_fails_beyond() -> None:
    m = _program(DType.f32)
    want = _want(m)
    allowed = TOLERANCE[DType.f32] * 110.0  # tol x max(1, max |reference|)
    for delta, ok in ((0.9 * allowed, True), (1.1 * allowed, False)):
        got = {d: tuple(np.array(v, copy=True) for v in vs) for d, vs in want.items()}
        got[Device(0)][0][1, 2] += delta
        v = compare(m, want, got)
        assert v.verified is ok
        assert np.isclose(v.max_abs_error, delta, rtol=1e-3)
        assert v.outside == (0 if ok else 1) and v.worst.startswith("d0: %") and v.size == 12


def test_integers_must_be_equal() -> None:
    m = _program(DType.f32)
    want = _want(m)
    got = {Device(0): want[Device(0)], Device(1): (want[Device(1)][0] + np.array([0, 1]),)}
    v = compare(m, want, got)
    assert not v.verified and v.outside == 1 and v.worst.startswith("d1:")


def test_the_allowance_is_that_of_the_lowest_precision_the_program_computes_in() -> None:
    assert compute_dtype(_program(DType.f64)) == DType.f64
    assert compute_dtype(_program(DType.bf16)) == DType.bf16
    m = _program(DType.bf16)
    want = _want(m)
    got = {d: tuple(np.array(v, copy=True) for v in vs) for d, vs in want.items()}
    got[Device(0)][0][0, 0] += 0.5 * TOLERANCE[DType.bf16] * 110.0  # far beyond f32's allowance
    assert compare(m, want, got).verified


def test_a_missing_output_fails() -> None:
    m = _program(DType.f32)
    want = _want(m)
    v = compare(m, want, {Device(0): (), Device(1): want[Device(1)]})
    assert not v.verified and v.max_abs_error == float("inf")


def test_the_reference_computes_in_float64_whatever_the_programs_dtype() -> None:
    """2^24 + 1 is not a float32: the reference keeps it (exact arithmetic is the oracle), so a
    float32 run is checked against the exact result, not against another float32 rounding."""
    fb = FunctionBuilder("f", REGISTRY.out_arity)
    x = fb.param("x", TensorType(DType.f32, (2,), Device(0)))
    y = fb.param("y", TensorType(DType.f32, (2,), Device(0)))
    (s,) = fb.op("Add", x, y)
    m = distir.check(Module((fb.ret(s),)))
    xs, ys = np.array([2.0**24, 3.0], np.float32), np.array([1.0, 0.5], np.float32)
    (ref,) = reference_outputs(m, [xs, ys])[Device(0)]
    assert ref.dtype == np.float64 and ref.tolist() == [2.0**24 + 1, 3.5]
    assert (xs + ys).tolist() == [2.0**24, 3.5]  # what a float32 reference would have said


def _relu_layer() -> Module:
    """One ReLU layer's step: a = Relu(x @ w), dW = xᵀ · ReluGrad(dA, x @ w)."""
    d0 = Device(0)
    fb = FunctionBuilder("f", REGISTRY.out_arity)
    x = fb.param("x", TensorType(DType.f32, (4, 3), d0))
    w = fb.param("w", TensorType(DType.f32, (3, 5), d0))
    da = fb.param("da", TensorType(DType.f32, (4, 5), d0))
    (h,) = fb.op("MatMul", x, w)
    (a,) = fb.op("Relu", h)
    (dh,) = fb.op("ReluGrad", da, h)
    (xt,) = fb.op("Transpose", x, perm=[1, 0])
    (dw,) = fb.op("MatMul", xt, dh)
    return distir.check(Module((fb.ret(a, dw),)))


def _at_kink_inputs() -> tuple[list[np.ndarray], np.ndarray]:
    """Inputs whose pre-activation h[2, 3] is 1e-6 in exact arithmetic, on a scale of ~3 (what
    float32's rounding of a sum can put on either side of 0), and h itself."""
    rng = np.random.default_rng(0)
    x, w, da = rng.standard_normal((4, 3)), rng.standard_normal((3, 5)), rng.standard_normal((4, 5))
    w[0, 3] -= (x[2] @ w[:, 3] - 1e-6) / x[2, 0]
    return [x, w, da], x @ w


def _run_as(h: np.ndarray, x: np.ndarray, da: np.ndarray) -> dict[Device, tuple[np.ndarray, ...]]:
    """What a run that computed the pre-activation as ``h`` returns (numpy, independently of
    the reference executor)."""
    return {Device(0): (np.maximum(h, 0), x.T @ (da * (h > 0)))}


def test_a_unit_at_its_kink_decided_the_other_way_verifies_with_the_count() -> None:
    m = _relu_layer()
    (x, w, da), h = _at_kink_inputs()
    assert abs(h[2, 3] - 1e-6) < 1e-12
    flipped = h.copy()
    flipped[2, 3] = -1e-6  # the unit off: dW's column 3 loses x[2] * da[2, 3]
    got = _run_as(flipped, x, da)
    assert not compare(m, reference_outputs(m, [x, w, da]), got).verified  # a real difference
    v = verify(m, [x, w, da], got)
    assert v.verified and v.kinks == 1
    assert np.isclose(v.kink_distance, 1e-6)
    assert v.kink_bound == TOLERANCE[DType.f32] * max(1.0, float(np.abs(h).max()))


def test_a_run_that_agrees_with_exact_arithmetic_reverses_no_unit() -> None:
    m = _relu_layer()
    (x, w, da), h = _at_kink_inputs()
    v = verify(m, [x, w, da], _run_as(h, x, da))
    assert v.verified and v.kinks == 0


def test_a_real_error_still_fails_with_or_beside_a_unit_at_a_kink() -> None:
    m = _relu_layer()
    (x, w, da), h = _at_kink_inputs()
    flipped = h.copy()
    flipped[2, 3] = -1e-6
    got = _run_as(flipped, x, da)
    got[Device(0)][1][0, 0] += 0.01  # beside the flip: an error no reversal explains
    assert not verify(m, [x, w, da], got).verified
    # a unit far from its kink switched off is an error, not rounding: h[1, 1] is not near 0
    far = h.copy()
    assert abs(far[1, 1]) > 0.1
    far[1, 1] = -far[1, 1]
    v = verify(m, [x, w, da], _run_as(far, x, da))
    assert not v.verified and v.kinks == 0
