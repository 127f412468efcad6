"""Every strategy the MoE sharding rules offer (the tokens; the experts' hidden dim; MoEGrad's
pending dY) gives the sequential result on 2-3 devices (uneven and empty shards included)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from distir.ir.dtensor import Shard
from distir.ops.sharding import SUM

from .test_training_rules import check_rule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
from ops_examples import EXAMPLES


@pytest.mark.parametrize("op", ["MoE", "MoEGrad"])
@pytest.mark.parametrize("n", [2, 3])
def test_every_strategy_of_the_moe_rules_is_sound(op: str, n: int) -> None:
    for case in EXAMPLES[op]:
        for seed in range(2):
            found = check_rule(op, case, n, seed)
            assert any(s.outs[0] == SUM for s in found) and any(Shard(0) in s.ins for s in found)
