"""Tensor-parallel placements of imported weights, by name pattern (Megatron-LM's layout).

distir stores a matrix as (in, out) (``MatMul(x, W)``; the importer stores ``nn.Linear``'s
(out, in) weight transposed), so a *column-parallel* projection (q/k/v, the MLP's up and gate:
each device computes some output features) is ``Shard(1)`` with its bias ``Shard(0)``, and a
*row-parallel* one (the attention output, the MLP's down projection: each device holds some
input features and the results are summed) ``Shard(0)`` with its bias replicated. Token
embeddings are sharded on the vocabulary (``Shard(0)``, Megatron-LM's vocabulary-parallel
embedding) and the output head is column-parallel, so the logits reach the loss sharded on the
vocabulary. Everything else (norms, position embeddings) is replicated.

``TP_PATTERNS`` is the default table, first match wins: a regular expression searched in the
weight's name, the placement of a 2-d weight and of a 1-d bias. Pass another table to
``import_module(..., tp_patterns=...)`` to override it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from distir.ir.dtensor import Placement, Replicate, Shard

R: Placement = Replicate()


class TPPattern(NamedTuple):
    pattern: str  # searched (re.search) in the weight's torch name
    matrix: Placement  # the placement of a 2-d weight (as distir stores it: (in, out))
    bias: Placement  # the placement of a 1-d weight (its bias)


COLUMN = (Shard(1), Shard(0))
ROW = (Shard(0), R)

TP_PATTERNS: tuple[TPPattern, ...] = (
    TPPattern(r"(^|\.)(q_proj|k_proj|v_proj|qkv_proj|c_attn|query|key|value|query_key_value)\.", *COLUMN),
    TPPattern(r"(^|\.)(gate_proj|up_proj|gate_up_proj|c_fc|fc1|fc_in|w1|w3|dense_h_to_4h)\.", *COLUMN),
    TPPattern(r"(^|\.)(o_proj|out_proj|down_proj|c_proj|fc2|fc_out|w2|dense_4h_to_h)\.", *ROW),
    TPPattern(r"(^|\.)(attention|self_attention)\.dense\.", *ROW),  # GPT-NeoX's, Falcon's, BLOOM's
    TPPattern(r"(^|\.)intermediate\.dense\.", *COLUMN),  # BERT's MLP
    TPPattern(r"(^|\.)output\.dense\.", *ROW),  # BERT's attention output and MLP
    TPPattern(r"(^|\.)(lm_head|embed_out|output|predictions\.decoder)\.(weight|bias)$", Shard(1), Shard(0)),
    TPPattern(r"(^|\.)(wte|embed_tokens|embed_in|word_embeddings|tok_embeddings)\.weight$", Shard(0), R),
)


def tp_placement(name: str, rank: int, patterns: Sequence[TPPattern] = TP_PATTERNS) -> Placement:
    """The placement of weight ``name`` of ``rank`` dims: the first matching pattern's (a
    2-d pattern for a 2-d weight, its bias placement for a 1-d one), else replicated."""
    for p in patterns:
        if re.search(p.pattern, name):
            return p.matrix if rank == 2 else p.bias if rank == 1 else R
    return R
