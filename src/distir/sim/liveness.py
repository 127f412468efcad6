"""Arrange the records of one interpreted body into a plan, with liveness-based memory.

``build_plan`` is the general path of ``PlanDomain.plan`` (``distir.sim.flatplan`` is the fast
path for bodies of primitive ops only). Memory semantics (``distir.sim.plan``): a storage *root*
— a parameter, a fresh op result, or a call's fresh buffer — is live from its creation to its last
use; views alias their inputs' roots; results stay live.

The entry of a 1024-device pipeline program has ~10k instructions but ~1M value edges (each chunk
call passes ~300 arguments and returns ~150 results), so nothing here loops in Python per value:

- a value is its own root unless an ``alias`` entry says otherwise (views, results passing an
  argument through, results sharing a buffer); in particular a call's own fresh buffer is the
  result value itself, so a call's results need no bookkeeping beyond list extends;
- last uses are one dictionary of the values read (filled per instruction at C speed), with
  aliased reads folded into their roots afterwards;
- roots are kept in creation order (``keys``) with their bytes (``vals``, and all pairs
  concatenated in ``flat``); roots dying together form runs of consecutive keys, so the frees of
  an instruction are a few slices.

Any change here must keep the plan identical, including the order of frees (floats are summed in
it): ``tests/sim/test_liveness.py`` and the simulator tests pin it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import accumulate, chain, compress, groupby, repeat
from operator import ne
from typing import Any

from distir.interp.shapes import Mixed
from distir.ir.function import Function
from distir.ir.types import Type
from distir.ir.values import Value
from distir.sim.interference import stall_column
from distir.sim.records import CallSummary, FnPlan, Gift, MemEvents, OpRecord, Root, waits_column

_chain = chain.from_iterable
Pairs = tuple[tuple[int, float], ...]  # (gpu, bytes)
Profile = dict[int, list[tuple[int, float]]]  # gpu -> (position, bytes) per op
WHOLE_CALL = 1 << 62  # the "last use inside a call" of a root it never reads


class _Walk:
    """The roots of one body, found by ``_walk_roots``: owned roots in creation order with their
    bytes per GPU (``vals``; ``flat``: their pairs concatenated) and creating instruction, their
    positions (op results and shared call buffers), the last read of each value, and per call
    site its reads, allocations and the position of its first buffer."""

    __slots__ = (
        "alias",
        "call_allocs",
        "call_first",
        "call_reads",
        "calls",
        "created",
        "flat",
        "keys",
        "last",
        "pos",
        "untracked",
        "vals",
    )

    def __init__(self, untracked: frozenset[Value]) -> None:
        # Roots: a value is its own one root unless ``alias`` says otherwise (a view: its inputs'
        # roots; a call result passing parameter j through: the argument's; a result of a call
        # whose results share buffers: those buffers, named ``(call index, buffer index)``); an
        # untracked parameter has none. A call's own fresh buffer is the result value itself.
        self.alias: dict[Value, tuple[Root, ...]] = {}
        self.untracked = untracked
        self.keys: list[Root] = []
        self.vals: list[Sequence[tuple[int, float]]] = []
        self.flat: list[tuple[int, float]] = []
        self.created: list[int] = []
        self.pos: dict[Root, int] = {}
        self.last: dict[Root, int] = {}
        self.calls: list[int] = []
        self.call_reads: dict[int, tuple[Value, ...]] = {}
        self.call_allocs: dict[int, Sequence[tuple[int, float]]] = {}
        self.call_first: dict[int, int] = {}  # call index -> position in ``keys`` of its first buffer

    def roots_of(self, v: Value) -> tuple[Root, ...]:
        rs = self.alias.get(v)
        if rs is not None:
            return rs
        return () if v in self.untracked else (v,)


def build_plan(
    fn: Function,
    env: dict[Value, Mixed],
    records: list[OpRecord | CallSummary],
    out_types: tuple[Type, ...],
    dev_slot: dict[Any, int],
    slot_gpu: list[int],
    *,
    param_uses: bool = True,
    donated: Mapping[Value, Gift] | None = None,
) -> FnPlan:
    """Arrange the records of one interpreted body into a plan, with liveness-based memory.

    ``param_uses=False`` (the simulated entry, whose plan is never summarized) does not track
    the parameters' storage at all: the caller owns it, so it is never freed here, and what only
    a summary needs (``param_last``, ``out_roots``, ``fresh``) is left empty (``param_last`` all
    -1). That skips the largest share of a pipeline entry's value edges (the weights every chunk
    reads) and a walk of its hundreds of results.

    ``donated`` (with ``param_uses=False``): parameters the body owns after all (``Function.donated``),
    (``Gift``): tracked as roots created before the first instruction, each freed where
    ``Gift.end`` says (a parameter nothing reads and nothing replaces: after the first
    instruction), unless returned."""
    body = fn.body
    n = len(body)
    assert len(records) == n
    donated = {} if param_uses or donated is None else donated
    w = _Walk(frozenset(() if param_uses else fn.params) - donated.keys())
    _walk_roots(fn, records, donated, w)
    devs, costs, comm, names, flops = _columns(records, bool(w.calls))
    out_root_list = list(_chain(map(w.roots_of, fn.outputs)))
    param_index = {p: j for j, p in enumerate(fn.params)}
    own_indexed = not w.calls
    pos, vals, created, last = w.pos, w.vals, w.created, w.last

    def position(r: Root) -> int | None:
        """The position in ``keys`` of an owned root, else None (the calls' own buffers are
        indexed on the first miss: few lookups, and a pipeline entry has ~300k of them)."""
        nonlocal own_indexed
        p = pos.get(r)
        if p is None and not own_indexed and r not in param_index:
            own_indexed = True
            for i in w.calls:
                c = records[i]
                assert isinstance(c, CallSummary)
                if c.own_ks is not None:
                    first = w.call_first[i]
                    own = c.pick_own(body[i].outputs)
                    pos.update(zip(own, range(first, first + len(own)), strict=True))
            p = pos.get(r)
        return p

    def owned(r: Root) -> Sequence[tuple[int, float]] | None:
        """The bytes per GPU of an owned root (a call's buffer, or a fresh op result), else None."""
        p = position(r)
        return None if p is None else vals[p]

    def last_of(r: Root) -> int:
        """The last use of root ``r`` (an owned root never read: its creation; else -1)."""
        x = last.get(r)
        if x is None:
            p = position(r)
            return -1 if p is None else created[p]
        return x

    # last uses not counting the return, where a summary needs them (parameters, results)
    internal_last = {r: last_of(r) for r in out_root_list} if param_uses else {}
    param_last = tuple(last.get(p, -1) for p in fn.params) if param_uses else (-1,) * len(fn.params)
    if param_uses and w.calls:
        internal_last, param_last = _inlined_lasts(fn, records, w, out_root_list, last_of)
    last.update(zip(out_root_list, repeat(n)))
    frees, dying_at = _frees(w, n)
    mem: list[MemEvents | None] = [None] * n
    for i, rec in enumerate(records):
        freed = frees.get(i)
        if type(rec) is OpRecord and (rec.allocs or freed):
            bump = rec.bump
            if rec.bump_dying is not None:  # a bump that depends on whether the first input dies here
                rs = w.roots_of(body[i].inputs[0])
                if len(rs) == 1 and owned(rs[0]) is not None and last_of(rs[0]) == i:
                    bump = rec.bump_dying
            mem[i] = (bump, rec.allocs, freed or ())
    call_profiles: dict[int, dict[int, list[tuple[int, float]]]] | None = {} if param_uses else None
    _call_events(w, costs, frees, dying_at, mem, call_profiles)
    # a plan never summarized: no result storage
    out_roots, fresh = _result_storage(fn, w, param_index, owned, internal_last) if param_uses else ([], [])
    slots = tuple(sorted({s for ds in devs for s in ds}))
    stall = stall_column(records)
    if stall is not None:
        slots = tuple(sorted({*slots, *(s for st in stall for s, _ in st)}))
    waits = waits_column(records)
    if waits is not None:
        slots = tuple(sorted({*slots, *(s for ws in waits for s in ws)}))
    plan = FnPlan(
        fn, devs, costs, comm, names, flops, mem, slots, tuple(out_roots), tuple(fresh), out_types, param_last
    )
    plan.call_profiles = call_profiles or None
    plan.stall = stall
    plan.waits = waits
    return plan


def _result_storage(
    fn: Function,
    w: _Walk,
    param_index: dict[Value, int],
    owned: Callable[[Root], Sequence[tuple[int, float]] | None],
    internal_last: dict[Root, int],
) -> tuple[list[tuple[int, ...]], list[tuple[tuple[tuple[int, float], ...], int]]]:
    """Per result of a body to summarize, its storage — parameters by index, the body's fresh
    buffers by (negative) number — and each fresh buffer's bytes and last use inside."""
    fresh_index: dict[Root, int] = {}
    fresh: list[tuple[tuple[tuple[int, float], ...], int]] = []
    out_roots: list[tuple[int, ...]] = []
    for v in fn.outputs:
        refs_of: list[int] = []
        for r in w.roots_of(v):
            if r in param_index:
                refs_of.append(param_index[r])
            elif (mine_bytes := owned(r)) is not None:
                if r not in fresh_index:
                    fresh_index[r] = len(fresh)
                    fresh.append((tuple(mine_bytes), internal_last.get(r, -1)))
                refs_of.append(-1 - fresh_index[r])
        out_roots.append(tuple(dict.fromkeys(refs_of)))
    return out_roots, fresh


def _inlined_lasts(
    fn: Function,
    records: list[OpRecord | CallSummary],
    w: _Walk,
    out_roots: list[Root],
    last_of: Callable[[Root], int],
) -> tuple[dict[Root, int], tuple[int, ...]]:
    """A body with calls: the last uses a summary needs — of each result's root and of each
    parameter — as positions in the body's inlined op order (``last_of``: a root's last use or
    creation, as an instruction index)."""
    body = fn.body
    at = list(accumulate((c.n_ops if isinstance(c, CallSummary) else 1 for c in records), initial=0))
    lp = _last_positions(fn, records, w, at)
    own_k = {
        v: k
        for i in w.calls
        if (c := records[i]).own_ks is not None  # type: ignore[union-attr]
        for v, k in zip(c.pick_own(body[i].outputs), c.own_ks, strict=True)  # type: ignore[union-attr]
    }

    def made_at(r: Root) -> int:
        """Where an owned root nothing in the body reads is last used: the op making it, or
        inside the call making it."""
        i = last_of(r)
        c = records[i] if i >= 0 else None
        if not isinstance(c, CallSummary):
            return at[i] if i >= 0 else -1
        return at[i] + c.fresh[r[1] if isinstance(r, tuple) else own_k[r]][1]

    internal_last = {r: lp[r] if r in lp else made_at(r) for r in out_roots}
    return internal_last, tuple(lp.get(p, -1) for p in fn.params)


def _last_positions(
    fn: Function, records: list[OpRecord | CallSummary], w: _Walk, at: list[int]
) -> dict[Root, int]:
    """The last read of each root as a position in the body's inlined op order (``at``: each
    instruction's first position): an op reads at its position, a call where its body last
    reads the parameter (``CallSummary.read_last``); a read of an aliased value is a read of
    its roots."""
    lp: dict[Any, int] = {}
    for i, (instr, rec) in enumerate(zip(fn.body, records, strict=True)):
        if type(rec) is OpRecord:
            lp.update(zip(instr.inputs, repeat(at[i])))
        else:
            assert isinstance(rec, CallSummary)
            # ascending last uses: a value passed twice keeps the later one
            lp.update(zip(w.call_reads[i], [at[i] + x for x in rec.read_last], strict=True))
    for v, rs in w.alias.items():
        lv = lp.get(v)
        if lv is not None:
            for r in rs:
                if lp.get(r, -1) < lv:
                    lp[r] = lv
    return lp


def _walk_roots(
    fn: Function, records: list[OpRecord | CallSummary], donated: Mapping[Value, Gift], w: _Walk
) -> None:
    """Find the body's roots (``_Walk``) and each root's last use."""
    alias = w.alias
    roots_of = w.roots_of
    keys, vals, flat, created, pos = w.keys, w.vals, w.flat, w.created, w.pos
    for p in (p for p in fn.params if p in donated):  # donated parameters first, in parameter order
        pos[p] = len(keys)
        keys.append(p)
        vals.append(donated[p].bytes)
        flat.extend(donated[p].bytes)
        created.append(0)
    # last uses: of each value read (a call reads only the parameters its body reads,
    # ``CallSummary.read_pos``), at C speed per instruction, later reads overwriting earlier ones;
    # a read of a value with other roots is folded into those roots after the walk. Only roots
    # are looked up in ``last`` (the entries of aliased or untracked values are never consulted).
    last = w.last
    put = last.update
    calls, call_reads, call_allocs, call_first = w.calls, w.call_reads, w.call_allocs, w.call_first
    for i, (instr, rec) in enumerate(zip(fn.body, records, strict=True)):
        if type(rec) is OpRecord:  # a primitive op
            ins = instr.inputs
            if len(ins) == 1:
                last[ins[0]] = i
            elif ins:
                put(zip(ins, repeat(i)))
            outs = instr.outputs
            if rec.view:
                shared = tuple(dict.fromkeys(_chain(map(roots_of, ins))))
                if shared:
                    alias.update(zip(outs, repeat(shared)))
                continue
            assert len(rec.out_bytes) == len(outs)
            if len(outs) == 1:  # most ops: no iterators to make
                o = outs[0]
                pos[o] = len(keys)
                keys.append(o)
                pairs = rec.out_bytes[0]
                vals.append(pairs)
                flat.extend(pairs)
                created.append(i)
                continue
            pos.update(zip(outs, range(len(keys), len(keys) + len(outs)), strict=True))
            keys.extend(outs)
            vals.extend(rec.out_bytes)
            flat.extend(_chain(rec.out_bytes))
            created.extend(repeat(i, len(outs)))
            continue
        assert isinstance(rec, CallSummary)
        calls.append(i)
        ins = instr.inputs
        rd = rec.pick_read(ins)
        call_reads[i] = rd
        if rd:
            put(zip(rd, repeat(i)))
        call_first[i] = len(keys)
        if rec.own_ks is not None:  # the common case: each result a parameter or one buffer
            outs = instr.outputs
            own = rec.pick_own(outs)  # the first result that is each buffer names it
            keys.extend(own)
            vals.extend(rec.own_bytes)
            flat.extend(rec.own_allocs)  # own_bytes, concatenated
            created.extend(repeat(i, len(own)))
            for at, j in rec.aliases:  # a result that is parameter j: the argument's storage
                alias[outs[at]] = roots_of(ins[j])
            alias.update((outs[at], (outs[f],)) for at, f in rec.repeats)  # result f's buffer again
            call_allocs[i] = rec.own_allocs
            continue
        mine: dict[int, Root] = {}  # fresh buffer k -> its root here
        allocs: list[tuple[int, float]] = []
        for o, out_refs in zip(instr.outputs, rec.out_roots, strict=True):
            uses_of: dict[Root, None] = {}
            for ref in out_refs:
                if ref >= 0:
                    uses_of.update(dict.fromkeys(roots_of(ins[ref])))
                    continue
                k = -1 - ref
                b = mine.get(k)
                if b is None:  # one buffer, however many results use it
                    b = mine[k] = (i, k)
                    pos[b] = len(keys)
                    keys.append(b)
                    vals.append(rec.fresh[k][0])
                    created.append(i)
                    allocs.extend(rec.fresh[k][0])
                uses_of[b] = None
            if uses_of:
                alias[o] = tuple(uses_of)
        flat.extend(allocs)
        call_allocs[i] = allocs
    # a read of a value with other roots is a read of those roots
    for v, rs in alias.items():
        lv = last.get(v)
        if lv is not None:
            for r in rs:
                if last.get(r, -1) < lv:
                    last[r] = lv
    for p, gift in donated.items():
        last[p] = gift.end(last.get(p, -1))


def _columns(
    records: list[OpRecord | CallSummary], has_calls: bool
) -> tuple[list[tuple[int, ...]], list[float | CallSummary], list[bool], list[str], list[float]]:
    """The plan's per-instruction columns: slots, cost, communicates, name, FLOPs."""
    devs: list[tuple[int, ...]] = []
    costs: list[float | CallSummary] = []
    comm: list[bool] = []
    names: list[str] = []
    flops: list[float] = []
    if not has_calls:
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
                devs.append(rec.devs)
                costs.append(rec.seconds)
                comm.append(rec.comm)
                names.append(rec.name)
                flops.append(rec.flops)
    return devs, costs, comm, names, flops


def _frees(
    w: _Walk, n: int
) -> tuple[dict[int, tuple[tuple[int, float], ...]], dict[int, list[tuple[int, int]]]]:
    """Per instruction, the bytes freed after it, and (in a body with calls) which roots (spans
    of positions in ``keys``) die there."""
    keys, vals, flat, created, last, calls = w.keys, w.vals, w.flat, w.created, w.last, w.calls
    # frees: each owned root at its last use, in creation order within one instruction; and
    # which roots (spans of positions in ``keys``) die where. Consecutive roots mostly die
    # together (a call's buffers): they are grouped into runs at C speed, the runs ordered
    # (stably) by end, and a run's frees are one slice of ``flat`` (all bytes pairs, key order).
    frees: dict[int, tuple[tuple[int, float], ...]] = {}
    dying_at: dict[int, list[tuple[int, int]]] = {}
    ends = list(map(last.get, keys, created))
    n_keys = len(ends)
    cuts = [0, *compress(range(1, n_keys), map(ne, ends[1:], ends[:-1])), n_keys] if ends else [0]
    starts, stops = cuts[:-1], cuts[1:]
    run_end = list(map(ends.__getitem__, starts))
    off = list(accumulate(map(len, vals), initial=0))  # where each root's pairs start in ``flat``
    for end, grp in groupby(sorted(range(len(starts)), key=run_end.__getitem__), run_end.__getitem__):
        if end >= n:
            continue
        spans = [(starts[j], stops[j]) for j in grp]
        frees[end] = tuple(_chain([flat[off[a] : off[b]] for a, b in spans]))
        if calls:
            dying_at[end] = spans
    return frees, dying_at


def _call_events(
    w: _Walk,
    costs: list[float | CallSummary],
    frees: dict[int, tuple[tuple[int, float], ...]],
    dying_at: dict[int, list[tuple[int, int]]],
    mem: list[MemEvents | None],
    profiles: dict[int, dict[int, list[tuple[int, float]]]] | None,
) -> None:
    """Each call site's memory events into ``mem``: its peak bumps given the roots dying at it,
    its allocations and frees; and (``profiles``, a plan to summarize) the callee's memory
    profile relative to the live set at the call."""
    keys, vals, alias = w.keys, w.vals, w.alias
    call_first, call_reads, call_allocs = w.call_first, w.call_reads, w.call_allocs
    # a call's peak bumps given the roots dying at it, memoized per call site pattern (the
    # microbatches repeat one): the bytes objects are alive here, so their ids identify them
    peak_memo: dict[tuple[Any, ...], tuple[Pairs, Profile]] = {}
    for i in w.calls:
        c = costs[i]
        assert isinstance(c, CallSummary)
        dies = dying_at.get(i)
        if not dies:
            pk = tuple(c.peak_extra.items())
            if profiles is not None:
                profiles[i] = c.profile
        else:
            # roots older than the call that die here were read by it (so are in ``lu``): they
            # count until their last use inside; this call's buffers dying here are results
            # nobody uses: gone after their last use inside
            first = call_first[i]
            older = [(a, min(b, first)) for a, b in dies if a < first]
            gone = [(max(a, first), b) for a, b in dies if b > first]
            older_vals = list(_chain([vals[a:b] for a, b in older]))
            if older:
                lu = _last_uses(call_reads[i], c, alias)
                # a root the call never reads (a donated parameter held for its successor)
                # stays live through the whole call
                uses = tuple(lu.get(r, WHOLE_CALL) for r in _chain([keys[a:b] for a, b in older]))
            else:
                uses = ()
            if c.own_ks is not None:
                mine_k = tuple(_chain(c.own_ks[a - first : b - first] for a, b in gone))
            else:
                mine_k = tuple(r[1] for r in _chain(keys[a:b] for a, b in gone))  # type: ignore[index]
            key = (id(c), uses, tuple(map(id, older_vals)), mine_k)
            hit = peak_memo.get(key)
            if hit is None:
                dying = [(u, g, b) for u, v in zip(uses, older_vals, strict=True) for g, b in v]
                dead = [(c.fresh[k][1], g, b) for k in mine_k for g, b in c.fresh[k][0]]
                hit = peak_memo[key] = c.with_dying(dying, dead)
            pk = hit[0]
            if profiles is not None:
                profiles[i] = hit[1]
        al = tuple(call_allocs[i])
        fr = frees.get(i, ())
        mem[i] = (pk, al, fr) if (pk or al or fr) else None


def _last_uses(
    read: Sequence[Value], c: CallSummary, alias: dict[Value, tuple[Root, ...]]
) -> dict[Root, int]:
    """The last use inside ``c``'s body of each root a call site reads (``read``: its arguments at
    ``c.read_pos``, in ascending last use; ``alias``: the roots of values that are not their own
    root); built only for call sites where a root dies. Entries of aliased or untracked values
    themselves are meaningless (they are never roots)."""
    # a value passed twice keeps its larger last use (they come in ascending order)
    lu: dict[Root, int] = dict(zip(read, c.read_last, strict=True))
    if alias:
        for v in alias.keys() & read:  # the max below does not depend on this set's order
            lv = lu[v]
            for r in alias[v]:
                if lu.get(r, -1) < lv:
                    lu[r] = lv
    return lu
