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
from typing import TYPE_CHECKING, cast

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
    if any(type(a) is Concrete for a in args) or not all(type(x) is Op for x in body):
        return None
    n = len(body)
    n_params = len(fn.params)
    n_values = n_params + sum(len(x.outputs) for x in body)
    num: dict[Value, int] = {p: j for j, p in enumerate(fn.params)}
    # per value, numbered parameters first and then results in program order (lists sized up
    # front: the loop assigns by index)
    types: list[Type] = [*args, *([None] * (n_values - n_params))]  # type: ignore[list-item]
    last: list[int] = [-1] * n_values
    # None when a value is its own storage, else the values whose storage it views
    root: list[tuple[int, ...] | None] = [None] * n_values
    owned: list[GpuBytes | None] = [None] * n_values  # bytes per GPU of fresh results
    records: list[OpRecord] = []
    rec_append = records.append
    memo_get = dom._memo.get
    depends: list[int] = []  # ops whose memory bump depends on their first input dying there
    frame: list[OpRecord] = []
    k = n_params
    dom._frames.append(frame)  # type: ignore[arg-type]  # PlanDomain.op appends its record here
    try:
        for i, instr in enumerate(cast(tuple[Op, ...], body)):  # all ops: checked above
            js = [num[v] for v in instr.inputs]
            ins = [types[j] for j in js]
            hit = memo_get((instr.name, instr.attrs, *ins))
            if hit is None:
                try:
                    outs_m = dom.op(instr, ins)
                except Exception:  # the general path reports it "while interpreting" the op
                    return None
                rec = frame.pop()
                if any(type(o) is Concrete for o in outs_m):
                    return None
                outs: Sequence[Type] = outs_m  # type: ignore[assignment]
            else:
                outs, rec = hit
            rec_append(rec)
            if rec[9] is not None:
                depends.append(i)
            for j in js:
                r = root[j]
                if r is None:
                    last[j] = i
                else:
                    for x in r:
                        last[x] = i
            if rec[5]:  # a view: its results alias the inputs' storage
                shared = tuple(dict.fromkeys(x for j in js for x in (root[j] or (j,))))
                for v, t in zip(instr.outputs, outs, strict=True):
                    if v.type is not None and v.type != t:
                        return None
                    num[v] = k
                    types[k] = t
                    root[k] = shared
                    k += 1
                continue
            for v, t, by_gpu in zip(instr.outputs, outs, rec[6], strict=True):
                if v.type is not None and v.type != t:
                    return None
                num[v] = k
                types[k] = t
                last[k] = i
                owned[k] = by_gpu
                k += 1
    except ValueError:  # a result count that differs from the op's: the general path reports it
        return None
    finally:
        dom._frames.pop()
    out_refs = [root[num[v]] or (num[v],) for v in fn.outputs]
    out_roots_all = [x for rs in out_refs for x in rs]
    internal_last = {x: last[x] for x in out_roots_all}
    for x in out_roots_all:
        last[x] = n
    frees: list[GpuBytes | None] = [None] * n
    for j in range(n_params, n_values):
        mine = owned[j]
        if mine is None:
            continue
        end = last[j]
        if end < n:
            pending = frees[end]
            if pending is None:
                frees[end] = list(mine)
            else:
                pending.extend(mine)
    bumps = [rec[8] for rec in records]
    for i in depends:
        first = body[i].inputs[0]
        rs = root[num[first]] or (num[first],)
        if len(rs) == 1 and owned[rs[0]] is not None and last[rs[0]] == i:
            bumps[i] = records[i][9]  # type: ignore[assignment]
    mem: list[MemEvents | None] = [
        (bump, rec[7], tuple(freed) if freed else ()) if (rec[7] or freed) else None
        for rec, bump, freed in zip(records, bumps, frees, strict=True)
    ]
    fresh_index: dict[int, int] = {}
    fresh: list[tuple[tuple[tuple[int, float], ...], int]] = []
    out_roots: list[tuple[int, ...]] = []
    for rs in out_refs:
        refs_of: list[int] = []
        for x in rs:
            if x < n_params:
                refs_of.append(x)
                continue
            buf = owned[x]
            if buf is not None:
                if x not in fresh_index:
                    fresh_index[x] = len(fresh)
                    fresh.append((tuple(buf), internal_last[x]))
                refs_of.append(-1 - fresh_index[x])
        out_roots.append(tuple(dict.fromkeys(refs_of)))
    if records:
        devs, costs, comm, names, flops = (list(c) for c in list(zip(*records, strict=True))[:5])
    else:
        devs, costs, comm, names, flops = [], [], [], [], []
    slots = tuple(sorted({s for ds in set(devs) for s in ds}))
    param_last = tuple(internal_last.get(j, last[j]) for j in range(n_params))
    out_types = tuple(types[num[v]] for v in fn.outputs)
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
    )
