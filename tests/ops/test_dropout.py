"""Dropout and DropoutGrad (``distir.ops.nn``): the type rules, DropoutGrad's formula against
numpy on a given mask, the reference's p = 0 identity and its typed refusal of p > 0, the costs
at p > 0 (what the simulator charges), and every sharding strategy against the sequential
result."""

from __future__ import annotations

import math

import numpy as np
import pytest
from ops_examples import T, b, f16, f32, i64
from test_new_ops_sharding import Case, check

from distir.ir.values import Attrs
from distir.ops import REGISTRY, OpTypeError
from distir.ops.nn import DropoutError
from distir.ops.registry import Fusion

DROP, GRAD = REGISTRY["Dropout"], REGISTRY["DropoutGrad"]


def test_dropout_gives_y_like_x_and_a_bool_mask() -> None:
    y, mask = DROP.infer_types([T(f16, 2, 3, 4)], Attrs({"p": 0.1}), [None])
    assert y == T(f16, 2, 3, 4)
    assert mask == T(b, 2, 3, 4)
    assert mask.nbytes == 2 * 3 * 4  # one byte per element
    (dx,) = GRAD.infer_types([T(f32, 5), T(b, 5)], Attrs({"p": 0.5}), [None, None])
    assert dx == T(f32, 5)


@pytest.mark.parametrize(
    ("op", "types", "attrs", "fragment"),
    [
        ("Dropout", [T(f32, 3)], {"p": 1.0}, "p=1.0 must be in [0, 1)"),
        ("Dropout", [T(f32, 3)], {"p": -0.1}, "must be in [0, 1)"),
        ("Dropout", [T(i64, 3)], {"p": 0.1}, "float"),
        ("DropoutGrad", [T(f32, 3), T(f32, 3)], {"p": 0.1}, "mask must be bool"),
        ("DropoutGrad", [T(f32, 3), T(b, 4)], {"p": 0.1}, "mask must be bool (3,)"),
        ("DropoutGrad", [T(f32, 3), T(b, 3)], {"p": 1.5}, "must be in [0, 1)"),
    ],
)
def test_bad_input_is_a_typed_error(op: str, types: list, attrs: dict, fragment: str) -> None:
    with pytest.raises(OpTypeError) as e:
        REGISTRY[op].infer_types(types, Attrs(attrs), [None] * len(types))
    assert fragment in str(e.value)


def test_dropout_grad_is_dy_times_mask_over_keep_probability() -> None:
    rng = np.random.default_rng(3)
    dy = rng.standard_normal((4, 7))
    mask = rng.random((4, 7)) < 0.7
    assert GRAD.reference is not None
    (dx,) = GRAD.reference([dy, mask], Attrs({"p": 0.3}))
    want = np.zeros_like(dy)
    for i, j in np.ndindex(dy.shape):  # an independent loop: kept elements scaled by 1/0.7
        if mask[i, j]:
            want[i, j] = dy[i, j] / 0.7
    np.testing.assert_allclose(dx, want, rtol=1e-12)
    assert np.asarray(dx).dtype == np.float64


def test_reference_is_the_identity_at_p_zero_and_refuses_p_above() -> None:
    x = np.random.default_rng(4).standard_normal((3, 5)).astype(np.float32)
    assert DROP.reference is not None
    y, mask = DROP.reference([x], Attrs({"p": 0.0}))
    np.testing.assert_array_equal(y, x)
    assert np.asarray(mask).dtype == np.bool_ and np.asarray(mask).all()
    with pytest.raises(DropoutError, match="no sequential reference"):
        DROP.reference([x], Attrs({"p": 0.1}))


def test_costs_at_p_above_zero() -> None:
    """The simulator charges p > 0: X read, Y and the 1-byte mask written, a few FLOPs per element."""
    x = T(f32, 8, 16)
    outs = DROP.infer_types([x], Attrs({"p": 0.1}), [None])
    attrs = Attrs({"p": 0.1})
    n = 8 * 16
    assert DROP.bytes_read([x], outs, attrs) == 4 * n
    assert DROP.bytes_written([x], outs, attrs) == 4 * n + n
    flops = DROP.flops([x], outs, attrs)
    assert math.isfinite(flops) and 0 < flops <= 4 * n
    assert DROP.fusion is Fusion.POINTWISE and GRAD.fusion is Fusion.POINTWISE


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("shape", [(4, 3), (3, 5, 2), (1, 6, 4)])
def test_every_dropout_strategy_is_sound(shape: tuple[int, ...], n: int) -> None:
    rng = np.random.default_rng(9)
    x = rng.standard_normal(shape)
    offered = check(Case("Dropout", (x,), {"p": 0.0}), n, 21)
    assert offered == 1 + sum(1 for s in shape if s > 1)  # replicated, and each dim of size > 1
    mask = rng.random(shape) < 0.6
    offered = check(Case("DropoutGrad", (x, mask), {"p": 0.4}), n, 22)
    assert offered == 2 + sum(1 for s in shape if s > 1)  # and a pending sum on dY
