"""Cast's reference rounds to bf16 (the executor holds bf16 in float32): nearest, ties to even."""

from __future__ import annotations

import numpy as np

from distir.ir.types import DType
from distir.ops.elementwise import round_to_bf16
from distir.ops.registry import REGISTRY


def test_round_to_bf16_nearest_ties_to_even() -> None:
    one = np.float32(1.0)
    ulp = 2.0**-7  # bf16 keeps 7 fraction bits
    x = np.array([1.0, 1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp / 2 + 2**-20, -(1 + 3 * ulp / 2)], np.float32)
    np.testing.assert_array_equal(round_to_bf16(x), [1.0, 1.0, 1 + 2 * ulp, 1 + ulp, -(1 + 2 * ulp)])
    special = round_to_bf16(np.array([np.nan, np.inf, -np.inf, 3.4e38, -0.0], np.float32))
    assert np.isnan(special[0]) and list(special[1:3]) == [np.inf, -np.inf] and special[3] == np.inf
    assert np.signbit(special[4])
    assert round_to_bf16(one).shape == () and round_to_bf16(np.zeros((3, 2)).T).shape == (2, 3)


def test_cast_reference_rounds_to_bf16_only() -> None:
    cast = REGISTRY["Cast"].reference
    assert cast is not None
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1000)
    (b,) = cast([x], {"to": DType.bf16})
    assert b.dtype == np.float32
    bits = np.asarray(b).view(np.uint32)
    assert not np.any(bits & 0xFFFF)  # on the bf16 grid
    assert np.max(np.abs(b - x) / np.abs(x)) <= 2.0**-8  # within half a bf16 ulp
    (f,) = cast([x], {"to": DType.f32})
    np.testing.assert_array_equal(f, x.astype(np.float32))  # other casts as numpy does them
    (h,) = cast([x], {"to": DType.f16})
    assert h.dtype == np.float16
    (back,) = cast([b], {"to": DType.bf16})
    np.testing.assert_array_equal(back, b)  # idempotent


def test_a_pending_sum_passes_only_a_widening_float_cast() -> None:
    """bf16 → f32 keeps every value, so the f32 casts of a sum's pieces sum to the cast sum (exactly,
    for pieces on the bf16 grid): the rule offers P(sum) → P(sum); a narrowing cast and a cast to
    an integer round each piece, so they do not."""
    from distir.ir.dtensor import Partial
    from distir.ir.types import Device, TensorType

    D0 = Device(0)

    rule = REGISTRY["Cast"].sharding
    assert rule is not None
    total = Partial("sum")

    def passes(a: DType, b: DType) -> bool:
        got = rule([TensorType(a, (4, 8), D0)], [TensorType(b, (4, 8), D0)], {"to": b}, 2)  # type: ignore[arg-type]
        return any(s.ins == (total,) and s.outs == (total,) for s in got)

    assert passes(DType.bf16, DType.f32) and passes(DType.f16, DType.f32)
    assert not passes(DType.f32, DType.bf16) and not passes(DType.f32, DType.f32)
    assert not passes(DType.f32, DType.i64)
    pieces = round_to_bf16(np.random.default_rng(1).standard_normal((2, 16)))
    cast = REGISTRY["Cast"].reference
    assert cast is not None
    summed = sum(np.asarray(cast([p], {"to": DType.f32})[0], np.float64) for p in pieces)
    np.testing.assert_array_equal(summed, pieces.astype(np.float64).sum(axis=0))
