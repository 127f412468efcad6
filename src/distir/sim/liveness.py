"""Arrange the records of one interpreted body into a plan, with liveness-based memory.

``build_plan`` is the general path of ``PlanDomain.plan`` (``distir.sim.flatplan`` is the fast
path for bodies of primitive ops only). Memory semantics (``distir.sim.plan``): a storage *root*
— a parameter, a fresh op result, or a call's fresh buffer named ``(call index, buffer index)`` —
is live from its creation to its last use; views alias their inputs' roots; results stay live.

Every value has an entry in ``roots`` (its own root is itself), so a call site's arguments and
results are handled in bulk with C-level iteration (``map``, ``zip``, ``dict.update``) instead of
a Python loop per value: the entry of a 1024-device pipeline program has ~10k instructions but
~1M value edges (each chunk call passes ~300 arguments and returns ~150 results). Any change
here must keep the plan identical, including the order of frees (floats are summed in it).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from itertools import chain, compress, groupby, repeat
from typing import Any

from distir.interp.shapes import Mixed
from distir.ir.function import Function
from distir.ir.types import Type
from distir.ir.values import Value
from distir.sim.records import CallSummary, FnPlan, MemEvents, OpRecord, Root

_chain = chain.from_iterable


def build_plan(
    fn: Function,
    env: dict[Value, Mixed],
    records: list[OpRecord | CallSummary],
    out_types: tuple[Type, ...],
    dev_slot: dict[Any, int],
    slot_gpu: list[int],
    *,
    param_uses: bool = True,
) -> FnPlan:
    """Arrange the records of one interpreted body into a plan, with liveness-based memory.

    ``param_uses=False`` (the simulated entry, whose plan is never summarized) does not track
    the parameters' storage at all: the caller owns it, so it is never freed here, and what a
    summary needs of it (``param_last``, parameters among ``out_roots``) is left empty. That
    skips the largest share of a pipeline entry's value edges (the weights every chunk reads)."""
    body = fn.body
    n = len(body)
    assert len(records) == n
    # a value's storage roots: itself (a fresh result or a parameter), or the roots it views
    roots: dict[Value, tuple[Root, ...]] = {p: (p,) if param_uses else () for p in fn.params}
    roots_of = roots.__getitem__
    # owned roots in creation order, their bytes per GPU and the instruction creating them
    keys: list[Root] = []
    vals: list[Sequence[tuple[int, float]]] = []
    created: list[int] = []
    op_owned: dict[Value, Sequence[tuple[int, float]]] = {}  # the owned roots that are values
    # last uses of roots; a call's buffer is entered only when read (else: its call, ``r[0]``)
    last: dict[Root, int] = {}
    calls: list[int] = []
    # call index -> the roots of each argument it reads (in the order of ``read_pos``)
    call_reads: dict[int, list[tuple[Root, ...]]] = {}
    call_allocs: dict[int, Sequence[tuple[int, float]]] = {}
    call_first: dict[int, int] = {}  # call index -> position in ``keys`` of its first buffer
    for i, (instr, rec) in enumerate(zip(body, records, strict=True)):
        if type(rec) is tuple:  # a primitive op
            for v in instr.inputs:
                for r in roots[v]:
                    last[r] = i
            if rec[5]:  # a view
                shared = tuple(dict.fromkeys(_chain(map(roots_of, instr.inputs)))) or None
                for o in instr.outputs:
                    roots[o] = shared or (o,)
                continue
            for o, by_gpu in zip(instr.outputs, rec[6], strict=True):
                roots[o] = (o,)
                op_owned[o] = by_gpu
                keys.append(o)
                vals.append(by_gpu)
                created.append(i)
                last[o] = i
            continue
        assert isinstance(rec, CallSummary)
        calls.append(i)
        ins = instr.inputs
        rs_list = list(map(roots_of, rec.pick_read(ins)))
        call_reads[i] = rs_list
        last.update(zip(_chain(rs_list), repeat(i)))
        call_first[i] = len(keys)
        if rec.own_ks is not None:  # the common case: each result a parameter or a buffer of its own
            bufs = list(zip(repeat(i), rec.own_ks))  # a buffer is named by its call and index
            roots.update(zip(rec.pick_own(instr.outputs), zip(bufs), strict=True))
            for at, j in rec.aliases:  # a result that is parameter j: the argument's storage
                roots[instr.outputs[at]] = roots[ins[j]]
            keys.extend(bufs)
            vals.extend(rec.own_bytes)
            created.extend(repeat(i, len(bufs)))
            call_allocs[i] = rec.own_allocs
            continue
        mine: dict[int, Root] = {}  # fresh buffer k -> its root here
        allocs: list[tuple[int, float]] = []
        for o, out_refs in zip(instr.outputs, rec.out_roots, strict=True):
            uses_of: dict[Root, None] = {}
            for ref in out_refs:
                if ref >= 0:
                    uses_of.update(dict.fromkeys(roots[ins[ref]]))
                    continue
                k = -1 - ref
                b = mine.get(k)
                if b is None:  # one buffer, however many results use it
                    b = mine[k] = (i, k)
                    keys.append(b)
                    vals.append(rec.fresh[k][0])
                    created.append(i)
                    allocs.extend(rec.fresh[k][0])
                uses_of[b] = None
            roots[o] = tuple(uses_of) or (o,)
        call_allocs[i] = allocs
    devs: list[tuple[int, ...]] = []
    costs: list[float | CallSummary] = []
    comm: list[bool] = []
    names: list[str] = []
    flops: list[float] = []
    if not calls:
        if records:
            cols = list(zip(*records, strict=True))
            devs, costs, comm, names, flops = (list(c) for c in cols[:5])
    else:
        for rec in records:
            if isinstance(rec, CallSummary):
                devs.append(rec.slots)
                costs.append(rec)
                comm.append(False)
                names.append("@" + rec.name)
                flops.append(rec.flops)
            else:
                devs.append(rec[0])
                costs.append(rec[1])
                comm.append(rec[2])
                names.append(rec[3])
                flops.append(rec[4])
    out_root_list = list(_chain(map(roots_of, fn.outputs)))

    def owned(r: Root) -> Sequence[tuple[int, float]] | None:
        """The bytes per GPU of an owned root (a call's buffer, or a fresh op result), else None."""
        if type(r) is tuple:
            rec = records[r[0]]
            assert isinstance(rec, CallSummary)
            return rec.fresh[r[1]][0]
        return op_owned.get(r)  # type: ignore[arg-type]

    def last_of(r: Root, default: int = -1) -> int:
        return last.get(r, r[0] if type(r) is tuple else default)

    # last uses not counting the return, where a summary needs them (parameters, results)
    internal_last = {r: last_of(r) for r in (*fn.params, *out_root_list)}
    last.update(zip(out_root_list, repeat(n)))
    # frees: each owned root at its last use, in creation order within one instruction (a
    # stable sort by last use keeps it); and which roots (positions in ``keys``) die where
    frees: dict[int, list[tuple[int, float]]] = {}
    dying_at: dict[int, list[int]] = {}
    ends = list(map(last.get, keys, created))
    for end, grp in groupby(sorted(range(len(keys)), key=ends.__getitem__), ends.__getitem__):
        if end >= n:
            continue
        members = list(grp)
        frees[end] = list(_chain(map(vals.__getitem__, members)))
        if calls:
            dying_at[end] = members
    mem: list[MemEvents | None] = [None] * n
    for i, rec in enumerate(records):
        freed = frees.get(i)
        if type(rec) is tuple and (rec[7] or freed):
            bump = rec[8]
            if rec[9] is not None:  # a bump that depends on whether the first input dies here
                rs = roots[body[i].inputs[0]]
                if len(rs) == 1 and owned(rs[0]) is not None and last_of(rs[0]) == i:
                    bump = rec[9]
            mem[i] = (bump, rec[7], tuple(freed) if freed else ())
    # a call's peak bumps given the roots dying at it, memoized per call site pattern (the
    # microbatches repeat one): the bytes objects are alive here, so their ids identify them
    peak_memo: dict[tuple[Any, ...], tuple[tuple[int, float], ...]] = {}
    for i in calls:
        c = costs[i]
        assert isinstance(c, CallSummary)
        dies = dying_at.get(i)
        if not dies:
            pk = tuple(c.peak_extra.items())
        else:
            # roots older than the call that die here were read by it (so are in ``lu``): they
            # count until their last use inside; this call's buffers dying here are results
            # nobody uses: gone after their last use inside
            split = bisect_left(dies, call_first[i])
            older = list(map(keys.__getitem__, dies[:split]))
            mine_k = tuple(b[1] for b in map(keys.__getitem__, dies[split:]))  # type: ignore[index]
            uses = tuple(map(_last_uses(call_reads[i], c).__getitem__, older)) if older else ()
            key = (id(c), uses, tuple(map(id, map(vals.__getitem__, dies[:split]))), mine_k)
            hit = peak_memo.get(key)
            if hit is None:
                dying = [(u, g, b) for u, j in zip(uses, dies[:split], strict=True) for g, b in vals[j]]
                dead = [(c.fresh[k][1], g, b) for k in mine_k for g, b in c.fresh[k][0]]
                hit = peak_memo[key] = c.extra_with_dying(dying, dead)
            pk = hit
        al = tuple(call_allocs[i])
        fr = tuple(frees.get(i, ()))
        mem[i] = (pk, al, fr) if (pk or al or fr) else None
    param_index = {p: j for j, p in enumerate(fn.params)}
    fresh_index: dict[Root, int] = {}
    fresh: list[tuple[tuple[tuple[int, float], ...], int]] = []
    out_roots: list[tuple[int, ...]] = []
    for v in fn.outputs:
        refs_of: list[int] = []
        for r in roots[v]:
            if r in param_index:
                refs_of.append(param_index[r])
            elif (mine_bytes := owned(r)) is not None:
                if r not in fresh_index:
                    fresh_index[r] = len(fresh)
                    fresh.append((tuple(mine_bytes), internal_last.get(r, -1)))
                refs_of.append(-1 - fresh_index[r])
        out_roots.append(tuple(dict.fromkeys(refs_of)))
    slots = tuple(sorted({s for ds in devs for s in ds}))
    param_last = tuple(internal_last.get(p, -1) for p in fn.params)
    return FnPlan(
        fn, devs, costs, comm, names, flops, mem, slots, tuple(out_roots), tuple(fresh), out_types, param_last
    )


def _last_uses(rs_list: list[tuple[Root, ...]], c: CallSummary) -> dict[Root, int]:
    """The last use inside ``c``'s body of each root a call site reads (``rs_list``: the roots of
    its arguments at ``c.read_pos``); built only for call sites where a root dies."""
    # each root of each argument, paired with that argument's last use (the last pair of a root
    # wins, as in a loop over the arguments; they come in ascending last use)
    flat = list(_chain(rs_list))
    counts = list(map(len, rs_list))
    # the common case: each argument its own storage (or a view of one), or untracked (no roots)
    if counts.count(0) + counts.count(1) == len(counts):
        return dict(zip(flat, compress(c.read_last, counts), strict=True))
    return dict(zip(flat, _chain(map(repeat, c.read_last, counts)), strict=True))
