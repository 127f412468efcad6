"""AdamRemainder: Apex DistributedFusedAdam's store_param_remainders. An fp32 value splits into its
bf16 rounding and an int16 remainder and joins back bit for bit; the update equals Adam's on the
fp32 master to the bit (numpy reference and torch implementation alike)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from distir.ir.values import Attrs
from distir.ops.elementwise import round_to_bf16
from distir.ops.optim import ADAM, ADAM_REMAINDER, join_remainder, split_remainder

ATTRS = Attrs({"lr": 0.01, "beta1": 0.9, "beta2": 0.95, "epsilon": 1e-8})


def _bits(x: Any) -> np.ndarray[Any, Any]:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def _values(n: int, seed: int = 0) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 4, n)).astype(np.float32)
    special = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 3.4e38, 1e-45], dtype=np.float32)
    ties = (np.arange(8, dtype=np.uint32) << 16 | 0x3F800000 | 0x8000).view(np.float32)  # low half 0x8000
    return np.concatenate([x, special, ties])


def test_split_then_join_gives_the_fp32_value_bit_for_bit() -> None:
    x = _values(4096)
    high, rem = split_remainder(x)
    assert rem.dtype == np.int16
    assert not (_bits(high) & 0xFFFF).any(), "the bf16 half is on the bf16 grid"
    assert np.array_equal(_bits(join_remainder(high, rem)), _bits(x))


def test_the_bf16_half_is_the_value_rounded_to_nearest_ties_away_from_zero() -> None:
    x = _values(4096)
    high, _ = split_remainder(x)
    tie = (_bits(x) & 0xFFFF) == 0x8000
    assert np.array_equal(high[~tie], round_to_bf16(x)[~tie])  # elsewhere round to nearest even
    assert (np.abs(high[tie]) > np.abs(x[tie])).all()  # Apex increments the high half at a tie


def _inputs(n: int) -> tuple[np.ndarray[Any, Any], ...]:
    rng = np.random.default_rng(1)
    w = rng.standard_normal(n).astype(np.float32)
    g = rng.standard_normal(n).astype(np.float32)
    m = (rng.standard_normal(n) * 0.1).astype(np.float32)
    v = np.abs(rng.standard_normal(n) * 0.1).astype(np.float32)
    return w, g, m, v


def test_the_reference_update_equals_adam_on_the_fp32_master() -> None:
    w, g, m, v = _inputs(1000)
    step = np.array(3, dtype=np.int64)
    assert ADAM.reference is not None and ADAM_REMAINDER.reference is not None
    want = ADAM.reference([w, g, m, v, step], ATTRS)
    high, rem = split_remainder(w)
    got = ADAM_REMAINDER.reference([high, rem, g, m, v, step], ATTRS)
    assert np.array_equal(_bits(join_remainder(got[0], got[1])), _bits(want[0]))
    assert np.array_equal(got[0], split_remainder(want[0])[0])
    assert np.array_equal(got[2], want[1]) and np.array_equal(got[3], want[2])


def test_the_torch_update_equals_torch_adam_on_the_fp32_master() -> None:
    torch = pytest.importorskip("torch")
    from distir.backend.context import TorchContext

    ctx = TorchContext.local()
    w, g, m, v = _inputs(1000)
    high, rem = split_remainder(w)
    step = torch.tensor(3)
    assert ADAM.torch is not None and ADAM_REMAINDER.torch is not None
    tg, tm, tv = (torch.from_numpy(a) for a in (g, m, v))
    want = ADAM.torch(ctx, [torch.from_numpy(w), tg, tm, tv, step], ATTRS)
    th = torch.from_numpy(high).bfloat16()
    got = ADAM_REMAINDER.torch(ctx, [th, torch.from_numpy(rem), tg, tm, tv, step], ATTRS)
    assert got[0].dtype == torch.bfloat16 and got[1].dtype == torch.int16
    joined = join_remainder(got[0].float().numpy(), got[1].numpy())
    assert np.array_equal(_bits(joined), _bits(want[0].numpy()))
    assert torch.equal(got[2], want[1]) and torch.equal(got[3], want[2])
