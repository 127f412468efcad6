"""Compile a function into a flat plan the simulator loop can run, summarizing calls.

A plan holds, per instruction of one function body: the slots it runs on (precomputed tuples of
slot indices), its cost (seconds, or a ``CallSummary``), whether it communicates, and its memory
events. Plans are built by an abstract interpreter domain (``PlanDomain``) layered on the mixed
type domain: each op's types, devices and cost are computed once per (op, attributes, input
types) and reused.

**Call summaries.** Under DistIR's semantics a function body maps the clocks of its devices at
entry to their clocks at exit by a max-plus linear map: ``out[v] = max_u (in[u] + delay[u][v])``.
A callee is compiled and summarized once per (function, argument types) — its delay matrix, the
first-start matrix (for traces), busy/communication time per slot, FLOPs and peak extra memory per
GPU — and every call site applies the summary in O(k²) for k devices, so repeated layers,
stages and microbatch steps cost what their call sites cost.

**Memory.** A value is live from the op that creates it to its last use in the function (results
of the function stay live). View ops (those that write no bytes: Reshape, Unsqueeze, tuples)
alias their inputs instead of allocating. Parameters belong to the caller.

**DTensor programs** are planned directly (``distir.sim.spmd``): an op on distributed tensors
runs on all devices of its mesh. The plan's "slots" are then *units* of devices that always move
together and its "GPUs" memory figures of GPUs that hold alike (``distir.sim.units``);
``PlanDomain.units`` says which real slots and GPUs they stand for.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from distir.interp.loop import interpret
from distir.interp.shapes import Concrete, Mixed, TypeDomain, check_arguments, check_declared, type_of
from distir.ir.dtensor import DTensorType
from distir.ir.function import Function, Module
from distir.ir.ops import Call, Op
from distir.ir.types import Device, TupleType, Type
from distir.ir.values import Value
from distir.ops.registry import REGISTRY, OpKind, OpTypeError
from distir.sim import spmd
from distir.sim.cost import CostModel
from distir.sim.devices import DeviceMap
from distir.sim.flatplan import plan_flat
from distir.sim.units import Units, has_dtensor, leaves

NEG_INF = float("-inf")
# a storage root: a value (a parameter or an op's fresh result) or a call's fresh buffer, named
# by (the call's index in the body, the buffer's index in the callee's summary)
Root = Value | tuple[int, int]


@dataclass(slots=True)
class CallSummary:
    name: str
    slots: tuple[int, ...]
    delay: list[list[float]]  # [u][v] over positions in ``slots``
    first: list[list[float]]  # [u][v]: when v's first op starts, relative to u's clock at entry
    busy: list[float]  # compute seconds per position in ``slots``
    comm: list[float]  # communication seconds per position
    flops: float
    peak_extra: dict[int, float]  # gpu -> bytes above the caller's live set at the call
    # per result, the storage it uses: j >= 0 is parameter j, -1-k is the body's fresh buffer k
    out_roots: tuple[tuple[int, ...], ...]
    # per fresh buffer returned: its bytes per GPU and its last use inside the body (-1: none)
    fresh: tuple[tuple[tuple[tuple[int, float], ...], int], ...]
    n_ops: int
    # memory profile: per GPU, (instruction index, owned live bytes at its peak) in body order
    profile: dict[int, list[tuple[int, float]]]
    # per parameter: its last use in the body, not counting the return (-1: none)
    param_last: tuple[int, ...]
    _extra_memo: dict[Any, tuple[tuple[int, float], ...]] = field(default_factory=dict, repr=False)

    def extra_with_dying(
        self,
        dying: list[tuple[int, int, float]],
        dead: list[tuple[int, int, float]] = (),  # type: ignore[assignment]
    ) -> tuple[tuple[int, float], ...]:
        """Peak bumps per GPU above a caller live set that includes the ``dying`` arguments
        (``(last use inside the body, gpu, bytes)``, freed after the call), for a call whose
        returned fresh buffers ``dead`` (same form) the caller never uses: while the body runs an
        argument counts until its last use inside and a dead result from its last use inside on
        no more — exactly as if the call were inlined."""
        if not dying and not dead:
            return tuple(self.peak_extra.items())
        key = (tuple(dying), tuple(dead))  # call sites of one summary repeat (microbatches)
        hit = self._extra_memo.get(key)
        if hit is None:
            hit = self._extra_memo[key] = self._extra(dying, dead)
        return hit

    def _extra(
        self, dying: list[tuple[int, int, float]], dead: list[tuple[int, int, float]]
    ) -> tuple[tuple[int, float], ...]:
        out = dict(self.peak_extra)
        by_gpu: dict[int, tuple[list[tuple[int, float]], list[tuple[int, float]]]] = {}
        for last, g, b in dying:
            by_gpu.setdefault(g, ([], []))[0].append((last, b))
        for last, g, b in dead:
            by_gpu.setdefault(g, ([], []))[1].append((last, b))
        for g, (mine, gone) in by_gpu.items():
            prof = self.profile.get(g)
            if prof:
                # sorted last uses with prefix sums: bytes still live / already gone at each point
                mine.sort()
                gone.sort()
                m_last = [x for x, _ in mine]
                g_last = [x for x, _ in gone]
                m_pre = list(accumulate((b for _, b in mine), initial=0.0))
                g_pre = list(accumulate((b for _, b in gone), initial=0.0))
                total = m_pre[-1]
                out[g] = (
                    max(
                        val + (total - m_pre[bisect_left(m_last, i)]) - g_pre[bisect_left(g_last, i)]
                        for i, val in prof
                    )
                    - total
                )
        return tuple(out.items())


# per-op record: (devs, cost, is_comm, name, flops, view, bytes per GPU of each result, ...)
OpRecord = tuple[
    tuple[int, ...],  # 0 slots
    float,  # 1 seconds
    bool,  # 2 communicates
    str,  # 3 name
    float,  # 4 FLOPs
    bool,  # 5 a view (allocates nothing)
    tuple[list[tuple[int, float]], ...],  # 6 bytes per GPU of each result
    tuple[tuple[int, float], ...],  # 7 all allocations (empty for a view)
    tuple[tuple[int, float], ...],  # 8 the same summed per GPU: the op's peak bump
    # 9 the peak bump when the op's first input dies at it (a multi-step Redistribute frees its
    # source after the first step), or None: the same as 8
    tuple[tuple[int, float], ...] | None,
]
# per-instruction memory: (peak bumps, allocations, frees), each a tuple of (gpu, bytes)
MemEvents = tuple[tuple[tuple[int, float], ...], tuple[tuple[int, float], ...], tuple[tuple[int, float], ...]]


@dataclass(slots=True)
class FnPlan:
    fn: Function
    devs: list[tuple[int, ...]]
    costs: list[float | CallSummary]
    comm: list[bool]
    names: list[str]
    flops: list[float]
    mem: list[MemEvents | None]
    slots: tuple[int, ...]
    out_roots: tuple[tuple[int, ...], ...]
    fresh: tuple[tuple[tuple[tuple[int, float], ...], int], ...]
    out_types: tuple[Type, ...]
    param_last: tuple[int, ...]
    out_values: tuple[Mixed, ...] = ()  # the results, with any known (concrete) values


class PlanDomain(TypeDomain):
    """Type propagation that also records, per op, where it runs and what it costs."""

    def __init__(self, module: Module, dmap: DeviceMap, cost: CostModel, *, fast_path: bool = True) -> None:
        super().__init__()
        self.fast_path = fast_path  # plan bodies of primitive ops in one pass (``flatplan``)
        self.module = module
        self.dmap = dmap
        self.cost = cost
        # clocks and memory figures: slots and GPUs, or units of a DTensor program
        self.units = Units(dmap, cost)
        self._memo: dict[tuple[Any, ...], tuple[tuple[Type, ...], OpRecord]] = {}
        self._frames: list[list[OpRecord | CallSummary]] = []
        self._summaries: dict[tuple[str, tuple[Type, ...]], tuple[CallSummary, tuple[Mixed, ...]]] = {}
        # (callee, ids of the argument types) -> (summary and results, the argument types, pinned)
        self._summary_ids: dict[
            tuple[Any, ...], tuple[tuple[CallSummary, tuple[Mixed, ...]], tuple[Type, ...]]
        ] = {}

    @property
    def dev_slot(self) -> dict[Device, int]:
        """Program device -> the plan's clock (a slot, or a unit of a DTensor program)."""
        return self.units.dev_slot

    @property
    def slot_gpu(self) -> list[int]:
        """The plan's clock -> its memory figure (a GPU, or the unit itself)."""
        return self.units.slot_gpu

    # -- ops -------------------------------------------------------------------------------------
    def op(self, op: Op, args: Sequence[Mixed]) -> Sequence[Mixed]:
        # the hot path: an op seen before with the same attributes and input types
        key = (op.name, op.attrs, *args)
        hit = self._memo.get(key) if Concrete not in map(type, args) else None
        if hit is not None:
            outs, rec = hit
            for v in op.outputs:
                if v.type is not None:
                    check_declared(op.outputs, outs, op.name)
                    break
            self._frames[-1].append(rec)
            return outs
        result = super().op(op, args)
        ins = [type_of(a) for a in args]
        out_types = tuple(type_of(o) for o in result)
        rec = self._record(op, ins, out_types)
        if Concrete not in map(type, (*args, *result)):
            self._memo[key] = (out_types, rec)
        self._frames[-1].append(rec)
        return result

    def _slots_of(self, types: Sequence[Type]) -> list[int]:
        out: list[int] = []
        for t in types:
            for e in t.elements if isinstance(t, TupleType) else (t,):
                if isinstance(e, TupleType):
                    out.extend(self._slots_of([e]))
                    continue
                if isinstance(e, DTensorType):
                    out.extend(u for u, *_ in self.units.mesh_units(e.mesh))
                    continue
                try:
                    out.append(self.dev_slot[e.device])
                except KeyError:
                    raise OpTypeError(f"device {e.device} is not mapped onto the cluster") from None
        return out

    def _record(self, op: Op, ins: Sequence[Type], outs: Sequence[Type]) -> OpRecord:
        d = REGISTRY[op.name]
        if d.kind is OpKind.RANK_COMM:
            raise OpTypeError(f"{op.name} belongs in a per-rank program; simulate the global program")
        if any(has_dtensor(t) for t in (*ins, *outs)):
            return spmd.record(self.units, op, d, ins, outs)
        devs = tuple(sorted(set(self._slots_of([*ins, *outs]))))
        if d.kind is OpKind.COMM:
            assert d.comm_cost is not None
            desc = d.comm_cost(ins, outs, op.attrs)
            gpus = [self.units.dev_gpu[x] for x in desc.devices]
            seconds = float(self.cost.comm_time(desc, gpus))
            return (devs, seconds, True, op.name, 0.0, False, *self.units.sizes(outs, False), None)
        gpu = self._first_gpu(ins, outs, op) if devs else 0
        seconds = float(self.cost.compute_time(d, ins, outs, op.attrs, gpu)) if devs else 0.0
        view = bool(ins) and d.bytes_written(ins, outs, op.attrs) == 0
        flops = d.flops(ins, outs, op.attrs)
        return (devs, seconds, False, op.name, flops, view, *self.units.sizes(outs, view), None)

    def _first_gpu(self, ins: Sequence[Type], outs: Sequence[Type], op: Op) -> int:
        """The real GPU a local op runs on (its first value's device)."""
        for t in (*ins, *outs):
            for e in leaves(t):
                return self.units.dev_gpu[e.device]
        a = op.attrs.get("device")
        return self.units.dev_gpu[a] if isinstance(a, Device) else 0

    # -- calls -----------------------------------------------------------------------------------
    def call(self, module: Module, call: Call, callee: Function, args: Sequence[Mixed]) -> Sequence[Mixed]:
        abstract = Concrete not in map(type, args)
        # the hot path: a call site seen before with the very same type objects, keyed by
        # identity (no type hashed); the entry pins the types, so their ids stay valid
        id_key = (callee.name, *map(id, args)) if abstract else None
        pinned = self._summary_ids.get(id_key) if id_key is not None else None
        if pinned is not None:
            hit = pinned[0]
        else:
            types = tuple(type_of(a) for a in args)
            key = (callee.name, types)
            found = self._summaries.get(key) if abstract else None
            if found is None:
                check_arguments(callee, types)
                plan = self.plan(callee, args)
                found = (summarize(plan, self.slot_gpu), plan.out_values)
                if abstract:
                    self._summaries[key] = found
            hit = found
            if id_key is not None:
                self._summary_ids[id_key] = (hit, types)
        check_declared(call.outputs, hit[1], "@" + callee.name)
        self._frames[-1].append(hit[0])
        return hit[1]

    def plan(self, fn: Function, args: Sequence[Mixed]) -> FnPlan:
        if not self.units.prepared and not self._frames:
            self.units.prepare(self.module, fn, args)
        fast = plan_flat(self, fn, args) if self.fast_path else None
        if fast is not None:
            return fast
        self._frames.append([])
        try:
            try:
                outs, env = self._walk(fn, args)
            except Exception:
                self._frames[-1] = []
                outs, env = interpret(self.module, fn, args, self)
        finally:
            records = self._frames.pop()
        plan = build_plan(fn, env, records, tuple(type_of(o) for o in outs), self.dev_slot, self.slot_gpu)
        plan.out_values = tuple(outs)
        return plan

    def _walk(self, fn: Function, args: Sequence[Mixed]) -> tuple[tuple[Mixed, ...], dict[Value, Mixed]]:
        """``interpret`` specialized for planning: the same semantics, with the memo lookup of
        already-seen ops inlined (the hot path of simulating a long flat program). Any failure
        is re-run through ``interpret`` by the caller, which reports it precisely."""
        env: dict[Value, Mixed] = dict(zip(fn.params, args, strict=True))
        memo_get = self._memo.get
        frame = self._frames[-1]
        append = frame.append
        module = self.module
        outs: Sequence[Mixed]
        for instr in fn.body:
            ins = [env[v] for v in instr.inputs]
            if type(instr) is Op:
                hit = memo_get((instr.name, instr.attrs, *ins)) if Concrete not in map(type, ins) else None
                if hit is not None:
                    outs, rec = hit
                    for v in instr.outputs:
                        if v.type is not None:
                            check_declared(instr.outputs, outs, instr.name)
                            break
                    append(rec)
                else:
                    outs = self.op(instr, ins)
            else:
                assert isinstance(instr, Call)
                outs = self.call(module, instr, module[instr.callee], ins)
            if len(outs) != len(instr.outputs):
                raise OpTypeError("result count mismatch")
            for v, o in zip(instr.outputs, outs, strict=True):
                env[v] = o
        return tuple(env[v] for v in fn.outputs), env


