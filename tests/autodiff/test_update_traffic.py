"""``update_traffic``: what the step's update moves and launches per weight, counted by hand from
the ops ``training_step`` writes (the optimizer's op, and under mixed precision the gradient's
Cast up to fp32 and the master's Cast down to the compute copy)."""

from __future__ import annotations

import pytest

from distir.autodiff.train import Optimizer, UpdateTraffic, update_traffic
from distir.ir.types import DType


@pytest.mark.parametrize(
    ("opt", "dtype", "mixed", "want"),
    [
        # fused Adam on fp32 masters: reads w, g, m, v, writes w, m, v (7 × 4); casts 2→4 and 4→2
        (Optimizer("adam"), DType.bf16, True, UpdateTraffic(7 * 4 + 6 + 6, 3)),
        (Optimizer("adam"), DType.bf16, False, UpdateTraffic(7 * 2, 1)),
        (Optimizer("adam"), DType.f32, False, UpdateTraffic(7 * 4, 1)),
        # SGD reads w, g and writes w
        (Optimizer("sgd"), DType.f32, False, UpdateTraffic(3 * 4, 1)),
        (Optimizer("sgd"), DType.f16, True, UpdateTraffic(3 * 4 + 6 + 6, 3)),
        # torch's foreach AdamW: 12 tensors read and 8 written over the fp32 state
        (Optimizer("adam", kernels="foreach"), DType.bf16, True, UpdateTraffic(20 * 4 + 6 + 6, 3)),
    ],
)
def test_update_traffic_counts_the_ops_of_the_update(
    opt: Optimizer, dtype: DType, mixed: bool, want: UpdateTraffic
) -> None:
    got = update_traffic(opt, dtype, mixed)
    assert got.kernels == want.kernels
    assert got.bytes_per_param == pytest.approx(want.bytes_per_param)
