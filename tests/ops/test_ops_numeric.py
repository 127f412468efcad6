"""References checked against independent formulas (plain-Python loops over ``math``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ops_examples import T, f32, f64, i64

from distir.ir.values import Attrs
from distir.ops import REGISTRY
from distir.ops._special import erf, erfc


def ref(name: str, args: Sequence[Any], **attrs: Any) -> tuple[Any, ...]:
    d = REGISTRY[name]
    assert d.reference is not None
    return tuple(d.reference(list(args), Attrs(attrs)))


def rows(x: np.ndarray) -> list[list[float]]:
    return [[float(v) for v in r] for r in x.reshape(x.shape[0], -1)]


# -- normalizations and softmax ---------------------------------------------------------------
def layer_norm_row(r: list[float], eps: float) -> list[float]:
    mu = math.fsum(r) / len(r)
    var = math.fsum((v - mu) ** 2 for v in r) / len(r)
    return [(v - mu) / math.sqrt(var + eps) for v in r]


def test_layer_norm_matches_row_formula() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 5)) * 3 + 1
    scale, bias = rng.standard_normal((4, 5)), rng.standard_normal((4, 5))
    (y,) = ref("LayerNormalization", [x, scale, bias], axis=1, epsilon=1e-3)
    for n, r in enumerate(rows(x)):
        want = np.array(layer_norm_row(r, 1e-3)).reshape(4, 5) * scale + bias
        np.testing.assert_allclose(y[n], want, rtol=1e-12, atol=1e-12)


def test_layer_norm_without_bias_and_f32_keeps_dtype() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    scale = rng.standard_normal(6).astype(np.float32)
    (y,) = ref("LayerNormalization", [x, scale])
    assert y.dtype == np.float32
    for n, r in enumerate(rows(x)):
        np.testing.assert_allclose(y[n], np.array(layer_norm_row(r, 1e-5)) * scale, rtol=1e-5, atol=1e-6)
    # normalized rows have mean 0 and variance ~1 before scaling
    (z,) = ref("LayerNormalization", [x, np.ones(6, np.float32)])
    np.testing.assert_allclose(z.mean(-1), 0, atol=1e-6)
    np.testing.assert_allclose(z.var(-1), 1, rtol=1e-3)


def test_rms_norm_matches_row_formula() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 2, 4))
    scale = rng.standard_normal((1, 4))
    (y,) = ref("RMSNormalization", [x, scale], axis=-2, epsilon=1e-2)
    for n, r in enumerate(rows(x)):
        rms = math.sqrt(math.fsum(v * v for v in r) / len(r) + 1e-2)
        np.testing.assert_allclose(y[n], np.array(r).reshape(2, 4) / rms * scale, rtol=1e-12)


def softmax_row(r: list[float]) -> list[float]:
    m = max(r)
    e = [math.exp(v - m) for v in r]
    s = math.fsum(e)
    return [v / s for v in e]


def test_softmax_matches_row_formula_on_any_axis() -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 4, 2)) * 5
    (y,) = ref("Softmax", [x], axis=1)
    for i in range(3):
        for k in range(2):
            np.testing.assert_allclose(y[i, :, k], softmax_row(list(x[i, :, k])), rtol=1e-13)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4), min_size=1, max_size=8), st.floats(-100, 100))
def test_softmax_is_a_distribution_and_shift_invariant(v: list[float], shift: float) -> None:
    x = np.array([v])
    (y,) = ref("Softmax", [x])
    (y2,) = ref("Softmax", [x + shift])
    assert np.all(np.isfinite(y)) and np.all(y >= 0)
    assert math.isclose(float(y.sum()), 1.0, rel_tol=1e-12)
    np.testing.assert_allclose(y, y2, atol=1e-9)
    np.testing.assert_allclose(y[0], softmax_row(v), rtol=1e-9, atol=1e-300)


# -- losses -----------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_matches_log_softmax_formula(reduction: str) -> None:
    rng = np.random.default_rng(5)
    scores = rng.standard_normal((4, 3, 2)) * 4
    labels = rng.integers(0, 3, size=(4, 2))
    (loss,) = ref("SoftmaxCrossEntropyLoss", [scores, labels], reduction=reduction)
    per = np.empty((4, 2))
    for n in range(4):
        for k in range(2):
            col = [float(s) for s in scores[n, :, k]]
            lse = max(col) + math.log(math.fsum(math.exp(s - max(col)) for s in col))
            per[n, k] = lse - col[labels[n, k]]
    want = {"mean": per.mean(), "sum": per.sum(), "none": per}[reduction]
    np.testing.assert_allclose(loss, want, rtol=1e-12, atol=1e-15)
    assert np.shape(loss) == np.shape(want)


def test_cross_entropy_of_a_sure_prediction_is_zero_and_uniform_is_log_c() -> None:
    scores = np.array([[50.0, -50.0, -50.0], [0.0, 0.0, 0.0]])
    (loss,) = ref("SoftmaxCrossEntropyLoss", [scores, np.array([0, 2])], reduction="none")
    np.testing.assert_allclose(loss, [0.0, math.log(3)], atol=1e-12)


@pytest.mark.parametrize(
    ("reduction", "want"), [("mean", 13 / 4), ("sum", 13.0), ("none", [[1.0, 0.0], [9.0, 3.0]])]
)
def test_mse_loss(reduction: str, want: Any) -> None:
    p = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    t = np.array([[0.0, 2.0], [0.0, 4.0 - math.sqrt(3)]], np.float32)
    (loss,) = ref("MSELoss", [p, t], reduction=reduction)
    assert loss.dtype == np.float32
    np.testing.assert_allclose(loss, want, rtol=1e-6, atol=1e-6)


# -- Adam -------------------------------------------------------------------------------------
def test_adam_matches_scalar_loop_over_steps() -> None:
    lr, b1, b2, eps = 0.05, 0.8, 0.95, 1e-6
    rng = np.random.default_rng(6)
    w = rng.standard_normal(5)
    m, v = np.zeros(5), np.zeros(5)
    ws, ms, vs = list(w), [0.0] * 5, [0.0] * 5
    for step in range(1, 5):
        g = rng.standard_normal(5)
        w, m, v = ref("Adam", [w, g, m, v, np.int64(step)], lr=lr, beta1=b1, beta2=b2, epsilon=eps)
        for j in range(5):
            ms[j] = b1 * ms[j] + (1 - b1) * g[j]
            vs[j] = b2 * vs[j] + (1 - b2) * g[j] ** 2
            mh, vh = ms[j] / (1 - b1**step), vs[j] / (1 - b2**step)
            ws[j] -= lr * mh / (math.sqrt(vh) + eps)
        np.testing.assert_allclose(w, ws, rtol=1e-13)
        np.testing.assert_allclose(m, ms, rtol=1e-13)
        np.testing.assert_allclose(v, vs, rtol=1e-13)


def test_adam_first_step_moves_each_weight_by_about_lr() -> None:
    g = np.array([3.0, -0.5, 1e-3], np.float32)
    w = np.zeros(3, np.float32)
    nw, nm, nv = ref("Adam", [w, g, np.zeros(3, np.float32), np.zeros(3, np.float32), np.array(1)], lr=0.1)
    assert nw.dtype == nm.dtype == nv.dtype == np.float32
    np.testing.assert_allclose(nw, -0.1 * np.sign(g), rtol=1e-4)
    np.testing.assert_allclose(nm, 0.1 * g, rtol=1e-6)
    np.testing.assert_allclose(nv, 0.001 * g * g, rtol=1e-5)


def test_adam_counts_ten_flops_per_weight() -> None:
    d, t = REGISTRY["Adam"], T(f32, 3, 4)
    assert d.flops([t, t, t, t, T(i64)], [t, t, t], Attrs()) == 120.0


# -- Gelu and erf -----------------------------------------------------------------------------
def test_gelu_matches_math_erf() -> None:
    x = np.concatenate([np.linspace(-8, 8, 1001), [0.0, -0.0, 1e-8, 30.0, -30.0]])
    (y,) = ref("Gelu", [x])
    want = [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x]
    # 1 + erf(x/√2) cancels for x << 0, so compare absolutely there ...
    np.testing.assert_allclose(y, want, rtol=1e-15, atol=1e-15)
    # ... and relatively against the cancellation-free erfc form
    tail = [0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x]
    np.testing.assert_allclose(y, tail, rtol=3e-14, atol=1e-300)  # x/√2 rounds differently
    x32 = x.astype(np.float32)
    (y32,) = ref("Gelu", [x32])
    assert y32.dtype == np.float32
    want32 = [0.5 * float(v) * math.erfc(-float(v) / math.sqrt(2)) for v in x32]
    np.testing.assert_allclose(y32, want32, rtol=1e-6, atol=1e-38)


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, width=64))
def test_erf_and_erfc_agree_with_math(v: float) -> None:
    got = float(erf(np.array([v]))[0])
    want = math.erf(v)
    assert abs(got - want) <= 4 * math.ulp(want), (v, got, want)
    gotc, wantc = float(erfc(np.array([v]))[0]), math.erfc(v)
    assert abs(gotc - wantc) <= 2e-15 * wantc + 1e-307, (v, gotc, wantc)


def test_erf_keeps_shape_sign_and_nan() -> None:
    out = erf(np.array([[-0.0, np.nan], [np.inf, -np.inf]]))
    assert out.shape == (2, 2)
    assert math.copysign(1, out[0, 0]) == -1 and math.isnan(out[0, 1])
    assert out[1, 0] == 1.0 and out[1, 1] == -1.0
    assert float(erf(np.float64(0.5))) == pytest.approx(math.erf(0.5), rel=1e-16)


# -- shape ops --------------------------------------------------------------------------------
def test_split_127_in_two_is_64_and_63() -> None:
    x = np.arange(127 * 2).reshape(127, 2)
    a, b = ref("Split", [x], num_splits=2)
    assert a.shape == (64, 2) and b.shape == (63, 2)
    np.testing.assert_array_equal(np.concatenate([a, b]), x)
    t = REGISTRY["Split"].infer_types([T(f32, 127, 2)], Attrs({"num_splits": 2}), [None])
    assert [o.shape for o in t] == [(64, 2), (63, 2)]  # type: ignore[union-attr]


def test_split_given_sizes() -> None:
    x = np.arange(20).reshape(2, 10)
    parts = ref("Split", [x], dim=-1, sizes=(3, 0, 7))
    assert [p.shape for p in parts] == [(2, 3), (2, 0), (2, 7)]
    np.testing.assert_array_equal(parts[2], x[:, 3:])


def test_reshape_zero_copies_and_minus_one_infers() -> None:
    x = np.arange(24).reshape(2, 3, 4)
    (y,) = ref("Reshape", [x, np.array([0, -1, 2])])
    assert y.shape == (2, 6, 2)
    np.testing.assert_array_equal(y.reshape(-1), np.arange(24))
    (t,) = REGISTRY["Reshape"].infer_types(
        [T(f32, 2, 3, 4), T(i64, 3)], Attrs(), [None, np.array([0, -1, 2])]
    )
    assert t.shape == (2, 6, 2)  # type: ignore[union-attr]


def test_gather_negative_indices_count_from_the_end() -> None:
    data = np.arange(12).reshape(4, 3)
    (y,) = ref("Gather", [data, np.array([-1, 0, -4])])
    np.testing.assert_array_equal(y, [[9, 10, 11], [0, 1, 2], [0, 1, 2]])
    (z,) = ref("Gather", [data, np.array([[-1], [1]])], axis=1)
    np.testing.assert_array_equal(z, [[[2], [1]], [[5], [4]], [[8], [7]], [[11], [10]]])


def test_slice_with_negative_starts_steps_and_clamping() -> None:
    x = np.arange(30).reshape(5, 6)
    (y,) = ref("Slice", [x], starts=(1, -3), ends=(4, 100), axes=(0, 1))
    np.testing.assert_array_equal(y, [[9, 10, 11], [15, 16, 17], [21, 22, 23]])
    (z,) = ref("Slice", [x], starts=(5,), ends=(0,), axes=(1,), steps=(-2,))
    np.testing.assert_array_equal(z, [[r * 6 + 5, r * 6 + 3, r * 6 + 1] for r in range(5)])


def test_gemm_with_transposes_and_bias_matches_loops() -> None:
    rng = np.random.default_rng(7)
    a, bm, c = rng.standard_normal((3, 2)), rng.standard_normal((4, 3)), rng.standard_normal(4)
    (y,) = ref("Gemm", [a, bm, c], transA=1, transB=1, alpha=0.5, beta=2.0)
    want = [
        [0.5 * math.fsum(a[k, i] * bm[j, k] for k in range(3)) + 2.0 * c[j] for j in range(4)]
        for i in range(2)
    ]
    np.testing.assert_allclose(y, want, rtol=1e-13)
    assert (
        REGISTRY["Gemm"].flops(
            [T(f64, 3, 2), T(f64, 4, 3), T(f64, 4)], [T(f64, 2, 4)], Attrs({"transA": 1, "transB": 1})
        )
        == 2 * 8 * 3 + 2 * 8
    )


# -- reductions -------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=4), data=st.data())
def test_reductions_match_numpy(shape: list[int], data: st.DataObject) -> None:
    rank = len(shape)
    axes = data.draw(st.lists(st.integers(-rank, rank - 1), unique_by=lambda a: a % rank, max_size=rank))
    keep = data.draw(st.sampled_from([0, 1]))
    x = np.random.default_rng(rank).standard_normal(shape)
    attrs: dict[str, Any] = {"keepdims": keep} | ({"axes": tuple(axes)} if axes else {})
    np_axes = tuple(a % rank for a in axes) if axes else None
    (s,) = ref("ReduceSum", [x], **attrs)
    (m,) = ref("ReduceMean", [x], **attrs)
    np.testing.assert_allclose(s, np.sum(x, axis=np_axes, keepdims=bool(keep)), rtol=1e-12)
    np.testing.assert_allclose(m, np.mean(x, axis=np_axes, keepdims=bool(keep)), rtol=1e-12)
    (t,) = REGISTRY["ReduceSum"].infer_types([T(f64, *shape)], Attrs(attrs), [None])
    assert t.shape == np.shape(s)  # type: ignore[union-attr]


def test_integer_reductions_keep_dtype_and_truncate_means() -> None:
    x = np.array([[-3, 0], [7, 2]], np.int32)
    (s,) = ref("ReduceSum", [x], axes=(1,), keepdims=0)
    (m,) = ref("ReduceMean", [x], axes=(1,), keepdims=0)
    assert s.dtype == m.dtype == np.int32
    np.testing.assert_array_equal(s, [-3, 9])
    np.testing.assert_array_equal(m, [-1, 4])  # -1.5 -> -1, 4.5 -> 4 (toward zero)
    assert REGISTRY["ReduceSum"].flops([T(f32, 4, 5)], [T(f32, 4)], Attrs()) == 16.0