def build_plan(
    fn: Function,
    env: dict[Value, Mixed],
    records: list[OpRecord | CallSummary],
    out_types: tuple[Type, ...],
    dev_slot: dict[Any, int],
    slot_gpu: list[int],
) -> FnPlan:
    """Arrange the records of one interpreted body into a plan, with liveness-based memory."""
    n = len(fn.body)
    assert len(records) == n
    # a value's storage roots: itself when absent (a fresh result or a parameter), else the
    # values whose storage it views
    roots: dict[Value, tuple[Root, ...]] = {}
    owned: dict[Root, Sequence[tuple[int, float]]] = {}  # root -> bytes per GPU
    last: dict[Root, int] = {}
    calls: list[int] = []
    get_roots = roots.get
    call_roots: dict[int, dict[int, Root]] = {}  # call index -> fresh buffer k -> its root here
    call_allocs: dict[int, list[tuple[int, float]]] = {}
    for i, (instr, rec) in enumerate(zip(fn.body, records, strict=True)):
        if type(rec) is tuple:  # the hot path: a primitive op
            for v in instr.inputs:
                rs = get_roots(v)
                if rs is None:
                    last[v] = i
                else:
                    for r in rs:
                        last[r] = i
            if rec[5]:  # a view
                shared = tuple({r: None for v in instr.inputs for r in get_roots(v) or (v,)})
                for o in instr.outputs:
                    roots[o] = shared
                continue
            for o, by_gpu in zip(instr.outputs, rec[6], strict=True):
                owned[o] = by_gpu
                last[o] = i
            continue
        assert isinstance(rec, CallSummary)
        for v, pl in zip(instr.inputs, rec.param_last, strict=True):
            if pl < 0:
                continue  # the callee never reads it (a returned alias extends it where used)
            rs = get_roots(v)
            if rs is None:
                last[v] = i
            else:
                for r in rs:
                    last[r] = i
        calls.append(i)
        mine: dict[int, Root] = call_roots.setdefault(i, {})
        allocs: list[tuple[int, float]] = call_allocs.setdefault(i, [])
        for o, out_refs in zip(instr.outputs, rec.out_roots, strict=True):
            if len(out_refs) == 1 and out_refs[0] < 0 and -1 - out_refs[0] not in mine:
                # the common case: a result that is a fresh buffer of its own
                k = -1 - out_refs[0]
                buf = mine[k] = (i, k)  # a buffer is named by its call and index
                owned[buf] = rec.fresh[k][0]
                allocs.extend(rec.fresh[k][0])
                last[buf] = i
                roots[o] = (buf,)
                continue
            uses_of: dict[Root, None] = {}
            for ref in out_refs:
                if ref >= 0:
                    arg = instr.inputs[ref]
                    uses_of.update(dict.fromkeys(get_roots(arg) or (arg,)))
                    continue
                k = -1 - ref
                b = mine.get(k)
                if b is None:  # one buffer, however many results use it
                    b = mine[k] = (i, k)
                    owned[b] = rec.fresh[k][0]
                    allocs.extend(rec.fresh[k][0])
                    last[b] = i
                uses_of[b] = None
            roots[o] = tuple(uses_of)
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
    out_root_list = [r for v in fn.outputs for r in get_roots(v) or (v,)]
    # last uses not counting the return, where a summary needs them (parameters, results)
    internal_last = {r: last.get(r, -1) for r in (*fn.params, *out_root_list)}
    for r in out_root_list:
        last[r] = n
    frees: dict[int, list[tuple[int, float]]] = {}
    for r, gb in owned.items():
        end = last[r]
        if end < n:
            pending = frees.get(end)
            if pending is None:
                frees[end] = list(gb)
            else:
                pending.extend(gb)
    mem: list[MemEvents | None] = [None] * n
    for i, rec in enumerate(records):
        freed = frees.get(i)
        if type(rec) is tuple and (rec[7] or freed):
            bump = rec[8]
            if rec[9] is not None:  # a bump that depends on whether the first input dies here
                rs = get_roots(fn.body[i].inputs[0]) or (fn.body[i].inputs[0],)
                if len(rs) == 1 and rs[0] in owned and last[rs[0]] == i:
                    bump = rec[9]
            mem[i] = (bump, rec[7], tuple(freed) if freed else ())
    if calls:
        dying_at: dict[int, list[Root]] = {}
        for r, end in last.items():
            if r in owned and end < n:
                dying_at.setdefault(end, []).append(r)
        for i in calls:
            c = costs[i]
            assert isinstance(c, CallSummary)
            dies = dying_at.get(i)
            if not dies:
                pk = tuple(c.peak_extra.items())
            else:
                instr = fn.body[i]
                # one pass over the arguments: the last use inside of each root passed in
                last_use: dict[Root, int] = {}
                for v, pl in zip(instr.inputs, c.param_last, strict=True):
                    for r in get_roots(v) or (v,):
                        if last_use.get(r, -(1 << 62)) < pl:
                            last_use[r] = pl
                # a result nobody uses (a buffer this call made) is gone after its last use inside
                dead = [
                    (c.fresh[r[1]][1], g, b)
                    for r in dies
                    if type(r) is tuple and r[0] == i
                    for g, b in owned[r]
                ]
                dying = [
                    (u, g, b)
                    for r in dies
                    if not (type(r) is tuple and r[0] == i) and last_use.get(r, -1) >= 0
                    for u in (last_use[r],)
                    for g, b in owned[r]
                ]
                pk = c.extra_with_dying(dying, dead)
            al = tuple(call_allocs.get(i, ()))
            fr = tuple(frees.get(i, ()))
            mem[i] = (pk, al, fr) if (pk or al or fr) else None
    param_index = {p: j for j, p in enumerate(fn.params)}
    fresh_index: dict[Root, int] = {}
    fresh: list[tuple[tuple[tuple[int, float], ...], int]] = []
    out_roots: list[tuple[int, ...]] = []
    for v in fn.outputs:
        refs_of: list[int] = []
        for r in get_roots(v) or (v,):
            if r in param_index:
                refs_of.append(param_index[r])
            elif r in owned:
                if r not in fresh_index:
                    fresh_index[r] = len(fresh)
                    fresh.append((tuple(owned[r]), internal_last.get(r, -1)))
                refs_of.append(-1 - fresh_index[r])
        out_roots.append(tuple(dict.fromkeys(refs_of)))
    slots = tuple(sorted({s for ds in devs for s in ds}))
    param_last = tuple(internal_last.get(p, -1) for p in fn.params)
    return FnPlan(
        fn, devs, costs, comm, names, flops, mem, slots, tuple(out_roots), tuple(fresh), out_types, param_last
    )


