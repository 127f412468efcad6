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
declared type differs from the inferred one.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, compress, repeat
from operator import attrgetter, is_not, itemgetter
from typing import TYPE_CHECKING, Any, cast

from distir.interp.shapes import Concrete, Mixed
from distir.ir.function import Function
from distir.ir.ops import Op
from distir.ir.types import Type
from distir.ir.values import Value

if TYPE_CHECKING:
    from distir.sim.plan import FnPlan, MemEvents, OpRecord, PlanDomain

GpuBytes = list[tuple[int, float]]


def plan_flat(dom: PlanDomain, fn: Function, args: Sequence[Mixed]) -> FnPlan | None:
    """The plan of ``fn`` at ``args``, or None when the body needs the general path."""
    from distir.sim.plan import FnPlan

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
    last: dict[Value, int] = {}  # value -> the last op that uses it directly
    records: list[OpRecord] = []
    rec_append = records.append
    # key -> (result types, record, the type of the only result or None)
    seen: dict[tuple[Any, ...], tuple[Sequence[Type], OpRecord, Type | None]] = {}
    seen_get = seen.get
    frame: list[OpRecord] = []
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
            hit = seen_get(key)
            if hit is None:
                try:
                    outs_m = dom.op(instr, [types[v] for v in ins])
                except Exception:  # the general path reports it "while interpreting" the op
                    return None
                if Concrete in map(type, outs_m):
                    return None
                outs_t = cast(Sequence[Type], outs_m)
                hit = seen[key] = (outs_t, frame.pop(), outs_t[0] if len(outs_t) == 1 else None)
            rec_append(hit[1])
            only = hit[2]
            if only is not None:  # an op with one result (a mismatched count is caught below)
                types[instr.outputs[0]] = only
            else:
                types.update(zip(instr.outputs, hit[0], strict=True))
    except (KeyError, IndexError, ValueError):  # an undefined input or a result count that differs
        return None  # from the op's: the general path reports it
    finally:
        dom._frames.pop()
    # 2. what the loop did not check, in bulk: result counts and declared result types
    outputs_of = list(map(attrgetter("outputs"), ops))
    if list(map(len, outputs_of)) != list(map(len, map(itemgetter(6), records))):
        return None
    results = list(chain.from_iterable(outputs_of))
    if any(map(attrgetter("type"), results)):
        for v in results:
            if v.type is not None and v.type != types[v]:
                return None
    # 3. liveness: a use of a view is a use of the storage it shares (its roots)
    inputs_of = list(map(attrgetter("inputs"), ops))
    is_view = list(map(itemgetter(5), records))
    root: dict[Value, tuple[Value, ...]] = {}  # a view's result -> the values whose storage it shares
    if any(is_view):
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
    owned_flat = list(chain.from_iterable(map(itemgetter(6), records)))  # aligned with ``results``
    defined_at = list(chain.from_iterable(map(repeat, range(n), map(len, outputs_of))))
    # the last use inside the body; a result nothing uses dies at the op that makes it
    internal_last = {x: last.get(x, -1) for x in out_roots_all}
    for x, at in internal_last.items():
        if at < 0 and x not in params:
            internal_last[x] = defined_at[results.index(x)]
    for x in out_roots_all:
        last[x] = n
    # 4. memory events: each fresh result's bytes are freed after its last use
    ends = list(map(last.get, results, defined_at))
    frees: list[GpuBytes | None] = [None] * n
    if views:
        fresh_of = [v not in views for v in results]
        dying = zip(compress(ends, fresh_of), compress(owned_flat, fresh_of), strict=True)
    else:
        dying = zip(ends, owned_flat, strict=True)
    for end, mine in dying:
        if end < n:
            pending = frees[end]
            if pending is None:
                frees[end] = list(mine)
            else:
                pending.extend(mine)
    bumps = list(map(itemgetter(8), records))
    param_index = {p: j for j, p in enumerate(params)}
    for i in compress(range(n), map(is_not, map(itemgetter(9), records), repeat(None))):
        rs = root.get(inputs_of[i][0], (inputs_of[i][0],))
        x = rs[0]
        if len(rs) == 1 and x not in param_index and x not in views and last[x] == i:
            bumps[i] = records[i][9]
    mem: list[MemEvents | None] = [
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
                fresh.append((tuple(owned_flat[results.index(x)]), internal_last[x]))
            refs_of.append(-1 - fresh_index[x])
        out_roots.append(tuple(dict.fromkeys(refs_of)))
    devs = list(map(itemgetter(0), records))
    slots = tuple(sorted({s for ds in set(devs) for s in ds}))
    param_last = tuple(internal_last.get(p, last.get(p, -1)) for p in params)
    out_types = tuple(types[v] for v in fn.outputs)
    return FnPlan(
        fn,
        devs,
        list(map(itemgetter(1), records)),
        list(map(itemgetter(2), records)),
        list(map(itemgetter(3), records)),
        list(map(itemgetter(4), records)),
        mem,
        slots,
        tuple(out_roots),
        tuple(fresh),
        out_types,
        param_last,
        out_values=out_types,
    )
