"""Tensor-parallel placements of an export's weights, named by the module that uses them.

An export's initializer names are not always the module's: ``torch.onnx.export(..., dynamo=True)``
folds a linear layer's weight transpose into a new initializer (``val_133``). Its node metadata
still says which module ran each node (``assemble.scopes_of``: ``m.model.layers.0.self_attn.q_proj``),
so a weight is named by its use — the innermost module of the node reading it, with ``.weight``
for the matrix of a MatMul or Gemm or the table of a Gather, ``.bias`` for the vector added to
such a product in the same module — and placed by the torch importer's table
(``torch_import.placements``: Megatron-LM's column- and row-parallel projections, the
vocabulary-parallel embedding and head). The table's placements are for distir's (in, out)
layout; a matrix the graph reads transposed (``Gemm(transB=1)``, or through a ``Transpose``)
takes the other dim. A weight used in ways that disagree, or named by no pattern, is replicated.
"""

from __future__ import annotations

from collections.abc import Sequence

from distir.frontends.onnx_import.values import Program
from distir.frontends.torch_import.placements import tp_placement
from distir.ir.dtensor import Placement, Replicate, Shard
from distir.ir.ops import Op
from distir.ir.values import Value

_SWAP = {0: 1, 1: 0}


def weight_placements(program: Program, scopes: Sequence[tuple[str, ...]]) -> dict[str, Placement]:
    """Each weight's tensor-parallel placement by name (module docstring); weights of no
    pattern are absent (replicated)."""
    weights = {v: p.name for v, p in program.params if p.value is not None}
    made = {v: op for op in program.ops for v in op.outputs}
    seen: dict[str, set[Placement]] = {}

    def place(w: Value, suffix: str, op_index: int, swapped: bool = False) -> None:
        k = program.origin[op_index]
        scope = scopes[k][-1] if 0 <= k < len(scopes) and scopes[k] else ""
        if not scope:
            return
        p = tp_placement(f"{scope}.{suffix}", program.type(w).rank)
        if swapped and isinstance(p, Shard):
            p = Shard(_SWAP[p.dim])
        seen.setdefault(weights[w], set()).add(p)

    products: dict[Value, int] = {}  # a product's result -> its op (for the bias after it)
    for i, op in enumerate(program.ops):
        if op.name in ("MatMul", "Gemm") and len(op.inputs) >= 2:
            b, swapped = _matrix(op, made, weights)
            if b is not None:
                place(b, "weight", i, swapped)
                products[op.outputs[0]] = i
            if op.name == "Gemm" and len(op.inputs) == 3 and op.inputs[2] in weights:
                place(op.inputs[2], "bias", i)
        elif op.name == "Gather" and op.inputs[0] in weights and op.attrs.get("axis", 0) == 0:
            place(op.inputs[0], "weight", i)
        elif op.name == "Add" and len(op.inputs) == 2:
            x, bias = op.inputs if op.inputs[1] in weights else op.inputs[::-1]
            if bias in weights and x in products and _same_scope(scopes, program, products[x], i):
                place(bias, "bias", i)
    return {name: next(iter(ps)) for name, ps in seen.items() if len(ps) == 1 and ps != {Replicate()}}


def _matrix(op: Op, made: dict[Value, Op], weights: dict[Value, str]) -> tuple[Value | None, bool]:
    """The weight a product reads as its second operand, and whether it reads it transposed."""
    b = op.inputs[1]
    swapped = bool(op.attrs.get("transB"))
    t = made.get(b)
    transposed = t is not None and t.name == "Transpose" and t.attrs.get("perm") in ((1, 0), [1, 0])
    if b not in weights and t is not None and transposed:
        b, swapped = t.inputs[0], not swapped
    if op.attrs.get("transA") or b not in weights:
        return None, False
    return b, swapped


def _same_scope(scopes: Sequence[tuple[str, ...]], program: Program, i: int, j: int) -> bool:
    a, b = program.origin[i], program.origin[j]
    return 0 <= a < len(scopes) and 0 <= b < len(scopes) and scopes[a][-1:] == scopes[b][-1:]
