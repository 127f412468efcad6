"""Fused elementwise chains: which ops of a body run inside the kernel of the op before them.

Trainers do not launch one kernel per elementwise op: cuBLASLt runs a bias and an activation as
the GEMM's epilogue, Megatron-LM fuses bias+GeLU, bias+dropout+residual add and
scale+mask+softmax into single kernels, LayerNorm/RMSNorm and softmax are one kernel each, and
``torch.compile`` fuses pointwise chains generally. The registry says how each op fuses
(``OpDef.fusion``, ``distir.ops.registry.Fusion``); this module finds the chains of a body.

Rule: an op joins the kernel of the op producing one of its inputs when it is POINTWISE or
ROWWISE, the producer is a GEMM op with a single result or a POINTWISE op (Dropout's two
results: the joined op reads Y from registers, the mask is still written), and the op is that
result's first consumer in program order. A chain is a run of such links (a ROWWISE op ends it:
nothing joins after it; a GEMM takes only pointwise epilogues, so a ROWWISE op does not join a
chain a GEMM heads: it is a kernel of its own reading the chain's result, as Megatron-LM's fused
scale-mask-softmax reads the attention scores its ``baddbmm`` wrote). The rule reads the program's
structure only — no devices — so a program and its materialized per-device form (where the
devices' ops interleave) fuse alike. Chains do not cross calls: a callee's parameters are
produced outside its body (inlining a call can therefore fuse more). A chain may pass through
one TRANSPARENT op (a Redistribute) between the producer and the consumer: the link then names
it (``FusedInput.via``) and the planner keeps the link only when that op moved nothing (its
record is a view), so a layer on a 1×1 mesh fuses as the unsharded layer does. A ROWWISE op whose
chain reaches a GEMM only through such ops is dropped only if they all moved nothing: where one
moved data, the chain after it starts at a pointwise op, which the ROWWISE op may join
(``FusedInput.unless``), as in the materialized program, where that op is a collective.

Where the trainer's products take no epilogue (``epilogues=False``) a GEMM heads no chain: the
chains start at the first pointwise op after it, which reads the product from memory. This is
``torch.compile`` as torchtitan runs it (``torch.compile(block, fullgraph=True)``, default mode):
Inductor lowers ``aten.mm`` to an extern cuBLAS call and considers its Triton GEMM templates, the
only products it fuses epilogues into, under max-autotune only (``torch/_inductor/kernel/mm.py``
``tuned_mm``; ``torch/_inductor/utils.py`` ``use_max_autotune``, ``_use_template_for_cuda``).
Its pointwise and reduction chains fuse as above (a residual add and the RMSNorm after it are
one kernel).

What joining means is the cost model's business (``RooflineCostModel.fused_time``): the joined
op launches no kernel and does not read the linked input from memory; when that input has no
other use (``FusedInput.sole``) the producer never writes it either. The program, its values
and its memory accounting are unchanged: this is a cost annotation, not a rewrite.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain
from operator import attrgetter
from typing import NamedTuple

import numpy as np

from distir.ir.function import Function
from distir.ir.ops import Call, Instr, Op
from distir.ops.registry import REGISTRY, Fusion, UnknownOpError


class FusedInput(NamedTuple):
    """How an op joins the kernel of the op producing one of its inputs: ``arg`` is that input
    (read from registers, not memory); ``sole``: the result has no other use (so it is never
    written to memory); ``via``: the position of the TRANSPARENT op the chain passes through, or
    -1. The cost model sees links with ``via == -1`` only (``FusedInput.plain``)."""

    arg: int
    sole: bool
    via: int = -1
    # the positions of the TRANSPARENT ops between this op's chain and a GEMM heading it: the
    # link holds only if one of them moved data (else the op would join a GEMM's chain)
    unless: tuple[int, ...] = ()

    def plain(self) -> FusedInput:
        """The link without ``via`` (a shared instance: memo keys stay small)."""
        return _LINKS.get((self.arg, self.sole)) or FusedInput(self.arg, self.sole)

    def resolved(self, is_view: Callable[[int], bool]) -> FusedInput | None:
        """The link the cost model sees, ``is_view(i)`` telling whether the op at position ``i``
        of the body moved nothing: through ``via``, only if it did not; with ``unless``, only if
        one of them moved data; else the link itself."""
        if self.via >= 0:
            return self.plain() if is_view(self.via) else None
        if self.unless:
            return None if all(map(is_view, self.unless)) else self.plain()
        return self


_LINKS = {(i, s): FusedInput(i, s) for i in range(8) for s in (False, True)}  # shared instances
_TABLE = (None, *(_LINKS[(i, s)] for i in range(8) for s in (False, True)))  # by 1 + 2·index + sole
_NONE, _HEAD, _JOIN, _BOTH, _THROUGH = 0, 1, 2, 3, 4  # per op: may start, may join a chain
_CODE = {
    Fusion.NONE: _NONE,
    Fusion.GEMM: _HEAD,
    Fusion.ROWWISE: _JOIN,
    Fusion.POINTWISE: _BOTH,
    Fusion.TRANSPARENT: _THROUGH,
}
_KIND: dict[str, int] = {}


def _code(name: str) -> int:
    got = _KIND.get(name)
    if got is None:
        try:
            got = _CODE[REGISTRY[name].fusion]
        except UnknownOpError:  # the planner reports the unknown op
            got = _NONE
        _KIND[name] = got
    return got


def _rowwise_after_gemm_dropped(
    ops: np.ndarray,
    hits: np.ndarray,
    producer: np.ndarray,
    codes: np.ndarray,
    start: np.ndarray,
    ok_t: np.ndarray,
    via: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, dict[int, tuple[int, ...]]]:
    """The links (consumer ``ops``, input occurrence ``hits``) without those of a ROWWISE op to a
    chain a GEMM heads: a GEMM's epilogue is pointwise (cuBLASLt's bias/GeLU epilogues; a row
    reduction needs whole rows, which a GEMM's output tile does not hold), so a softmax or a norm
    after a product and its pointwise epilogue is a kernel of its own that reads the chain's
    result from memory, as Megatron-LM's fused scale-mask-softmax reads the scores ``baddbmm``
    wrote (``megatron/model/fused_softmax.py``). The chain's head is found by pointer jumping
    over the links (a passing TRANSPARENT op links to its input's producer). A link whose path
    to the GEMM passes TRANSPARENT ops before its own input is kept, conditional on them (the
    third result: consumer -> their positions, ``FusedInput.unless``); one through such an op
    itself (``via``) holds only where that op moved nothing, and there it joins the GEMM's chain:
    dropped."""
    rowwise = codes[ops] == _JOIN
    if not rowwise.any():
        return ops, hits, {}
    parent = np.arange(len(codes))
    parent[ops] = producer[hits]
    tt = np.flatnonzero(ok_t)
    parent[tt] = producer[start[tt]]
    step = parent.copy()  # one link up
    while True:
        up = parent[parent]
        if np.array_equal(up, parent):
            break
        parent = up
    drop = rowwise & (codes[parent[producer[hits]]] == _HEAD)
    unless: dict[int, tuple[int, ...]] = {}
    for k in np.flatnonzero(drop & (via[hits] < 0)).tolist():
        path, x = [], int(producer[hits[k]])
        while step[x] != x:
            if ok_t[x]:
                path.append(x)
            x = int(step[x])
        if path:
            unless[int(ops[k])] = tuple(path)
            drop[k] = False
    return ops[~drop], hits[~drop], unless


def fused_inputs(fn: Function, epilogues: bool = True, screen: bool = True) -> list[FusedInput | None]:
    """Per instruction of ``fn``'s body, how it joins the kernel of the op producing one of its
    inputs (None: it does not); ``epilogues``: whether a GEMM heads a chain (module doc). Calls
    never fuse. In bulk (numpy over the values' identities,
    which stay valid while ``fn`` lives): the planner asks once per body, and a flat program has
    a million ops. ``screen``: first rule out, in one pass over the ops, a body where no op may
    join (``_may_link``: a pipeline's entry and chunk functions, whose calls pass hundreds of
    values the bulk pass would index); False: the bulk pass only, the reference the tests
    compare with."""
    body = fn.body
    n = len(body)
    codes = np.array(_codes(body, epilogues), np.int64)
    if not n or not (codes & _JOIN).any() or not (codes & _HEAD).any():
        return [None] * n
    if screen and not _may_link(body, codes.tolist()):
        return [None] * n
    outputs = list(map(attrgetter("outputs"), body))
    inputs = list(map(attrgetter("inputs"), body))
    n_out = np.fromiter(map(len, outputs), np.int64, n)
    n_in = np.fromiter(map(len, inputs), np.int64, n)
    made = np.fromiter(map(id, chain.from_iterable(outputs)), np.int64, int(n_out.sum()))
    read = np.fromiter(map(id, chain.from_iterable(inputs)), np.int64, int(n_in.sum()))
    op_of = np.repeat(np.arange(n), n_in)  # the consumer of each input occurrence
    start = np.zeros(n, np.int64)
    np.cumsum(n_in[:-1], out=start[1:])
    # per occurrence: the op producing the value read (-1: a parameter)
    order = np.argsort(made, kind="stable")
    at = np.minimum(np.searchsorted(made[order], read), max(len(made) - 1, 0))
    found = made[order][at] == read if len(made) else np.zeros(len(read), bool)
    producer = np.where(found, np.repeat(np.arange(n), n_out)[order][at] if len(made) else -1, -1)
    # per occurrence: the value's first consumer and its number of uses (returning it is one)
    _, first_at, inverse, counts = np.unique(read, return_index=True, return_inverse=True, return_counts=True)
    first = op_of[first_at][inverse]
    uses = counts[inverse]
    ret = np.array(list(map(id, fn.outputs)), np.int64)
    if len(ret):
        r_ids, r_counts = np.unique(ret, return_counts=True)
        pos = np.minimum(np.searchsorted(r_ids, read), len(r_ids) - 1)
        uses = uses + np.where(r_ids[pos] == read, r_counts[pos], 0)
    prod = np.maximum(producer, 0)
    from_head = (producer >= 0) & ((n_out[prod] == 1) | (codes[prod] == _BOTH)) & ((codes[prod] & _HEAD) > 0)
    # through a transparent op (one input, one result) that is its input's first consumer
    via = np.full(len(read), -1)
    through = (codes == _THROUGH) & (n_in == 1) & (n_out == 1)
    ok_t = np.zeros(n, bool)
    if through.any():
        t_occ = start[through]  # each transparent op's input occurrence
        ok_t[np.flatnonzero(through)] = from_head[t_occ] & (first[t_occ] == op_of[t_occ])
        src_uses = np.zeros(n, np.int64)
        src_uses[np.flatnonzero(through)] = uses[t_occ]
        passing = (producer >= 0) & ok_t[prod]
        from_head |= passing
        via = np.where(passing, producer, -1)
        uses = np.where(passing, np.maximum(uses, src_uses[prod]), uses)  # sole only if both are
    # an occurrence links when its consumer joins and is the value's first consumer; per consumer
    # the first such input counts
    link = from_head & ((codes[op_of] & _JOIN) > 0) & (first == op_of)
    hits = np.flatnonzero(link)
    if not len(hits):
        return [None] * n
    ops, keep = np.unique(op_of[hits], return_index=True)
    hits = hits[keep]
    ops, hits, unless = _rowwise_after_gemm_dropped(ops, hits, producer, codes, start, ok_t, via)
    if not len(hits):
        return [None] * n
    j = hits - start[ops]
    sole = uses[hits] == 1
    vias = via[hits]
    # the common links (no via, input < 8, unconditional) from a table in one C-level pass, the
    # rest one by one
    common = (vias < 0) & (j < 8)
    if unless:
        common &= ~np.isin(ops, np.fromiter(unless, np.int64, len(unless)))
    code = np.zeros(n, np.int64)
    code[ops[common]] = 1 + 2 * j[common] + sole[common]
    out: list[FusedInput | None] = list(map(_TABLE.__getitem__, code.tolist()))
    rest = ~common
    for i, jj, ss, vv in zip(
        ops[rest].tolist(), j[rest].tolist(), sole[rest].tolist(), vias[rest].tolist(), strict=True
    ):
        out[i] = FusedInput(jj, ss, vv, unless.get(i, ()))
    return out


def _codes(body: tuple[Instr, ...], epilogues: bool) -> list[int]:
    """Per instruction, how it fuses (``_KIND``; a call: not at all; without ``epilogues`` a
    GEMM heads nothing)."""
    names = (
        [x.name if type(x) is Op else "" for x in body]
        if Call in set(map(type, body))
        else list(map(attrgetter("name"), body))
    )
    for name in set(names):
        _code(name)
    codes = list(map(_KIND.__getitem__, names))
    if not epilogues:  # a product is an extern kernel of its own: nothing joins it
        codes = [_NONE if c == _HEAD else c for c in codes]
    return codes


def _may_link(body: tuple[Instr, ...], codes: list[int]) -> bool:
    """Whether some op of ``body`` (its ops' ``codes``) may join the kernel of the op producing
    one of its inputs; False proves ``fused_inputs`` finds no link. A link (``fused_inputs``'
    ``link``) is an occurrence read by an op that may join (ROWWISE, POINTWISE) whose value some
    op that may head a chain made (a GEMM of one result, or a POINTWISE op: ``from_head``) or
    a TRANSPARENT op (one input, one result) reading such a value (``passing``); every other
    condition there only drops links. Values by identity, as there; a value made twice counts
    as a head's if any maker may head one."""
    heads: set[int] = set()
    through: list[Instr] = []
    for x, c in zip(body, codes, strict=True):
        if c & _HEAD and (c == _BOTH or len(x.outputs) == 1):
            heads.update(map(id, x.outputs))
        elif c == _THROUGH and len(x.inputs) == 1 and len(x.outputs) == 1:
            through.append(x)
    if not heads:
        return False
    heads.update([id(x.outputs[0]) for x in through if id(x.inputs[0]) in heads])
    return any(
        c & _JOIN and not heads.isdisjoint(map(id, x.inputs)) for x, c in zip(body, codes, strict=True)
    )


# ``fused_links``' memo: (a body's structure, epilogues) -> its links (bounded: cleared when full)
_BY_STRUCTURE: dict[tuple[object, bool], list[FusedInput | None]] = {}
_STRUCTURES_KEPT = 1024
# the same by the identity of the function (kept alive, so its id stays its own): each planning
# domain of the search's probes asks again for the layer functions it plans (bounded likewise)
_BY_ID: dict[tuple[int, bool], tuple[Function, list[FusedInput | None]]] = {}
# bodies up to this many instructions are looked up by structure; a longer one (a flat program's
# entry, met once) is worked out directly, where numpy's bulk pass is what pays
SMALL_BODY = 512


def fused_links(fn: Function, epilogues: bool = True, screen: bool = True) -> list[FusedInput | None]:
    """``fused_inputs(fn, epilogues)``, looked up by the body's structure (``body_structure``) for a body of
    up to ``SMALL_BODY`` instructions: the search's probes plan the same layer at every
    microbatch size and tensor-parallel degree, bodies alike but for their types, and numpy's
    fixed cost per call dominates such small bodies. ``screen``: a body ``fused_inputs``' screen
    rules out (``_may_link``: no op may join) has no link, its structure unread (a pipeline's
    chunk functions); False: every body by its structure. The result is shared: callers never
    modify it."""
    if len(fn.body) > SMALL_BODY:
        return fused_inputs(fn, epilogues, screen)
    seen = _BY_ID.get((id(fn), epilogues))
    if seen is not None and seen[0] is fn:  # this very body: no structure to work out again
        return seen[1]
    if screen and not _may_link(fn.body, _codes(fn.body, epilogues)):
        got: list[FusedInput | None] = [None] * len(fn.body)
    else:
        structure = body_structure(fn)
        if structure is None:
            return fused_inputs(fn, epilogues, screen)
        key = (structure, epilogues)
        cached = _BY_STRUCTURE.get(key)
        if cached is None:
            if len(_BY_STRUCTURE) >= _STRUCTURES_KEPT:
                _BY_STRUCTURE.clear()
            cached = _BY_STRUCTURE[key] = fused_inputs(fn, epilogues, screen)
        got = cached
    if len(_BY_ID) >= _STRUCTURES_KEPT:
        _BY_ID.clear()
    _BY_ID[(id(fn), epilogues)] = (fn, got)
    return got


def body_structure(fn: Function) -> tuple[object, ...] | None:
    """All ``fused_inputs`` reads of ``fn``: per instruction its op name ("" for a call), the
    values it reads and its result count, and the values returned — each value numbered by its
    first appearance (parameters first), so two bodies alike but for their values' names and
    types have one structure. None for a body defining a value twice (worked out directly)."""
    num: dict[object, int] = {p: i for i, p in enumerate(fn.params)}
    parts: list[tuple[object, ...]] = []
    for x in fn.body:
        ins = tuple([num.setdefault(v, len(num)) for v in x.inputs])
        for v in x.outputs:
            if v in num:
                return None
            num[v] = len(num)
        parts.append((x.name if type(x) is Op else "", ins, len(x.outputs)))
    return (tuple(parts), tuple([num.setdefault(v, len(num)) for v in fn.outputs]))
