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
from operator import attrgetter, is_not
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from distir.interp.shapes import Concrete, Mixed
from distir.ir.function import Function
from distir.ir.ops import Op
from distir.ir.types import Type
from distir.ir.values import Value
from distir.parallel.sharding.ring import ring_axis
from distir.sim import overlap
from distir.sim.interference import stall_column
from distir.sim.memcols import build_columns
from distir.sim.records import FlatColumns, FnPlan, MemEvents, OpRecord, waits_column

if TYPE_CHECKING:
    from distir.sim.plan import PlanDomain
    from distir.sim.records import Gift

GpuBytes = list[tuple[int, float]]
_CommOp = tuple[Op, tuple[Type, ...], tuple[Type, ...]]


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
    body = fn.body
    params = fn.params
    if Concrete in map(type, args) or not set(map(type, body)) <= {Op}:
        return None
    n = len(body)
    ops = cast(tuple[Op, ...], body)  # all ops: checked above
    walked = _walk_types(dom, fn, ops, args)  # 1. types, records and direct last uses
    if walked is None:
        return None
    types, last, kinds, table, comm_ops = walked
    outputs_of = list(map(attrgetter("outputs"), ops))
    results = list(chain.from_iterable(outputs_of))
    if not _results_check(results, len(params), types, last):  # 2. what the loop did not check
        return None
    one_each = len(results) == n  # every op has one result: result r is op r's
    has_views = any(rec.view for rec in table)
    has_own_bump = any(rec.bump_dying is not None for rec in table)
    # the per-op records and inputs; a compact plan of a plain body needs neither
    plain = columnar and one_each and not has_views and not has_own_bump
    records = [] if plain else list(map(table.__getitem__, kinds))
    inputs_of = [] if plain else list(map(attrgetter("inputs"), ops))
    # 3. liveness: a use of a view is a use of the storage it shares (its roots)
    root = _view_roots(records, inputs_of, outputs_of, last) if has_views else {}
    out_refs = [root.get(v, (v,)) for v in fn.outputs]
    out_roots_all = [x for rs in out_refs for x in rs]
    views = set(root)
    # bytes per GPU of each result (aligned with ``results``); a compact plan needs only the outputs'
    owned_flat = (
        None if columnar and one_each else list(chain.from_iterable(map(attrgetter("out_bytes"), records)))
    )
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
    gift = donated or {}
    # donated parameters die after their last use (one nothing reads: after the first op), first
    # among the frees after an op (``build_plan`` keeps them first in creation order)
    for p, g in gift.items():
        last[p] = g.end(last[p])
    gifts = [(max(last[p], 0), gift[p].bytes) for p in params if p in gift]
    # an op whose first input dies at it bumps the peak less (a Redistribute freeing its source)
    bump_at = _dying_bumps(records, inputs_of, root, last, param_index, gift) if has_own_bump else {}
    fresh_of = [v not in views for v in results] if views else None
    mem: list[MemEvents | None] = []
    columns = None
    if columnar:
        outs_per_op = None if one_each else list(map(len, outputs_of))
        ends = np.fromiter(ends_of, np.int64, len(results))
        columns = build_columns(kinds, table, bump_at, outs_per_op, fresh_of, ends, gifts)
    else:
        assert owned_flat is not None  # built unless columnar
        mem = _memory_events(n, records, owned_flat, list(ends_of), fresh_of, gifts, bump_at)
    # 5. the results: parameters by index, fresh buffers by (negative) number
    out_roots, fresh = _result_storage(
        out_refs, param_index, results, owned_flat, table, kinds, internal_last
    )
    out_types = tuple(types[v] for v in fn.outputs)
    param_last = tuple(internal_last.get(p, last.get(p, -1)) for p in params)
    devs, costs, comm, names, flops, slots = _per_op_columns(records, table, columns is not None)
    stall, waits, slots = _stalls(records, table, columns is not None, slots)
    plan = FnPlan(
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
    plan.stall, plan.waits = stall, waits
    return plan


def _walk_types(
    dom: PlanDomain, fn: Function, ops: tuple[Op, ...], args: Sequence[Mixed]
) -> tuple[dict[Value, Type], dict[Value, int], list[int], list[OpRecord], list[_CommOp]] | None:
    """Step 1 of ``plan_flat``: types, records and direct last uses, op by op; None when an op
    is wrong (the general path reports it) or gives a concrete value.

    The only pass that must run op by op. The memo here is keyed by the identity of the
    attribute and type objects (no hashing of their contents): attributes are interned by the
    builder and a result's type is the object the memo handed out, so a long body hits with a key
    of small ints. Every object whose id is in a key stays referenced (by the body or by
    ``types``) until ``plan_flat`` returns, so the ids stay valid. Ops of one and two inputs and
    one result (nearly all) take unrolled paths."""
    params = fn.params
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
                if link.via >= 0 or link.unless:  # as the Redistributes moved (a view: nothing)
                    link = link.resolved(lambda j: table[kinds[j]].view)
                if link is not None:
                    key = (*key, link)
            hit = seen_get(key)
            if hit is None:
                in_t = [types[v] for v in ins]
                dom.pending_link = link
                outs_m = dom.op(instr, in_t)  # a wrong op raises: the general path reports it
                if Concrete in map(type, outs_m):
                    return None
                outs_t = cast(Sequence[Type], outs_m)
                table.append(frame.pop())
                # each distinct communication, for ``distir.sim.relabel`` (a ring attention's
                # record is compute with its transfers inside: ``distir.sim.ring``)
                if table[-1].comm or ring_axis(instr.name, instr.attrs, in_t) is not None:
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
    except (KeyError, IndexError, ValueError):  # an undefined input, a result count that
        return None  # differs from the op's, a wrong op: the general path reports it
    finally:
        dom._frames.pop()
    paired = dom.overlap_pairs(fn)
    if paired is not None:  # tensor-parallel collectives pipelined with their GEMMs
        assert dom.tp_form is not None  # pairs exist only under an overlap
        overlap.apply_kinds(kinds, table, paired, dom.tp_form)
    return types, last, kinds, table, comm_ops


def _memory_events(
    n: int,
    records: list[OpRecord],
    owned: list[GpuBytes],
    ends_list: list[int],
    fresh_of: list[bool] | None,
    gifts: list[tuple[int, Sequence[tuple[int, float]]]],
    bump_at: dict[int, Sequence[tuple[int, float]]],
) -> list[MemEvents | None]:
    """Step 4 of ``plan_flat`` (a plan with per-op lists): each op's memory events — each fresh
    result freed after its last use, donated parameters first among the frees."""
    frees: list[GpuBytes | None] = [None] * n
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
    bumps = list(map(attrgetter("bump"), records))
    for i, bump in bump_at.items():
        bumps[i] = bump
    return [
        (bump, alloc, tuple(freed) if freed else ()) if (alloc or freed) else None
        for alloc, bump, freed in zip(map(attrgetter("allocs"), records), bumps, frees, strict=True)
    ]


def _result_storage(
    out_refs: list[tuple[Value, ...]],
    param_index: dict[Value, int],
    results: list[Value],
    owned_flat: list[GpuBytes] | None,
    table: list[OpRecord],
    kinds: list[int],
    internal_last: dict[Value, int],
) -> tuple[list[tuple[int, ...]], list[tuple[tuple[tuple[int, float], ...], int]]]:
    """Step 5 of ``plan_flat``: per result its storage — parameters by index, fresh buffers by
    (negative) number — and each fresh buffer's bytes and last use inside."""
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
    return out_roots, fresh


def _per_op_columns(
    records: list[OpRecord], table: list[OpRecord], compact: bool
) -> tuple[list[tuple[int, ...]], list[Any], list[bool], list[str], list[float], tuple[int, ...]]:
    """The plan's per-op columns (empty for a compact plan) and its slots."""
    if compact:
        slots = tuple(sorted({s for rec in table for s in rec.devs}))
        devs: list[tuple[int, ...]] = []
        costs: list[Any] = []
        comm: list[bool] = []
        names: list[str] = []
        flops: list[float] = []
    else:
        devs = list(map(attrgetter("devs"), records))
        slots = tuple(sorted({s for ds in set(devs) for s in ds}))
        costs, comm, names, flops = (
            list(map(attrgetter(f), records)) for f in ("seconds", "comm", "name", "flops")
        )
    return devs, costs, comm, names, flops, slots


def _stalls(
    records: list[OpRecord], table: list[OpRecord], compact: bool, slots: tuple[int, ...]
) -> tuple[list[tuple[tuple[int, float], ...]] | None, list[tuple[int, ...]] | None, tuple[int, ...]]:
    """The plan's stall column (``distir.sim.interference``) and waits column (``OpRecord.waits``;
    each None: no op stalls / waits so, or a compact plan, whose table holds them) and its slots
    with the stalled and waited ones."""
    stall, waits = stall_column(table), waits_column(table)
    if stall is not None:
        slots = tuple(sorted({*slots, *(s for st in stall for s, _ in st)}))
    if waits is not None:
        slots = tuple(sorted({*slots, *(s for ws in waits for s in ws)}))
    return (
        None if compact or stall is None else [rec.stall for rec in records],
        None if compact or waits is None else [rec.waits for rec in records],
        slots,
    )


def _view_roots(
    records: list[OpRecord],
    inputs_of: list[tuple[Value, ...]],
    outputs_of: list[tuple[Value, ...]],
    last: dict[Value, int],
) -> dict[Value, tuple[Value, ...]]:
    """Step 3 of ``plan_flat``: a view's result -> the values whose storage it shares; a use of
    a view is a use of that storage (``last`` updated)."""
    root: dict[Value, tuple[Value, ...]] = {}
    is_view = list(map(attrgetter("view"), records))
    for i in compress(range(len(records)), is_view):
        shared = tuple(dict.fromkeys(x for v in inputs_of[i] for x in root.get(v, (v,))))
        for v in outputs_of[i]:
            root[v] = shared
    for i, ins in enumerate(inputs_of):  # in program order: the last assignment is the last use
        for v in ins:
            for x in root.get(v, (v,)):
                last[x] = i
    return root


def _dying_bumps(
    records: list[OpRecord],
    inputs_of: list[tuple[Value, ...]],
    root: dict[Value, tuple[Value, ...]],
    last: dict[Value, int],
    param_index: dict[Value, int],
    gift: Mapping[Value, Gift],
) -> dict[int, Sequence[tuple[int, float]]]:
    """The ops whose first input dies at them, with the (lower) peak bump they take then."""
    bump_at: dict[int, Sequence[tuple[int, float]]] = {}
    own_bump = map(is_not, map(attrgetter("bump_dying"), records), repeat(None))
    for i in compress(range(len(records)), own_bump):
        rs = root.get(inputs_of[i][0], (inputs_of[i][0],))
        x = rs[0]
        if len(rs) == 1 and (x not in param_index or x in gift) and x not in root and last[x] == i:
            bump_at[i] = cast(Sequence[tuple[int, float]], records[i].bump_dying)  # not None: selected above
    return bump_at


def _results_check(
    results: list[Value], n_params: int, types: dict[Value, Type], last: dict[Value, int]
) -> bool:
    """Step 2 of ``plan_flat``: what the op-by-op walk did not check, in bulk — result counts and
    declared result types. Every result entered ``last`` once (the walk enters an op's results,
    or its first only when the memo gives one): else an op has more results than its
    definition, or a value is defined twice, and the general path reports it."""
    if len(last) != n_params + len(results):
        return False
    if any(map(attrgetter("type"), results)):
        for v in results:
            if v.type is not None and v.type != types[v]:
                return False
    return True
