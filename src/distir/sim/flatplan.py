"""The planner's fast path: a body of primitive ops planned in one pass.

``PlanDomain.plan`` hands every body here first. For a body without calls and without concrete
values (a long flat program: the case where planning cost is per op, not per call site) this
does in one pass what ``PlanDomain._walk`` followed by ``build_plan`` does in two: types from
the op memo, the op records, storage roots, last uses and memory events. Values are numbered by
position (parameters first, then results in program order), so liveness lives in flat lists
instead of dictionaries keyed by value, and each value is looked up once per use.

Contract: for a body it accepts, the plan is the one the general path builds — same records,
memory events (in the same order), result roots, fresh buffers and parameter last uses (tested
against the general path). It returns None — and the general path plans the body, reporting any
error precisely — for a body with a call, a concrete argument or result, or a result whose
declared type differs from the inferred one. It also lists each distinct communicating op with
its types (``FnPlan.comm_ops``: what ``distir.sim.relabel`` checks on another mesh).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import chain, compress, islice, repeat
from operator import attrgetter, is_not, itemgetter
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from distir.interp.shapes import Concrete, Mixed
from distir.ir.function import Function
from distir.ir.ops import Op
from distir.ir.types import Type
from distir.ir.values import Value
from distir.sim.memcols import build_columns

if TYPE_CHECKING:
    from distir.sim.plan import FnPlan, MemEvents, OpRecord, PlanDomain
    from distir.sim.records import Gift

GpuBytes = list[tuple[int, float]]


def plan_flat(
    dom: PlanDomain,
    fn: Function,
    args: Sequence[Mixed],
    *,
    columnar: bool = False,
    donated: Mapping[Value, Gift] | None = None,
) -> FnPlan | None:
    """The plan of ``fn`` at ``args``, or None when the body needs the general path.

    ``columnar=True`` (an entry that is only run, untraced) keeps the plan compact
    (``FnPlan.columns``: a record per distinct op, memory events as columns) and leaves the
    per-op lists empty. ``donated``: parameters freed after their last use or the instruction
    writing their successor (``build_plan``'s)."""
    from distir.sim.plan import FnPlan
    from distir.sim.records import FlatColumns

    body = fn.body
    params = fn.params
    if Concrete in map(type, args) or not set(map(type, body)) <= {Op}:
        return None
    n = len(body)
    ops = cast(tuple[Op, ...], body)  # all ops: checked above
    # 1. types, records and direct last uses: the only pass that must run op by op. The memo
    # here is keyed by the identity of the attribute and type objects (no hashing of their
    # contents): attributes are interned by the builder and a result's type is the object the
    # memo handed out, so a long body hits with a key of small ints. Every object whose id is in
    # a key stays referenced (by the body or by ``types``) until this function returns, so the
    # ids stay valid. Ops of one and two inputs and one result (nearly all) take unrolled paths.
    types: dict[Value, Type] = dict(zip(params, cast(Sequence[Type], args), strict=True))
    # value -> the last op that uses it directly, or makes it (-1: a parameter nothing uses). A
    # result enters at the op making it, so the values come in program order: parameters first,
    # then each op's results (``ends`` below reads them in bulk)
    last: dict[Value, int] = dict.fromkeys(params, -1)
    kinds: list[int] = []  # per op, its record's index in ``table``
    kind_append = kinds.append
    table: list[OpRecord] = []  # the distinct records, one per memo entry
    # key -> (result types, record, the type of the only result or None, the record's index)
    seen: dict[tuple[Any, ...], tuple[Sequence[Type], OpRecord, Type | None, int]] = {}
    seen_get = seen.get
    frame: list[OpRecord] = []
    comm_ops: list[tuple[Op, tuple[Type, ...], tuple[Type, ...]]] = []
    links = dom.fusion_of(fn)  # fused elementwise chains: an op's link is part of its key
    dom._frames.append(frame)  # type: ignore[arg-type]  # PlanDomain.op appends its record here
    try:
        for i, instr in enumerate(ops):
            ins = instr.inputs
            n_in = len(ins)
            if n_in == 1:
                a = ins[0]
                key: tuple[Any, ...] = (instr.name, id(instr.attrs), id(types[a]))
                last[a] = i
            elif n_in == 2:
                a, b = ins
                key = (instr.name, id(instr.attrs), id(types[a]), id(types[b]))
                last[a] = i
                last[b] = i
            else:
                key = (instr.name, id(instr.attrs), *[id(types[v]) for v in ins])
                for v in ins:
                    last[v] = i
            link = links[i] if links is not None else None
            if link is not None:
                if link.via >= 0:  # through a Redistribute: only if it moved nothing (a view)
                    link = link.plain() if table[kinds[link.via]].view else None
                if link is not None:
                    key = (*key, link)
            hit = seen_get(key)
            if hit is None:
                in_t = [types[v] for v in ins]
                dom.pending_link = link
                try:
                    outs_m = dom.op(instr, in_t)
                except Exception:  # the general path reports it "while interpreting" the op
                    return None
                if Concrete in map(type, outs_m):
                    return None
                outs_t = cast(Sequence[Type], outs_m)
                table.append(frame.pop())
                if table[-1].comm:  # each distinct communication, for ``distir.sim.relabel``
                    comm_ops.append((instr, tuple(in_t), tuple(outs_t)))
                hit = seen[key] = (outs_t, table[-1], outs_t[0] if len(outs_t) == 1 else None, len(table) - 1)
            kind_append(hit[3])
            only = hit[2]
            if only is not None:  # an op with one result (a mismatched count is caught below)
                out = instr.outputs[0]
                types[out] = only
                last[out] = i
            else:
                types.update(zip(instr.outputs, hit[0], strict=True))
                last.update(zip(instr.outputs, repeat(i)))
    except (KeyError, IndexError, ValueError):  # an undefined input or a result count that differs
        return None  # from the op's: the general path reports it
    finally:
        dom._frames.pop()
    # 2. what the loop did not check, in bulk: result counts and declared result types
    # every result entered ``last`` once (the loop enters an op's results, or its first only when
    # the memo gives one): else an op has more results than its definition, or a value is defined
    # twice, and the general path reports it
    outputs_of = list(map(attrgetter("outputs"), ops))
    results = list(chain.from_iterable(outputs_of))
    if len(last) != len(params) + len(results):
        return None
    if any(map(attrgetter("type"), results)):
        for v in results:
            if v.type is not None and v.type != types[v]:
                return None
    one_each = len(results) == n  # every op has one result: result r is op r's
    has_views = any(rec.view for rec in table)
    has_own_bump = any(rec.bump_dying is not None for rec in table)
    # the per-op records and inputs; a compact plan of a plain body needs neither
    plain = columnar and one_each and not has_views and not has_own_bump
    records = [] if plain else list(map(table.__getitem__, kinds))
    inputs_of = [] if plain else list(map(attrgetter("inputs"), ops))
    # 3. liveness: a use of a view is a use of the storage it shares (its roots)
    root: dict[Value, tuple[Value, ...]] = {}  # a view's result -> the values whose storage it shares
    if has_views:
        is_view = list(map(itemgetter(5), records))
        for i in compress(range(n), is_view):
            shared = tuple(dict.fromkeys(x for v in inputs_of[i] for x in root.get(v, (v,))))
            for v in outputs_of[i]:
                root[v] = shared
        for i, ins in enumerate(inputs_of):  # in program order: the last assignment is the last use
            for v in ins:
                for x in root.get(v, (v,)):
                    last[x] = i
    out_refs = [root.get(v, (v,)) for v in fn.outputs]
    out_roots_all = [x for rs in out_refs for x in rs]
    views = set(root)
    # bytes per GPU of each result (aligned with ``results``); a compact plan needs only the outputs'
    owned_flat = None if columnar and one_each else list(chain.from_iterable(map(itemgetter(6), records)))
    # the last use inside the body; a result nothing uses dies at the op that makes it
    if not all(map(last.__contains__, out_roots_all)):  # an undefined result: the general path reports it
        return None
    internal_last = {x: last[x] for x in out_roots_all}
    for x in out_roots_all:
        last[x] = n
    # each result's last use (where it dies), in program order; a returned one outlives the body
    ends_of = islice(last.values(), len(params), None)
    # 4. memory events: each fresh result's bytes are freed after its last use
    param_index = {p: j for j, p in enumerate(params)}
    # an op whose first input dies at it bumps the peak less (a Redistribute freeing its source)
    bump_at: dict[int, Sequence[tuple[int, float]]] = {}
    gift = donated or {}
    # donated parameters die after their last use (one nothing reads: after the first op), first
    # among the frees after an op (``build_plan`` keeps them first in creation order)
    for p, g in gift.items():
        last[p] = g.end(last[p])
    gifts = [(max(last[p], 0), gift[p].bytes) for p in params if p in gift]
    own_bump = map(is_not, map(itemgetter(9), records), repeat(None))
    for i in compress(range(n), own_bump) if has_own_bump else ():
        rs = root.get(inputs_of[i][0], (inputs_of[i][0],))
        x = rs[0]
        if len(rs) == 1 and (x not in param_index or x in gift) and x not in views and last[x] == i:
            bump_at[i] = cast(Sequence[tuple[int, float]], records[i].bump_dying)  # not None: selected above
    fresh_of = [v not in views for v in results] if views else None
    mem: list[MemEvents | None] = []
    columns = None
    if columnar:
        outs_per_op = None if one_each else list(map(len, outputs_of))
        ends = np.fromiter(ends_of, np.int64, len(results))
        columns = build_columns(kinds, table, bump_at, outs_per_op, fresh_of, ends, gifts)
    else:
        frees: list[GpuBytes | None] = [None] * n
        ends_list = list(ends_of)
        assert owned_flat is not None  # built unless columnar
        owned = owned_flat
        if fresh_of is not None:
            dying = zip(compress(ends_list, fresh_of), compress(owned, fresh_of), strict=True)
        else:
            dying = zip(ends_list, owned, strict=True)
        for end, mine in chain(gifts, dying):
            if end < n:
                pending = frees[end]
                if pending is None:
                    frees[end] = list(mine)
                else:
                    pending.extend(mine)
        bumps = list(map(itemgetter(8), records))
        for i, bump in bump_at.items():
            bumps[i] = bump
        mem = [
            (bump, alloc, tuple(freed) if freed else ()) if (alloc or freed) else None
            for alloc, bump, freed in zip(map(itemgetter(7), records), bumps, frees, strict=True)
        ]
    # 5. the results: parameters by index, fresh buffers by (negative) number
    fresh_index: dict[Value, int] = {}
    fresh: list[tuple[tuple[tuple[int, float], ...], int]] = []
    out_roots: list[tuple[int, ...]] = []
    for rs in out_refs:
        refs_of: list[int] = []
        for x in rs:
            if x in param_index:
                refs_of.append(param_index[x])
                continue
            if x not in fresh_index:
                fresh_index[x] = len(fresh)
                r = results.index(x)
                mine = owned_flat[r] if owned_flat is not None else table[kinds[r]].out_bytes[0]
                fresh.append((tuple(mine), internal_last[x]))
            refs_of.append(-1 - fresh_index[x])
        out_roots.append(tuple(dict.fromkeys(refs_of)))
    out_types = tuple(types[v] for v in fn.outputs)
    param_last = tuple(internal_last.get(p, last.get(p, -1)) for p in params)
    if columns is not None:
        slots = tuple(sorted({s for rec in table for s in rec.devs}))
        devs: list[tuple[int, ...]] = []
        costs: list[Any] = []
        comm: list[bool] = []
        names: list[str] = []
        flops: list[float] = []
    else:
        devs = list(map(itemgetter(0), records))
        slots = tuple(sorted({s for ds in set(devs) for s in ds}))
        costs, comm, names, flops = (list(map(itemgetter(k), records)) for k in range(1, 5))
    return FnPlan(
        fn,
        devs,
        costs,
        comm,
        names,
        flops,
        mem,
        slots,
        tuple(out_roots),
        tuple(fresh),
        out_types,
        param_last,
        out_values=out_types,
        columns=None if columns is None else FlatColumns(kinds, table, columns),
        flat=True,
        comm_ops=tuple(comm_ops),
    )
