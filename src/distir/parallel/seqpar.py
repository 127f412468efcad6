"""Sequence parallelism (Megatron-LM; Korthikanti et al., "Reducing Activation Recomputation in
Large Transformer Models", 2022) as boundary placements of the sharding layer.

With tensor parallelism alone, the activations passed between layers are ``(S(0), R)``: split
over ``dp`` by batch, whole on every ``tp`` rank, so the ops outside the tensor-parallel regions
(norms, residual adds, dropout) run t times over and keep t copies. With ``Strategy.sp`` those
activations (and their gradients) are ``(S(0), S(seq))`` instead, ``seq`` being the model's
declared sequence dim (``Model.seq_dim``). Nothing else changes: propagation runs the norms and
adds on sequence shards; where a column-parallel MatMul needs its input whole, legalization
inserts an AllGather on the sequence dim, and the pending sum of a row-parallel MatMul, added to
a sequence-sharded residual, becomes a ReduceScatter instead of an AllReduce (same bytes as the
AllReduce it replaces: AllGather + ReduceScatter = 2(t−1)/t·M).

Which boundaries: every activation between two layers except the first input (a model input,
laid out by the entry) and the loss layer's input (the loss reduces over all positions, so its
input stays whole on ``tp``: the last layer before it gathers what it needs — or, when the model
declares it (``Model.loss_input_tp``, with or without ``sp``), sharded as declared: the logits
sharded on the vocabulary for a vocabulary-parallel cross entropy). Uneven sequence
shards (seq not divisible by t) are allowed: the sharding layer lays out uneven shards without
padding (AllGather / ReduceScatter of unequal pieces); a sequence shorter than t is refused,
as it would leave ranks without work.

Weights never move: a weight's declared tensor-parallel placement is where it is used (that is
what tensor parallelism means), so ``distribute`` pins weights in propagation (``pinned``) —
otherwise, for a microbatch of fewer tokens than the hidden size, gathering the weight of a
column-parallel MatMul moves fewer bytes than gathering its sequence-sharded input, and the
greedy choice would turn the layer into a weight-gathering (FSDP-like) one.
"""

from __future__ import annotations

from collections.abc import Sequence

from distir.frontends.zoo.model import Model
from distir.ir.dtensor import Replicate, Shard, format_placements
from distir.ir.types import TensorType, Type
from distir.parallel.strategy import Strategy, StrategyError

ACT = "S(0), R"


def activation_placements(model: Model, s: Strategy, layer_types: Sequence[Sequence[Type]]) -> list[str]:
    """The placements of the activation entering each layer (``layer_types[i][0]``, global types
    at the microbatch size), and last of the result of the last layer: ``(S(0), R)`` everywhere
    without ``s.sp``; with it, ``(S(0), S(seq_dim))`` between layers (module docstring)."""
    n = len(layer_types)
    out = [ACT] * (n + 1)
    loss = len(model.layers) - 1
    if s.t > 1 and not isinstance(model.loss_input_tp, Replicate) and loss < n:
        out[loss] = format_placements((Shard(0), model.loss_input_tp))
    if not s.sp:
        return out
    if model.seq_dim is None:
        raise StrategyError(
            f"{s}: sequence parallelism needs the model's sequence dim, and {model.name} declares none "
            "(Model.seq_dim)"
        )
    for i in range(1, min(n, loss)):
        t = layer_types[i][0]
        if not isinstance(t, TensorType) or len(t.shape) <= model.seq_dim:
            raise StrategyError(
                f"{s}: the activation entering layer {i} (@{model.layers[i].callee}) has type {t}, "
                f"without the declared sequence dim {model.seq_dim}"
            )
        if t.shape[model.seq_dim] < s.t:
            raise StrategyError(
                f"{s}: the sequence ({t.shape[model.seq_dim]} positions) is shorter than the t={s.t} "
                "ranks it would be split over"
            )
        out[i] = format_placements((Shard(0), Shard(model.seq_dim)))
    return out


__all__ = ["ACT", "activation_placements"]
