"""Conv, MaxPool, AveragePool and their gradients: references against direct loops and ONNX's
test vectors, the one-axis helpers behind spatial sharding (output sizes, halo ranges), costs
and type errors. Finite-difference checks of the gradient ops are in ``test_ops_gradcheck``."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from ops_examples import T, f16, f32, f64, i64

from distir.ir.types import Type
from distir.ir.values import Attrs
from distir.ir.verify import OpSignatureError
from distir.ops import REGISTRY, OpTypeError
from distir.ops.conv import conv_output_size, halo_rows, input_range_for_output


def run(name: str, args: list[Any], attrs: dict[str, Any]) -> tuple[Any, ...]:
    d = REGISTRY[name]
    assert d.reference is not None
    return tuple(d.reference(args, Attrs(attrs)))


def window_attrs(r: int, attrs: dict[str, Any]) -> tuple[list[int], list[int], list[int]]:
    return (
        list(attrs.get("strides", [1] * r)),
        list(attrs.get("pads", [0] * 2 * r)),
        list(attrs.get("dilations", [1] * r)),
    )


# -- independent direct loops ---------------------------------------------------------------------
def direct_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: dict[str, Any]) -> np.ndarray:
    """One output element at a time: sum over its group's channels and the kernel positions that
    land inside the input."""
    (n_, c_), m_, kernel, size = x.shape[:2], w.shape[0], w.shape[2:], x.shape[2:]
    r, group = len(kernel), attrs.get("group", 1)
    s, p, d = window_attrs(r, attrs)
    out = [(size[i] + p[i] + p[r + i] - d[i] * (kernel[i] - 1) - 1) // s[i] + 1 for i in range(r)]
    cg, mg = c_ // group, m_ // group
    y = np.zeros((n_, m_, *out))
    for n, m, *o in itertools.product(range(n_), range(m_), *(range(k) for k in out)):
        acc = 0.0 if b is None else float(b[m])
        for c, *k in itertools.product(range(cg), *(range(k) for k in kernel)):
            pos = [o[i] * s[i] - p[i] + k[i] * d[i] for i in range(r)]
            if all(0 <= pos[i] < size[i] for i in range(r)):
                acc += x[(n, (m // mg) * cg + c, *pos)] * w[(m, c, *k)]
        y[(n, m, *o)] = acc
    return y


def direct_pool(kind: str, x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """Windows listed position by position: max or mean of the input elements inside, divided
    (count_include_pad) by the positions inside the padded input."""
    kernel, size = attrs["kernel_shape"], x.shape[2:]
    r = len(kernel)
    s, p, d = window_attrs(r, attrs)
    out = []
    for i in range(r):
        span = size[i] + p[i] + p[r + i] - d[i] * (kernel[i] - 1) - 1
        o = (math.ceil(span / s[i]) if attrs.get("ceil_mode") else span // s[i]) + 1
        out.append(o - 1 if attrs.get("ceil_mode") and (o - 1) * s[i] >= size[i] + p[i] else o)
    y = np.zeros((*x.shape[:2], *out))
    for n, c, *o in itertools.product(*(range(k) for k in (*x.shape[:2], *out))):
        vals, padded = [], 0
        for k in itertools.product(*(range(k) for k in kernel)):
            pos = [o[i] * s[i] - p[i] + k[i] * d[i] for i in range(r)]
            padded += all(-p[i] <= pos[i] < size[i] + p[r + i] for i in range(r))
            if all(0 <= pos[i] < size[i] for i in range(r)):
                vals.append(x[(n, c, *pos)])
        if kind == "MaxPool":
            y[(n, c, *o)] = max(vals)
        else:
            y[(n, c, *o)] = sum(vals) / (padded if attrs.get("count_include_pad") else len(vals))
    return y


# -- Conv -----------------------------------------------------------------------------------------
CONV_CASES = [
    ((2, 3, 6, 5), (4, 3, 3, 2), True, {}),
    ((1, 2, 7, 7), (3, 2, 3, 3), False, {"strides": (2, 3), "pads": (1, 0, 2, 1)}),
    ((1, 2, 9, 8), (2, 2, 2, 3), True, {"dilations": (3, 2), "pads": (0, 2, 1, 0)}),
    ((2, 4, 5, 5), (6, 2, 3, 3), True, {"group": 2, "strides": (2, 1), "pads": (1, 1, 1, 1)}),
    ((1, 3, 6, 6), (6, 1, 3, 3), False, {"group": 3, "pads": (1, 1, 1, 1), "dilations": (2, 1)}),
    ((2, 3, 11), (4, 3, 3), True, {"strides": (2,), "pads": (2, 1), "dilations": (2,)}),
    ((1, 4, 10), (4, 1, 4), True, {"group": 4, "strides": (3,), "pads": (3, 3)}),
    ((1, 2, 4, 5, 3), (2, 2, 2, 3, 2), True, {"pads": (1, 0, 1, 0, 1, 1), "strides": (1, 2, 1)}),
    ((1, 2, 3, 3), (2, 2, 3, 3), True, {"pads": (5, 0, 0, 4)}),  # pads beyond the kernel
]


@pytest.mark.parametrize(("xs", "ws", "bias", "attrs"), CONV_CASES, ids=[str(c[3]) for c in CONV_CASES])
def test_conv_matches_direct_loops(xs: tuple[int, ...], ws: tuple[int, ...], bias: bool, attrs: dict) -> None:
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    (y,) = run("Conv", [x, w, b] if bias else [x, w], attrs)
    want = direct_conv(x, w, b if bias else None, attrs)
    assert y.dtype == np.float64 and y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    (t,) = REGISTRY["Conv"].infer_types([T(f64, *xs), T(f64, *ws)], Attrs(attrs), [None, None])
    assert t.shape == want.shape


def test_conv_explicit_defaults_and_kernel_shape_change_nothing() -> None:
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((1, 2, 5, 4)), rng.standard_normal((3, 2, 2, 2))
    (y,) = run("Conv", [x, w], {})
    attrs = {"strides": (1, 1), "pads": (0,) * 4, "dilations": (1, 1), "group": 1, "kernel_shape": (2, 2)}
    np.testing.assert_array_equal(run("Conv", [x, w], attrs)[0], y)


@pytest.mark.parametrize(("dtype", "tol"), [(np.float32, 1e-5), (np.float16, 2e-3)])
def test_conv_keeps_the_dtype_and_rounds_once(dtype: type, tol: float) -> None:
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 3, 6, 6)).astype(dtype), rng.standard_normal((4, 3, 3, 3)).astype(dtype)
    b = rng.standard_normal(4).astype(dtype)
    (y,) = run("Conv", [x, w, b], {"pads": (1, 1, 1, 1)})
    assert y.dtype == dtype
    want = direct_conv(
        x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), {"pads": (1, 1, 1, 1)}
    )
    np.testing.assert_allclose(y, want.astype(dtype), rtol=tol, atol=tol)


def test_conv_flops_count_multiply_adds_and_bias() -> None:
    d = REGISTRY["Conv"]
    ins = [T(f32, 2, 4, 5, 5), T(f32, 6, 2, 3, 3), T(f32, 6)]
    attrs = Attrs({"group": 2, "strides": (2, 2)})
    (y,) = d.infer_types(ins, attrs, [None] * 3)
    assert y.shape == (2, 6, 2, 2)
    out = 2 * 6 * 2 * 2
    assert d.flops(ins, [y], attrs) == 2 * out * 2 * 9 + out
    assert d.flops(ins[:2], [y], attrs) == 2 * out * 2 * 9
    g = REGISTRY["ConvGrad"]
    assert g.flops([y, *ins[:2]], [], attrs) == 4 * out * 2 * 9 + out
    pool = Attrs({"kernel_shape": (3, 2)})
    (p,) = REGISTRY["MaxPool"].infer_types([T(f32, 1, 2, 4, 4)], pool, [None])
    assert REGISTRY["MaxPool"].flops([T(f32, 1, 2, 4, 4)], [p], pool) == 6 * 2 * 2 * 3


# -- pooling ----------------------------------------------------------------------------------------
POOL_CASES = [
    ((2, 2, 6, 6), {"kernel_shape": (2, 2), "strides": (2, 2)}),
    ((1, 2, 7, 5), {"kernel_shape": (3, 2), "strides": (2, 1), "pads": (1, 0, 2, 1)}),
    ((1, 2, 7, 6), {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1), "ceil_mode": 1}),
    ((1, 1, 8, 8), {"kernel_shape": (2, 3), "strides": (3, 2), "ceil_mode": 1}),
    ((2, 1, 9), {"kernel_shape": (3,), "strides": (2,), "pads": (2, 2), "ceil_mode": 1}),
    ((1, 2, 3, 4, 5), {"kernel_shape": (2, 2, 3), "strides": (1, 2, 2), "pads": (1, 0, 1, 0, 1, 1)}),
]
MAX_ONLY = [
    ((1, 2, 9, 7), {"kernel_shape": (2, 3), "dilations": (3, 2), "pads": (1, 0, 2, 1)}),
    ((1, 1, 10), {"kernel_shape": (3,), "dilations": (2,), "strides": (3,), "pads": (1, 2), "ceil_mode": 1}),
]
POOLS = [
    *(("MaxPool", xs, a) for xs, a in [*POOL_CASES, *MAX_ONLY]),
    *(("AveragePool", xs, a) for xs, a in POOL_CASES),
    *(("AveragePool", xs, {**a, "count_include_pad": 1}) for xs, a in POOL_CASES),
]


@pytest.mark.parametrize(("kind", "xs", "attrs"), POOLS, ids=[f"{k}-{a}" for k, _, a in POOLS])
def test_pool_matches_direct_loops(kind: str, xs: tuple[int, ...], attrs: dict[str, Any]) -> None:
    x = np.random.default_rng(3).standard_normal(xs)
    (y,) = run(kind, [x], attrs)
    want = direct_pool(kind, x, attrs)
    assert y.dtype == np.float64 and y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-13, atol=1e-14)
    (t,) = REGISTRY[kind].infer_types([T(f64, *xs)], Attrs(attrs), [None])
    assert t.shape == want.shape


def test_onnx_backend_test_vectors() -> None:
    """Cases from ONNX's backend tests (averagepool_2d_ceil, maxpool_2d_ceil,
    maxpool_2d_ceil_output_size_reduce_by_one, averagepool_2d_pads_count_include_pad)."""
    x = np.arange(1, 17, dtype=np.float32).reshape(1, 1, 4, 4)
    ceil = {"kernel_shape": (3, 3), "strides": (2, 2), "ceil_mode": 1}
    np.testing.assert_array_equal(run("AveragePool", [x], ceil)[0], [[[[6, 7.5], [12, 13.5]]]])
    np.testing.assert_array_equal(run("MaxPool", [x], ceil)[0], [[[[11, 12], [15, 16]]]])
    (y,) = run("MaxPool", [x[:, :, :2, :2]], {"kernel_shape": (1, 1), "strides": (2, 2), "ceil_mode": 1})
    np.testing.assert_array_equal(y, [[[[1]]]])
    ones = np.ones((1, 1, 2, 2), np.float32)
    inc = {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1)}
    np.testing.assert_array_equal(
        run("AveragePool", [ones], {**inc, "count_include_pad": 1})[0], np.float32(4 / 9)
    )
    np.testing.assert_array_equal(run("AveragePool", [ones], inc)[0], 1.0)


def test_pools_keep_the_dtype() -> None:
    x = np.random.default_rng(4).standard_normal((1, 2, 5, 5)).astype(np.float16)
    for kind in ("MaxPool", "AveragePool"):
        (y,) = run(kind, [x], {"kernel_shape": (2, 2), "pads": (1, 1, 0, 0)})
        assert y.dtype == np.float16
        want = direct_pool(kind, x.astype(np.float64), {"kernel_shape": (2, 2), "pads": (1, 1, 0, 0)})
        np.testing.assert_allclose(y, want.astype(np.float16), rtol=1e-3)


def test_max_pool_grad_routes_ties_to_the_first_maximum() -> None:
    x, dy = np.ones((1, 1, 4)), np.array([[[1.0, 10.0, 100.0]]])
    (dx,) = run("MaxPoolGrad", [dy, x], {"kernel_shape": (2,)})
    np.testing.assert_array_equal(dx, [[[1, 10, 100, 0]]])
    (dx,) = run("MaxPoolGrad", [dy[..., :2], x], {"kernel_shape": (2,), "pads": (1, 0), "strides": (2,)})
    np.testing.assert_array_equal(dx, [[[1, 10, 0, 0]]])  # -inf padding never wins


def test_conv_grad_bias_sums_dy_and_keeps_dtype() -> None:
    rng = np.random.default_rng(5)
    x, w = (
        rng.standard_normal((2, 2, 5)).astype(np.float32),
        rng.standard_normal((3, 2, 2)).astype(np.float32),
    )
    dy = rng.standard_normal((2, 3, 4)).astype(np.float32)
    dx, dw, db = run("ConvGrad", [dy, x, w], {})
    assert (dx.dtype, dw.dtype, db.dtype) == (np.float32,) * 3
    assert (dx.shape, dw.shape, db.shape) == (x.shape, w.shape, (3,))
    np.testing.assert_allclose(db, dy.astype(np.float64).sum(axis=(0, 2)), rtol=1e-6)


# -- one-axis helpers for sharding ------------------------------------------------------------------
def random_axis(rng: np.random.Generator, pool: bool, dilate: bool = True) -> dict[str, int]:
    while True:
        k, s, d = int(rng.integers(1, 5)), int(rng.integers(1, 4)), int(rng.integers(1, 4)) if dilate else 1
        ext = d * (k - 1) + 1
        hi = ext if pool else ext + 3  # pools need pads below the kernel extent
        pb, pe, n = int(rng.integers(0, hi)), int(rng.integers(0, hi)), int(rng.integers(1, 14))
        if n + pb + pe >= ext:
            return {"n": n, "k": k, "s": s, "d": d, "pb": pb, "pe": pe}


def test_conv_output_size_counts_the_windows_that_fit() -> None:
    rng = np.random.default_rng(6)
    for _ in range(500):
        a = random_axis(rng, pool=True)
        n, k, s, d, pb, pe = a.values()
        ext, padded = d * (k - 1) + 1, n + pb + pe
        fit = sum(1 for o in range(64) if o * s + ext <= padded)
        assert conv_output_size(n, k, s, pb, pe, d) == fit, a
        # ceil mode: also windows that start before padded - ext + s, but not in the end pad
        part = sum(1 for o in range(64) if o * s < padded - ext + s and o * s < n + pb)
        assert conv_output_size(n, k, s, pb, pe, d, ceil_mode=True) == part, a


def test_conv_output_size_rejects_bad_arguments() -> None:
    assert conv_output_size(5, 3, 1, 0, 0, 1) == 3
    for args in [
        (2, 3, 1, 0, 0, 1),
        (5, 3, 1, 0, 0, 3),
        (5, 0, 1, 0, 0, 1),
        (5, 3, 0, 0, 0, 1),
        (5, 3, 1, -1, 0, 1),
    ]:
        with pytest.raises(ValueError):
            conv_output_size(*args)


def test_input_range_is_the_span_of_the_windows() -> None:
    rng = np.random.default_rng(7)
    for _ in range(500):
        k, s, d, pb = (int(v) for v in rng.integers(1, 5, size=4))
        a = int(rng.integers(0, 8))
        b = a + int(rng.integers(1, 6))
        rows = [o * s - pb + j * d for o in range(a, b) for j in range(k)]
        assert input_range_for_output(a, b, k, s, pb, d) == (min(rows), max(rows) + 1)
    assert input_range_for_output(3, 3, 3, 2, 1, 1) == (5, 5)


@pytest.mark.parametrize(
    ("kind", "extra"),
    [("Conv", {}), ("MaxPool", {}), ("MaxPool", {"ceil_mode": 1}), ("AveragePool", {"ceil_mode": 1}),
     ("AveragePool", {"count_include_pad": 1})],
)  # fmt: skip
def test_outputs_computed_from_the_input_range_equal_the_global_slice(kind: str, extra: dict) -> None:
    """Shard the output rows along H: each shard, computed from just its input rows (padded where
    they leave the input, ceil_mode off), equals the slice of the global output. Integer-valued
    inputs make both exact, so they must agree bit for bit. (W has stride 1: ceil mode is moot.)"""
    rng = np.random.default_rng(8)
    for _ in range(40):
        a = random_axis(rng, pool=kind != "Conv", dilate=kind != "AveragePool")
        n, k, s, d, pb, pe = a.values()
        x = rng.integers(-5, 6, size=(2, 2, n, 5)).astype(np.float64)
        attrs = {**extra, "strides": (s, 1), "pads": (pb, 1, pe, 0), "dilations": (d, 1)}
        args: list[Any] = [x]
        if kind == "Conv":
            args.append(rng.integers(-3, 4, size=(3, 2, k, 2)).astype(np.float64))
        else:
            attrs["kernel_shape"] = (k, 2)
        if kind == "AveragePool":
            attrs.pop("dilations")
        (full,) = run(kind, args, attrs)
        start = int(rng.integers(0, full.shape[2]))
        stop = int(rng.integers(start + 1, full.shape[2] + 1))
        lo, hi = input_range_for_output(start, stop, k, s, pb, d)
        first, last, before, after = halo_rows(lo, hi, n)
        assert before + (last - first) + after == hi - lo
        local = {**attrs, "pads": (before, 1, after, 0)}
        if "ceil_mode" in local:
            local["ceil_mode"] = 0
        (part,) = run(kind, [x[:, :, first:last], *args[1:]], local)
        np.testing.assert_array_equal(part, full[:, :, start:stop], err_msg=f"{a} {start}:{stop}")


# -- type errors ------------------------------------------------------------------------------------
@dataclass
class Bad:
    """A call whose rule must fail with ``match``, expected, actual and input index, and its
    one-change fix (``fix_types``/``fix_attrs``, merged over the bad ones) that must type."""

    op: str
    types: list[Type]
    attrs: dict[str, Any]
    match: str
    expected: Any
    actual: Any
    index: int | None
    fix_types: dict[int, Type] = field(default_factory=dict)
    fix_attrs: dict[str, Any] = field(default_factory=dict)


X2, W2 = T(f32, 1, 4, 5, 5), T(f32, 2, 4, 3, 3)
BAD = [
    Bad("Conv", [X2, T(f32, 2, 3, 3, 3)], {}, "channel mismatch", 4, 3, 1, {1: W2}),
    Bad("Conv", [X2, T(f32, 2, 2, 3, 3)], {"group": 3}, "does not divide the 4 input",
        "a divisor of 4", 3, None, fix_attrs={"group": 2}),
    Bad("Conv", [X2, T(f32, 3, 2, 3, 3)], {"group": 2}, "does not divide the 3 output",
        "a multiple of 2", 3, 1, {1: T(f32, 4, 2, 3, 3)}),
    Bad("Conv", [T(f32, 1, 4, 2, 5), W2], {}, "larger than the padded input", ">= 3", 2, 0,
        fix_attrs={"pads": (1, 0, 0, 0)}),
    Bad("Conv", [T(f32, 1, 1, 5), T(f32, 1, 1, 3)], {"dilations": (3,)}, "extent 7", ">= 7", 5, 0,
        fix_attrs={"pads": (1, 1)}),
    Bad("Conv", [T(f32, 4, 5), T(f32, 4, 5)], {}, "rank >= 3", ">= 3", 2, 0,
        {0: T(f32, 1, 4, 5), 1: T(f32, 2, 4, 3)}),
    Bad("Conv", [X2, T(f32, 2, 4, 3)], {}, "rank of X", 4, 3, 1, {1: W2}),
    Bad("Conv", [X2, W2, T(f32, 3)], {}, "bias B must have shape", (2,), (3,), 2, {2: T(f32, 2)}),
    Bad("Conv", [X2, W2, T(f64, 2)], {}, "dtype", f32, f64, 2, {2: T(f32, 2)}),
    Bad("Conv", [T(i64, 1, 4, 5, 5), W2], {}, "floating-point", "a float dtype", i64, 0, {0: X2}),
    Bad("Conv", [X2, W2], {"strides": (1,)}, "strides needs 2 values", 2, 1, None,
        fix_attrs={"strides": (1, 2)}),
    Bad("Conv", [X2, W2], {"pads": (1, 1)}, "begins, then ends", 4, 2, None,
        fix_attrs={"pads": (1, 1, 0, 0)}),
    Bad("Conv", [X2, W2], {"strides": (0, 1)}, ">= 1", ">= 1", (0, 1), None, fix_attrs={"strides": (2, 1)}),
    Bad("Conv", [X2, W2], {"kernel_shape": (2, 2)}, "does not match W", (2, 2), (3, 3), 1,
        fix_attrs={"kernel_shape": (3, 3)}),
    Bad("MaxPool", [X2], {"kernel_shape": (2,)}, "2 spatial axes", 2, 1, None,
        fix_attrs={"kernel_shape": (2, 2)}),
    Bad("MaxPool", [X2], {"kernel_shape": (2, 2), "pads": (2, 0, 0, 0)}, "smaller than the kernel extent",
        "< 2", (2, 0), None, fix_attrs={"pads": (1, 0, 0, 0)}),
    Bad("AveragePool", [T(f32, 1, 1, 2, 2)], {"kernel_shape": (3, 3)}, "larger than the padded", ">= 3", 2, 0,
        fix_attrs={"pads": (1, 1, 0, 0)}),
    Bad("AveragePool", [X2], {"kernel_shape": (2, 2), "pads": (-1, 0, 0, 0)}, ">= 0", ">= 0",
        (-1, 0, 0, 0), None, fix_attrs={"pads": (1, 0, 0, 0)}),
    Bad("ConvGrad", [T(f32, 1, 2, 4, 4), X2, W2], {}, "dY has shape", (1, 2, 3, 3), (1, 2, 4, 4), 0,
        {0: T(f32, 1, 2, 3, 3)}),
    Bad("MaxPoolGrad", [T(f64, 1, 4, 4, 4), X2], {"kernel_shape": (2, 2)}, "dtype", f32, f64, 0,
        {0: T(f32, 1, 4, 4, 4)}),
    Bad("AveragePoolGrad", [T(f32, 1, 4, 4, 4), T(f16, 1, 4, 5)], {"kernel_shape": (2, 2)}, "spatial axes",
        1, 2, None, {1: X2}),
]  # fmt: skip


def infer(op: str, types: list[Type], attrs: dict[str, Any]) -> tuple[Type, ...]:
    return REGISTRY[op].infer_types(types, Attrs(attrs), [None] * len(types))


@pytest.mark.parametrize("bad", BAD, ids=[f"{b.op}:{b.match}" for b in BAD])
def test_bad_inputs_raise_op_type_error_and_one_change_fixes_them(bad: Bad) -> None:
    with pytest.raises(OpTypeError, match=bad.match) as info:
        infer(bad.op, bad.types, bad.attrs)
    e = info.value
    assert (e.expected, e.actual, e.index) == (bad.expected, bad.actual, bad.index)
    assert bad.fix_types or bad.fix_attrs
    fixed = [bad.fix_types.get(i, t) for i, t in enumerate(bad.types)]
    assert infer(bad.op, fixed, {**bad.attrs, **bad.fix_attrs})


def test_attribute_schema() -> None:
    with pytest.raises(OpSignatureError, match="requires attribute 'kernel_shape'"):
        REGISTRY["MaxPool"].check_attrs(Attrs({}))
    with pytest.raises(OpSignatureError, match="ceil_mode"):
        REGISTRY["AveragePool"].check_attrs(Attrs({"kernel_shape": (2,), "ceil_mode": 2}))
    with pytest.raises(OpSignatureError, match="no attribute 'dilations'"):
        REGISTRY["AveragePool"].check_attrs(Attrs({"kernel_shape": (2,), "dilations": (1,)}))
    with pytest.raises(OpSignatureError, match=r"takes 2\.\.3 inputs"):
        REGISTRY["Conv"].check_arity(1)
