"""Fused elementwise chains: which ops of a body run inside the kernel of the op before them.

Trainers do not launch one kernel per elementwise op: cuBLASLt runs a bias and an activation as
the GEMM's epilogue, Megatron-LM fuses bias+GeLU, bias+dropout+residual add and
scale+mask+softmax into single kernels, LayerNorm/RMSNorm and softmax are one kernel each, and
``torch.compile`` fuses pointwise chains generally. The registry says how each op fuses
(``OpDef.fusion``, ``distir.ops.registry.Fusion``); this module finds the chains of a body.

Rule: an op joins the kernel of the op producing one of its inputs when it is POINTWISE or
ROWWISE, the producer is a GEMM or POINTWISE op with a single result, and the op is that
result's first consumer in program order. A chain is a run of such links (a ROWWISE op ends it:
nothing joins after it; a GEMM takes only pointwise epilogues). The rule reads the program's
structure only — no devices — so a program and its materialized per-device form (where the
devices' ops interleave) fuse alike. Chains do not cross calls: a callee's parameters are
produced outside its body (inlining a call can therefore fuse more). A chain may pass through
one TRANSPARENT op (a Redistribute) between the producer and the consumer: the link then names
it (``FusedInput.via``) and the planner keeps the link only when that op moved nothing (its
record is a view), so a layer on a 1×1 mesh fuses as the unsharded layer does.

What joining means is the cost model's business (``RooflineCostModel.fused_time``): the joined
op launches no kernel and does not read the linked input from memory; when that input has no
other use (``FusedInput.sole``) the producer never writes it either. The program, its values
and its memory accounting are unchanged: this is a cost annotation, not a rewrite.
"""

from __future__ import annotations

from collections import Counter
from itertools import chain, repeat
from operator import attrgetter
from typing import NamedTuple

from distir.ir.function import Function
from distir.ir.ops import Op
from distir.ops.registry import REGISTRY, Fusion, UnknownOpError


class FusedInput(NamedTuple):
    """How an op joins the kernel of the op producing one of its inputs: ``index`` is that input
    (read from registers, not memory); ``sole``: the result has no other use (so it is never
    written to memory); ``via``: the position of the TRANSPARENT op the chain passes through, or
    -1. The cost model sees links with ``via == -1`` only (``FusedInput.plain``)."""

    index: int
    sole: bool
    via: int = -1

    def plain(self) -> FusedInput:
        """The link without ``via`` (a shared instance: memo keys stay small)."""
        return _LINKS.get((self.index, self.sole)) or FusedInput(self.index, self.sole)


_LINKS = {(i, s): FusedInput(i, s) for i in range(8) for s in (False, True)}  # shared instances
_HEADS = frozenset((Fusion.GEMM, Fusion.POINTWISE))
_JOINS = frozenset((Fusion.POINTWISE, Fusion.ROWWISE))
_KIND: dict[str, Fusion] = {}


def _kind(name: str) -> Fusion:
    got = _KIND.get(name)
    if got is None:
        try:
            got = REGISTRY[name].fusion
        except UnknownOpError:  # the planner reports the unknown op
            got = Fusion.NONE
        _KIND[name] = got
    return got


def fused_inputs(fn: Function) -> list[FusedInput | None]:
    """Per instruction of ``fn``'s body, how it joins the kernel of the op producing one of its
    inputs (None: it does not). Calls never fuse."""
    body = fn.body
    kinds = [_kind(x.name) if type(x) is Op else Fusion.NONE for x in body]
    out: list[FusedInput | None] = [None] * len(body)
    joins = [i for i, k in enumerate(kinds) if k in _JOINS]
    if not joins:
        return out
    # the values a chain can continue from: a head's one result (GEMM or pointwise), and the one
    # result of a transparent op that is the first consumer of such a value (through it)
    heads = [x.outputs[0] for x, k in zip(body, kinds, strict=True) if k in _HEADS and len(x.outputs) == 1]
    if not heads:
        return out
    made = dict.fromkeys(heads, -1)
    inputs = list(map(attrgetter("inputs"), body))
    flat = list(chain.from_iterable(inputs))
    # each value's first consumer: later assignments win, so assign in reverse program order
    at = chain.from_iterable(map(repeat, range(len(body) - 1, -1, -1), map(len, reversed(inputs))))
    first = dict(zip(reversed(flat), at, strict=True))
    uses = Counter(flat)
    uses.update(fn.outputs)
    source: dict[object, object] = {}  # a transparent op's result -> the head's value it passes on
    for t, k in enumerate(kinds):
        if k is Fusion.TRANSPARENT and len(inputs[t]) == 1 and len(body[t].outputs) == 1:
            v = inputs[t][0]
            if made.get(v) == -1 and first[v] == t:
                made[body[t].outputs[0]] = t
                source[body[t].outputs[0]] = v
    for i in joins:
        for j, x in enumerate(inputs[i]):
            via = made.get(x)
            if via is not None and first[x] == i:
                sole = uses[x] == 1 and (via < 0 or uses[source[x]] == 1)
                out[i] = (_LINKS.get((j, sole)) or FusedInput(j, sole)) if via < 0 else FusedInput(j, sole, via)
                break
    return out
