"""Recomputation applies to the repeated blocks only: the embedding, head and loss layers save
what their backward reads under every policy, as torchtitan (``apply_ac`` wraps each block of
``model.layers``) and Megatron-LM (recomputation inside its transformer block) run them."""

from __future__ import annotations

from collections import Counter

import pytest

from distir.autodiff.train import layer_types, layer_vjps
from distir.frontends.zoo import build_model
from distir.ir.types import DType

LLAMA = "llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=96,vocab=64,seq=16,loss=torch,norm=composite"


def _backward_ops(recompute: str) -> list[tuple[str, Counter[str]]]:
    model = build_model(LLAMA, 2, DType.f32)
    grads, _ = layer_vjps(model, layer_types(model), recompute)
    return [(model.layers[g.index].callee, Counter(op.name for op in g.vjp.bwd.ops())) for g in grads]


@pytest.mark.parametrize("recompute", ["ops", "full"])
def test_head_and_loss_are_not_recomputed(recompute: str) -> None:
    """The loss's backward reads the saved log-softmax (no LogSoftmax run again), the head's its
    saved norm (no ReduceMean run again); the blocks' backward recomputes their forward ops."""
    saved = dict(_backward_ops("none"))
    for callee, ops in _backward_ops(recompute):
        if callee in ("head", "loss"):
            assert ops == saved[callee], callee
    loss = dict(_backward_ops(recompute))["loss"]
    assert loss["LogSoftmax"] == 0 and loss["LogSoftmaxGrad"] == 1
    block = dict(_backward_ops(recompute))["block"]
    assert block["ReduceMean"] == 2 and saved["block"]["ReduceMean"] == 0
