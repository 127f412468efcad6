"""Pipeline partitions as Megatron-LM makes them: the strategy's ``L…`` counts repeated blocks;
the embedding always joins the first chunk, head and loss the last (``distir.parallel.pipeline.partition``)."""

from __future__ import annotations

import pytest

from distir.frontends.zoo import build_model
from distir.ir.types import DType
from distir.parallel.check import check_against_sequential
from distir.parallel.pipeline.partition import Ends, block_counts, call_counts, ends, partition
from distir.parallel.strategy import StrategyError, parse_strategy

GPT = "gpt:layers=4,hidden=8,heads=2,seq=4,vocab=16"


def _callees(spec: str, strategy: str, train: bool = True, batch: int = 4) -> list[list[str]]:
    model = build_model(spec, batch=batch)
    n = len(model.layers) if train else len(model.layers) - 1
    return [[model.layers[i].callee for i in r] for r in partition(model, parse_strategy(strategy), n)]


def test_uniform_divides_the_blocks_and_keeps_the_ends_on_the_end_chunks() -> None:
    assert _callees(GPT, "p2.k2") == [
        ["embed", "block", "block"],
        ["block", "block", "head", "loss"],
    ]
    # inference: no loss; the head still goes with the last chunk
    assert _callees(GPT, "p2.k2", train=False) == [["embed", "block", "block"], ["block", "block", "head"]]


def test_end_chunks_may_hold_no_block() -> None:
    assert _callees(GPT, "p3.k3.L0-4-0", batch=3) == [
        ["embed"],
        ["block"] * 4,
        ["head", "loss"],
    ]
    with pytest.raises(StrategyError, match="chunk 1 would hold no layer"):
        _callees(GPT, "p3.k3.L2-0-2", batch=3)
    with pytest.raises(StrategyError, match="covers 5 blocks, not 4"):
        _callees(GPT, "p2.k2.L2-3")
    with pytest.raises(StrategyError, match="5 pipeline chunks but the model has only 4 blocks"):
        _callees(GPT, "p5.k5", batch=5)


def test_a_1t_gpt_keeps_no_stage_with_the_head_alone() -> None:
    """Megatron's 1T GPT (128 layers of 25600) on 64 pipeline stages: two blocks per stage, the
    embedding with the first, head and loss with the last — no stage holds only the head."""
    model = build_model("gpt:layers=128,hidden=25600,heads=160,seq=2048,vocab=51200", batch=64)
    chunks = partition(model, parse_strategy("p64.k64"), len(model.layers))
    names = [[model.layers[i].callee for i in r] for r in chunks]
    assert all(n.count("block") == 2 for n in names)
    assert names[0][0] == "embed" and names[-1][-2:] == ["head", "loss"]
    assert sum(len(r) for r in chunks) == len(model.layers)


def test_params_balance_counts_blocks_only() -> None:
    """Equal blocks: balancing parameters is the uniform split (the embedding and the head's
    large vocabulary weights no longer pull a cut)."""
    model = build_model("gpt:layers=8,hidden=8,heads=2,seq=4,vocab=4096", batch=4)
    n = len(model.layers)
    assert partition(model, parse_strategy("p4.k4.Lparams"), n) == partition(
        model, parse_strategy("p4.k4"), n
    )


def test_counts_convert_both_ways() -> None:
    e = Ends(1, 2)
    assert call_counts((0, 4, 0), e) == (1, 4, 2)
    assert block_counts((1, 4, 2), e) == (0, 4, 0)
    assert block_counts((2, 4, 1), e) is None  # the loss away from the head
    model = build_model(GPT, batch=2)
    assert ends(model, len(model.layers)) == Ends(1, 2)
    assert ends(model, len(model.layers) - 1) == Ends(1, 1)
    assert ends(build_model("mlp:layers=3,hidden=4", batch=2), 4) == Ends(0, 1)


@pytest.mark.parametrize("strategy", ["p3.k3.L0-4-0", "p2.k3.L4-0", "p3.k3.1f1b.L1-2-1"])
def test_steps_with_end_only_chunks_equal_the_sequential_step(strategy: str) -> None:
    model = build_model(GPT, batch=3, dtype=DType.f64)
    cmp = check_against_sequential(model, parse_strategy(strategy))
    assert cmp.max_rel_diff < 1e-7, (cmp.worst, cmp.max_rel_diff)
