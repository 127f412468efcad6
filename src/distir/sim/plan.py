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
stages and microbatch steps cost what their call sites cost. A callee met on another mesh alike
(the next pipeline stage's) takes the summary it had on the first, renamed onto the new mesh's
clocks and memory figures, when that is exactly what planning it there would give
(``distir.sim.relabel``; ``relabel=False`` plans every call).

**Memory.** A value is live from the op that creates it to its last use in the function (results
of the function stay live; a summary places last uses and its memory profile by position in the
callee's inlined op order, so an argument dying inside a nested call is freed there); the
entry's donated parameters (``Function.donated``) likewise, from the start. View ops (those that
write no bytes: Reshape, Unsqueeze, tuples) alias their inputs instead of allocating. Parameters
belong to the caller.

**DTensor programs** are planned directly (``distir.sim.spmd``): an op on distributed tensors
runs on all devices of its mesh. The plan's "slots" are then *units* of devices that always move
together and its "GPUs" memory figures of GPUs that hold alike (``distir.sim.units``);
``PlanDomain.units`` says which real slots and GPUs they stand for. They are made either by
``Units.prepare``'s type pass over the whole program before planning, or (``assume_units``, as
``simulate`` does) assumed from the entry's types and confirmed after planning by the types the
planner met (``Units.confirm``): the planner then infers the types itself, and the program is
walked once instead of twice.

The plan's data (op records, ``CallSummary``, ``FnPlan``) live in ``distir.sim.records``; the
liveness pass that arranges a walked body into a plan, ``build_plan``, in ``distir.sim.liveness``;
an op's record, ``op_record``, in ``distir.sim.oprecord``. ``distir.sim.reference`` computes the
same figures plainly (no memo, summary or unit): it is the specification this module is held to.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from distir.interp.loop import interpret, walk_unchecked
from distir.interp.shapes import Concrete, Mixed, TypeDomain, check_arguments, check_declared, type_of
from distir.ir.function import Function, Module
from distir.ir.ops import Call, Op
from distir.ir.types import Device, Type
from distir.ir.values import Value
from distir.ops.registry import OpTypeError
from distir.sim import overlap
from distir.sim.cost import CostModel, epilogues, fuses
from distir.sim.devices import DeviceMap
from distir.sim.flatplan import plan_flat
from distir.sim.fusion import FusedInput, fused_links
from distir.sim.liveness import build_plan
from distir.sim.oprecord import op_record
from distir.sim.records import NEG_INF, CallSummary, FnPlan, Gift, MemEvents, OpRecord, Root
from distir.sim.relabel import Relabeler
from distir.sim.summaries import summarize
from distir.sim.units import Units

__all__ = [
    "NEG_INF",
    "PROGRAM_ERRORS",
    "REFERENCE",
    "CallSummary",
    "FnPlan",
    "MemEvents",
    "OpRecord",
    "PlanDomain",
    "PlanOptions",
    "Root",
    "SharedRecord",
    "build_plan",
    "summarize",
]


_Summarized = tuple[CallSummary, tuple[Mixed, ...], Any]
# an op's result types, record and the types its making noted (``PlanDomain.shared_records``)
SharedRecord = tuple[tuple[Type, ...], OpRecord, tuple[Type, ...]]

# what planning a wrong program raises (every error of distir's about a program is a ValueError:
# ``OpTypeError``, ``IRTypeError``, ``InterpretError``, ``ModuleError``, ...); anything else is a
# bug in the planner and is never caught
PROGRAM_ERRORS: tuple[type[Exception], ...] = (ValueError,)


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """How a ``PlanDomain`` plans: the fast paths it takes and what its entry's plan keeps.

    Every fast path gives the plan the reference gives, bit for bit (``REFERENCE``: all of them
    off; ``tests/sim/test_fast_paths.py`` compares each against it), and the figures of the
    reference planner (``distir.sim.reference``, the semantics written plainly;
    ``tests/sim/test_reference_planner.py``)."""

    # plan bodies of primitive ops in one pass (``distir.sim.flatplan``) instead of the
    # interpreter's walk followed by ``build_plan``; walk bodies with calls with an op memo keyed
    # by identity (``PlanDomain._walk_by_ids``)
    fast_path: bool = True
    # carry a callee's summary to another mesh alike instead of planning it again there
    # (``distir.sim.relabel``)
    relabel: bool = True
    # group a DTensor program's devices into units from the entry's types (``Units.assume``;
    # ``units.confirm()`` checks it after planning) instead of ``Units.prepare``'s type pass
    assume_units: bool = False
    # False: the plan of the function planned first (the entry) is only run, never summarized,
    # so its parameters' liveness is not tracked (``build_plan``'s ``param_uses``) but for the
    # parameters it owns (``Function.donated``: freed after their last use). Not a fast path: a
    # mode (True: a plan to summarize, as a callee's is)
    entry_param_uses: bool = True
    # the entry is run untraced: a flat entry keeps its memory events as columns
    entry_memory_columns: bool = False
    # keep each callee's plan in its summary (``CallSummary.body``: a detailed trace)
    keep_bodies: bool = False