def summarize(plan: FnPlan, slot_gpu: list[int]) -> CallSummary:
    """Run a plan symbolically (max-plus over its slots) into a call summary."""
    slots = plan.slots
    k = len(slots)
    pos = {s: j for j, s in enumerate(slots)}
    # clock[v] is a vector over entry clocks u: the max-plus form of v's current clock
    clock = [[0.0 if u == v else NEG_INF for u in range(k)] for v in range(k)]
    first: list[list[float] | None] = [None] * k
    busy = [0.0] * k
    comm_t = [0.0] * k
    for ds, c, is_comm in zip(plan.devs, plan.costs, plan.comm, strict=True):
        idx = [pos[s] for s in ds]
        if isinstance(c, CallSummary):
            sub = [pos[s] for s in c.slots]
            ins = [clock[j] for j in sub]
            for b, j in enumerate(sub):
                if first[j] is None:
                    first[j] = [max(ins[a][u] + c.first[a][b] for a in range(len(sub))) for u in range(k)]
                busy[j] += c.busy[b]
                comm_t[j] += c.comm[b]
            new = [
                [max(ins[a][u] + c.delay[a][b] for a in range(len(sub))) for u in range(k)]
                for b in range(len(sub))
            ]
            for b, j in enumerate(sub):
                clock[j] = new[b]
            continue
        if not idx:
            continue
        start = [max(clock[j][u] for j in idx) for u in range(k)]
        end = [x + c for x in start]
        for j in idx:
            if first[j] is None:
                first[j] = start
            clock[j] = end
            if is_comm:
                comm_t[j] += c
            else:
                busy[j] += c
    delay = [[clock[v][u] for v in range(k)] for u in range(k)]
    first_m = [[(first[v] or clock[v])[u] for v in range(k)] for u in range(k)]
    # memory: live bytes owned by this body, per GPU, from zero
    live: dict[int, float] = {}
    peak: dict[int, float] = {}
    profile: dict[int, list[tuple[int, float]]] = {}
    for i, ev in enumerate(plan.mem):
        if ev is None:
            continue
        pk, al, fr = ev
        for g, nb in pk:
            val = live.get(g, 0.0) + nb
            profile.setdefault(g, []).append((i, val))
            if val > peak.get(g, 0.0):
                peak[g] = val
        for g, nb in al:
            live[g] = live.get(g, 0.0) + nb
        for g, nb in fr:
            live[g] = live.get(g, 0.0) - nb
    n_ops = sum(c.n_ops if isinstance(c, CallSummary) else 1 for c in plan.costs)
    return CallSummary(
        plan.fn.name,
        slots,
        delay,
        first_m,
        busy,
        comm_t,
        sum(plan.flops),
        peak,
        plan.out_roots,
        plan.fresh,
        n_ops,
        profile,
        plan.param_last,
    )
