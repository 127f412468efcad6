"""Assembly: converted layers → a ``Model`` (``model.py``'s contract) at a global batch.

The chain is the converted layers in order — ``pre`` (the embedding), the blocks, ``post``
(final norm and head) — then the loss layer the importer appends: the module returns logits
(..., V) and ``@loss(logits, labels)`` is the zoo's token cross entropy (``gpt.token_loss_fn``:
summed over every position, scaled by 1/(batch · positions), vocabulary-parallel), with
``labels`` a model input shaped like the logits without their last dim (the targets, already
aligned: shift them for next-token prediction). A model returning its own loss is not supported:
return the logits.

Weights carry their torch names (``transformer.h.0.attn.c_attn.weight``) and their TP
placements from ``placements.tp_placement``; a weight used by two layers (GPT-2's tied token
embedding and head) is tied (``Model.tied``). The logits reach the loss sharded on the
vocabulary when the head's weight is vocabulary-sharded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from distir.frontends.torch_import.convert import Converted, Param
from distir.frontends.torch_import.placements import TP_PATTERNS, TPPattern, tp_placement
from distir.frontends.zoo._build import LayerCall, assemble, tensor, weight
from distir.frontends.zoo.gpt import token_loss_fn
from distir.frontends.zoo.model import REPLICATE, InputSpec, Model, ModelError, WeightSpec
from distir.ir.dtensor import Placement, Shard
from distir.ir.types import DType


def _placement(p: Param, patterns: Sequence[TPPattern]) -> Placement:
    """The pattern table speaks of (in, out) matrices; a weight a linear layer reads in torch's
    (out, in) layout (a tied embedding, stored as the table) has the dim flipped."""
    tp = tp_placement(p.name, len(p.shape), patterns)
    if p.linear_layout and isinstance(tp, Shard) and len(p.shape) == 2 and not _is_table(p.name, patterns):
        return Shard(1 - tp.dim)
    return tp


def _is_table(name: str, patterns: Sequence[TPPattern]) -> bool:
    import re

    return any(
        re.search(p.pattern, name) and p.matrix == Shard(0) and p.bias == REPLICATE and "embed" in p.pattern
        for p in patterns
    )


def build_imported(
    conv: Converted,
    name: str,
    batch: int,
    dtype: DType,
    config: Mapping[str, object] | None = None,
    tp_patterns: Sequence[TPPattern] = TP_PATTERNS,
) -> Model:
    """The ``Model`` of ``conv`` for a global ``batch`` in ``dtype`` (module docstring)."""
    if len(conv.output_shape) < 2 or conv.output_shape[0] is not None:
        raise ModelError(
            f"model {name}: the module must return logits (batch, ..., classes), got {conv.output_shape}"
        )
    vocab = conv.output_shape[-1]
    assert vocab is not None
    positions = tuple(d for d in conv.output_shape[1:-1])
    if any(d is None for d in positions):
        raise ModelError(
            f"model {name}: the logits {conv.output_shape} have a batch-dependent dim besides dim 0"
        )
    specs: dict[str, WeightSpec] = {}
    for p in conv.params.values():
        specs[p.name] = weight(p.name, dtype, p.shape, _placement(p, tp_patterns))
    first = tuple(d if d is not None else batch for d in conv.input_shape)
    high = vocab if conv.input_dtype.is_int else 0
    inputs = (
        InputSpec(
            conv.input_name, tensor(conv.input_dtype if conv.input_dtype.is_int else dtype, *first), high=high
        ),
        InputSpec("labels", tensor(DType.i64, batch, *positions), high=vocab),  # type: ignore[arg-type]
    )
    calls = [
        LayerCall(lay.fn, tuple(specs[w] for w in lay.weights), f"x{i}") for i, lay in enumerate(conv.layers)
    ]
    normalizer = batch * math.prod(positions)  # type: ignore[arg-type]
    calls.append(LayerCall(token_loss_fn(vocab, normalizer), ("labels",), "loss"))
    keys = [lay.key for lay in conv.layers]
    pre, post = int(keys[0] == "pre"), int(keys[-1] == "post") + 1
    # the head's matrix: the last layer's last 2-d weight (a bias may follow it)
    head = next((specs[w] for w in reversed(conv.layers[-1].weights) if len(specs[w].type.shape) == 2), None)
    rank = len(conv.output_shape)
    vocab_tp = head is not None and isinstance(head.tp, Shard) and head.type.shape[head.tp.dim] == vocab
    seq_dim = 1 if len(conv.input_shape) >= 2 and rank == 3 and not conv.packed else None
    model = assemble(
        name,
        {
            "family": "imported",
            "vocab": vocab,
            "transposed": tuple(p.name for p in conv.params.values() if p.transposed),
            # the module path of each layer call but the loss (pre, post, or the block's path):
            # where split points by module name fall
            "layer_paths": tuple(lay.key for lay in conv.layers),
            **dict(config or {}),
        },
        inputs,
        calls,
        seq_dim=seq_dim,
        ends=(pre, post),
        loss_input_tp=Shard(rank - 1) if vocab_tp else REPLICATE,
    )
    return replace(model, transmitted=conv.transmitted) if conv.transmitted else model


def weight_values(model: Model, module: object) -> dict[str, object]:
    """The values of ``model``'s weights taken from the torch ``module`` it was imported from
    (numpy arrays in the model's layout: ``nn.Linear`` weights transposed), by weight name."""
    import torch

    assert isinstance(module, torch.nn.Module)
    state = dict(module.named_parameters(remove_duplicate=False))
    transposed = set(model.config.get("transposed", ()))  # type: ignore[call-overload]
    out: dict[str, object] = {}
    for w in model.weights:
        t = state[w.name].detach().cpu()
        out[w.name] = (t.T if w.name in transposed else t).numpy().astype(w.type.dtype.to_numpy())
    return out