# every fast path off: the interpreter's walk, ``build_plan``'s liveness, every call planned on
# its own mesh, the types grouped into units before planning (still this module's summarizing
# planner; the semantics it computes are ``distir.sim.reference``'s)
REFERENCE = PlanOptions(fast_path=False, relabel=False, entry_param_uses=False)


def _moved_nothing(done: Sequence[OpRecord | CallSummary]) -> Callable[[int], bool]:
    """Whether the op at a position of the frame planned so far (``done``) moved nothing: its
    record is a view (``FusedInput.resolved``)."""

    def view(i: int) -> bool:
        rec = done[i] if i < len(done) else None
        return isinstance(rec, OpRecord) and rec.view

    return view


class PlanDomain(TypeDomain):
    """Type propagation that also records, per op, where it runs and what it costs."""

    def __init__(
        self, module: Module, dmap: DeviceMap, cost: CostModel, options: PlanOptions = PlanOptions()
    ) -> None:
        super().__init__()
        self.options = options
        self.module = module
        self.dmap = dmap
        self.cost = cost
        # clocks and memory figures: slots and GPUs, or units of a DTensor program
        self.units = Units(dmap, cost)
        self._relabel = Relabeler(self.units)
        self._memo: dict[tuple[Any, ...], tuple[tuple[Type, ...], OpRecord]] = {}
        # records another domain of the same device map, cost model and units made, with the
        # types their making noted (``SharedRecords``); this domain's new ones, likewise, while
        # ``noted`` is not None
        self.shared_records: Mapping[tuple[Any, ...], SharedRecord] | None = None
        self.noted: dict[tuple[Any, ...], tuple[Type, ...]] | None = None
        self.adopted = 0  # records taken from ``shared_records`` (for tests)
        self._frames: list[list[OpRecord | CallSummary]] = []
        # (callee, argument types) -> (summary, results, mesh-free key and mesh or None: the call
        # in ``distir.sim.relabel``'s terms)
        self._summaries: dict[tuple[str, tuple[Type, ...]], _Summarized] = {}
        # (callee, ids of the argument types) -> (the same, the argument types, pinned)
        self._summary_ids: dict[tuple[Any, ...], tuple[_Summarized, tuple[Type, ...]]] = {}
        # fused elementwise chains (``distir.sim.fusion``), when the cost model fuses: per
        # function (by id, kept alive) its links; the link of the op ``op`` plans next (set by
        # the caller that knows the op's position); the links of general-path bodies by op id
        self.fuse = fuses(cost)
        self.epilogues = epilogues(cost)  # a GEMM may head a chain
        self._fusion: dict[int, tuple[Function, list[FusedInput | None] | None]] = {}
        self.pending_link: FusedInput | None = None
        self._link_by_id: dict[int, FusedInput] = {}
        # tensor-parallel collectives pipelined with their GEMMs (``distir.sim.overlap``), when
        # the cost model says the trainer overlaps them: per function (by id, kept alive) its pairs
        # the tensor-parallel overlap the cost model charges (``distir.sim.overlap``), or None
        self.tp_form = overlap.form_of(cost)
        self._pairs: dict[int, tuple[Function, list[overlap.Candidates | None] | None]] = {}

    @property
    def dev_slot(self) -> dict[Device, int]:
        """Program device -> the plan's clock (a slot, or a unit of a DTensor program)."""
        return self.units.dev_slot

    @property
    def slot_gpu(self) -> list[int]:
        """The plan's clock -> its memory figure (a GPU, or the unit itself)."""
        return self.units.slot_gpu

    def fusion_of(self, fn: Function) -> list[FusedInput | None] | None:
        """``fn``'s fused links per instruction (``distir.sim.fusion``), or None when the cost
        model does not fuse or nothing in ``fn`` joins a kernel."""
        if not self.fuse:
            return None
        got = self._fusion.get(id(fn))
        if got is None or got[0] is not fn:
            # calls never fuse: a body of calls only (a probe's entry) has no link
            links = fused_links(fn, self.epilogues) if Op in set(map(type, fn.body)) else []
            got = self._fusion[id(fn)] = (fn, links if any(links) else None)
        return got[1]

    def overlap_pairs(self, fn: Function) -> list[overlap.Candidates | None] | None:
        """``fn``'s candidate (collective, GEMM) pairs per instruction (``distir.sim.overlap``),
        or None when the cost model does not overlap them or ``fn`` has none."""
        if self.tp_form is None:
            return None
        got = self._pairs.get(id(fn))
        if got is None or got[0] is not fn:
            found = overlap.pairs(fn)
            got = self._pairs[id(fn)] = (fn, found if any(c is not None for c in found) else None)
        return got[1]

    # -- ops -------------------------------------------------------------------------------------
    def op(self, op: Op, args: Sequence[Mixed]) -> Sequence[Mixed]:
        link = self.pending_link
        if link is not None:
            self.pending_link = None
        elif self._link_by_id:
            link = self._link_by_id.get(id(op))
            if link is not None and (link.via >= 0 or link.unless):  # as the Redistributes moved
                link = link.resolved(_moved_nothing(self._frames[-1]))
        # the hot path: an op seen before with the same attributes and input types (and link)
        base = (op.name, op.attrs, *args)
        key = base if link is None else (*base, link)
        hit = self._memo.get(key) if Concrete not in map(type, args) else None
        if hit is not None:
            outs, rec = hit
            for v in op.outputs:
                if v.type is not None:
                    check_declared(op.outputs, outs, op.name)
                    break
            self._frames[-1].append(rec)
            return outs
        if self.shared_records is not None and Concrete not in map(type, args):
            shared = self.shared_records.get(key)
            if shared is not None:  # made by another domain alike: as if made here
                return self._adopt(op, key, shared)
        known = self.units.op_types.get(base) if Concrete not in map(type, args) else None
        if known is not None:  # types inferred by ``Units.prepare``: the same domain, so the same
            check_declared(op.outputs, known, op.name)
            result = known
        else:
            result = super().op(op, args)
        ins = [type_of(a) for a in args]
        out_types = tuple(type_of(o) for o in result)
        if self.noted is not None:
            self.units.captured = []
        for t in out_types:  # under ``Units.assume``: every type met (its inputs were results)
            self.units.note(t)
        rec = op_record(self.units, op, ins, out_types, link)
        captured, self.units.captured = self.units.captured, None
        if Concrete not in map(type, (*args, *result)):
            self._memo[key] = (out_types, rec)
            if self.noted is not None and captured is not None:
                self.noted[key] = tuple(captured)
        self._frames[-1].append(rec)
        return result

    def _adopt(self, op: Op, key: tuple[Any, ...], shared: SharedRecord) -> Sequence[Mixed]:
        """``op``'s record and result types from ``shared_records``: what planning it here gives
        (the same op, attributes, input types and link on the same device map, cost model and
        units), the types its making noted noted here too."""
        outs, rec, noted = shared
        for v in op.outputs:
            if v.type is not None:
                check_declared(op.outputs, outs, op.name)
                break
        for t in noted:
            self.units.note(t)
        self._memo[key] = (outs, rec)
        self.adopted += 1
        self._frames[-1].append(rec)
        return outs

    def take_new_records(self) -> list[tuple[tuple[Any, ...], SharedRecord]]:
        """The records this domain made itself since the last call (with ``noted`` set), each
        with the types its making noted, for ``SharedRecords``."""
        if not self.noted:
            return []
        memo = self._memo
        out = [(key, (*memo[key], noted)) for key, noted in self.noted.items()]
        self.noted.clear()
        return out

    # -- calls -----------------------------------------------------------------------------------
    def call(self, module: Module, call: Call, callee: Function, args: Sequence[Mixed]) -> Sequence[Mixed]:
        # the hot path: a call site seen before with the very same type objects, keyed by
        # identity (no type hashed); the entry pins the types, so their ids stay valid. Only
        # abstract arguments are entered and a live object's id is its own: arguments with a
        # Concrete value never match, so no scan for one comes first.
        id_key = (callee.name, *map(id, args))
        pinned = self._summary_ids.get(id_key)
        if pinned is not None:
            hit = pinned[0]
        else:
            abstract = Concrete not in map(type, args)
            types = tuple(type_of(a) for a in args)
            key = (callee.name, types)
            found = self._summaries.get(key) if abstract else None
            if found is None:
                check_arguments(callee, types)
                alike = self._relabel.key(callee, types) if abstract and self.options.relabel else None
                carried = self._relabel.carried(callee, *alike) if alike is not None else None
                if carried is not None:
                    self.units.relabels += 1
                    for t in carried[1]:
                        self.units.note(type_of(t))
                else:
                    self._relabel.begin()
                    try:
                        plan = self.plan(callee, args)
                    finally:
                        nested = self._relabel.end()
                    summary = summarize(plan, self.slot_gpu)
                    if self.options.keep_bodies:
                        summary.body, plan.in_values = plan, tuple(args)
                    carried = (summary, plan.out_values)
                    if alike is not None:
                        self._relabel.remember(*alike, plan, carried, nested)
                found = (*carried, alike)
                if abstract:
                    self._summaries[key] = found
            hit = found
            if abstract:
                self._summary_ids[id_key] = (hit, types)
        check_declared(call.outputs, hit[1], "@" + callee.name)
        self._relabel.called(hit[2], hit[0])
        self._frames[-1].append(hit[0])
        return hit[1]

    def summary_of(self, fn: Function, args: Sequence[Mixed]) -> CallSummary:
        """The summary a call of ``fn`` on ``args`` takes (``call``: planned once, then from
        the memo), the units prepared or assumed from ``args`` first if they are not yet."""
        if not self.units.prepared:
            (self.units.assume if self.options.assume_units else self.units.prepare)(self.module, fn, args)
        self._frames.append([])
        try:
            self.call(self.module, Call(fn.name, (), tuple(Value(v.name) for v in fn.outputs)), fn, args)
            got = self._frames[-1][-1]
        finally:
            self._frames.pop()
        assert isinstance(got, CallSummary)
        return got

    def plan(self, fn: Function, args: Sequence[Mixed]) -> FnPlan:
        top = not self._frames
        if not self.units.prepared and top:
            (self.units.assume if self.options.assume_units else self.units.prepare)(self.module, fn, args)
        columnar = top and self.options.entry_memory_columns
        donated = self._donated(fn) if top and not self.options.entry_param_uses else None
        fast = (
            plan_flat(self, fn, args, columnar=columnar, donated=donated) if self.options.fast_path else None
        )
        if fast is not None:
            return fast
        links = self.fusion_of(fn)
        if links is not None:  # the general path meets the ops by the interpreter: by op id
            self._link_by_id.update((id(x), k) for x, k in zip(fn.body, links, strict=True) if k is not None)
        self._frames.append([])
        try:
            try:
                outs, env = self._walk(fn, args)
            except PROGRAM_ERRORS:  # reported precisely by the interpreter's own walk
                self._frames[-1] = []
                outs, env = interpret(self.module, fn, args, self)
        finally:
            records = self._frames.pop()
        paired = self.overlap_pairs(fn)
        if paired is not None and len(paired) == len(records):
            assert self.tp_form is not None  # pairs exist only under an overlap
            records = overlap.apply(records, paired, self.tp_form)
        plan = build_plan(
            fn,
            env,
            records,
            tuple(type_of(o) for o in outs),
            self.dev_slot,
            self.slot_gpu,
            param_uses=self.options.entry_param_uses or not top,
            donated=donated,
        )
        plan.out_values = tuple(outs)
        return plan

    def _donated(self, fn: Function) -> dict[Value, Gift] | None:
        """The entry's donated parameters (``Function.donated``): the plan frees each after its
        last use, or after the instruction making the result written into it if later."""
        if not fn.donated:
            return None
        into = {fn.outputs[d.result]: d.param for d in fn.donated if d.result >= 0}
        made: dict[int, int] = {}  # parameter index -> the instruction making its successor
        for i, instr in enumerate(fn.body):
            if into and not into.keys().isdisjoint(instr.outputs):
                for v in instr.outputs:
                    j = into.pop(v, None)
                    if j is not None:
                        made[j] = i
        return {
            fn.params[d.param]: Gift(self.units.bytes_by_gpu(fn.params[d.param].type), made.get(d.param, -1))  # type: ignore[arg-type]
            for d in fn.donated
            if fn.params[d.param].type is not None
        }

    def _walk(self, fn: Function, args: Sequence[Mixed]) -> tuple[tuple[Mixed, ...], dict[Value, Mixed]]:
        """``interpret`` specialized for planning: the same semantics, with the memo lookup of
        already-seen ops inlined (the hot path of simulating a long flat program). A wrong program
        (``PROGRAM_ERRORS``) is walked again by ``interpret``, which reports it precisely.

        The function ``Units.prepare`` walked (the entry of a DTensor program) takes its final
        state and each instruction's arguments from there (the same type domain: the same
        values), instead of looking up and storing ~1M value edges again; and a call site whose
        results tuple from there was seen before (same callee, same argument types) reuses that
        site's summary without keying it by its hundreds of argument types again."""
        trace = self.units.take_trace(fn, args)
        if trace is None:
            return self._walk_plain(fn, args)
        env, ins_seq, seen_seq = trace
        # id of prepare's results tuple -> (the summary, the results, that tuple: kept alive)
        by_seen: dict[int, tuple[CallSummary, Sequence[Mixed], Sequence[Mixed]]] = {}
        frame = self._frames[-1]
        append = frame.append
        module = self.module
        outs: Sequence[Mixed]
        for instr, ins, seen in zip(fn.body, ins_seq, seen_seq, strict=True):
            if type(instr) is Op:  # ``op`` answers a repeated op from its memo
                outs = self.op(instr, ins)
            else:
                assert isinstance(instr, Call)
                got = by_seen.get(id(seen)) if seen else None
                if got is not None and got[2] is seen:
                    check_declared(instr.outputs, got[1], "@" + instr.callee)
                    append(got[0])
                    outs = got[1]
                else:
                    outs = self.call(module, instr, module[instr.callee], ins)
                    if seen:
                        summary = frame[-1]
                        assert isinstance(summary, CallSummary)
                        by_seen[id(seen)] = (summary, outs, seen)
            if len(outs) != len(instr.outputs):
                raise OpTypeError("result count mismatch")
        return tuple(env[v] for v in fn.outputs), env

    def _walk_plain(
        self, fn: Function, args: Sequence[Mixed]
    ) -> tuple[tuple[Mixed, ...], dict[Value, Mixed]]:
        """``_walk`` of a body no ``Units.prepare`` walked: the state built here (``op`` answers a
        repeated op from its memo; with the fast paths on, ``_walk_by_ids`` first)."""
        if self.options.fast_path:
            return self._walk_by_ids(fn, args)
        env = walk_unchecked(self.module, fn, args, self)
        return tuple(env[v] for v in fn.outputs), env

    def _walk_by_ids(
        self, fn: Function, args: Sequence[Mixed]
    ) -> tuple[tuple[Mixed, ...], dict[Value, Mixed]]:
        """``walk_unchecked`` of a body with calls, an op met again in it answered from a memo
        keyed by the identity of its attributes and argument objects (no type hashed): ``op``'s
        own memo gives an op seen before with equal attributes, types and link the same result
        types and record, and identical objects are equal. Every object whose id is in a key is
        alive (the body's attributes, the arguments in ``env``) while the walk lasts; an op with a
        concrete argument or result is not kept. An op's fused link is found as ``op`` finds it
        (``_link_by_id``): by its position in the body (``fusion_of``)."""
        env: dict[Value, Mixed] = dict(zip(fn.params, args, strict=True))
        env_of = env.__getitem__
        update = env.update
        frame = self._frames[-1]
        append = frame.append
        links = self.fusion_of(fn)
        module = self.module
        seen: dict[tuple[Any, ...], tuple[Sequence[Mixed], OpRecord | CallSummary]] = {}
        outs: Sequence[Mixed]
        for i, instr in enumerate(fn.body):
            ins = list(map(env_of, instr.inputs))
            if type(instr) is not Op:
                assert isinstance(instr, Call)
                outs = self.call(module, instr, module[instr.callee], ins)
            else:
                link = links[i] if links is not None else None
                if link is not None and (link.via >= 0 or link.unless):  # as the Redistributes moved
                    link = link.resolved(_moved_nothing(frame))
                key = (instr.name, id(instr.attrs), link, *map(id, ins))
                hit = seen.get(key)
                if hit is not None:
                    outs = hit[0]
                    for v in instr.outputs:
                        if v.type is not None:
                            check_declared(instr.outputs, outs, instr.name)
                            break
                    append(hit[1])
                else:
                    self.pending_link = link
                    outs = self.op(instr, ins)
                    if Concrete not in map(type, ins) and Concrete not in map(type, outs):
                        seen[key] = (outs, frame[-1])
            if len(outs) != len(instr.outputs):
                raise OpTypeError("result count mismatch")
            update(zip(instr.outputs, outs, strict=True))
        return tuple(env[v] for v in fn.outputs), env
