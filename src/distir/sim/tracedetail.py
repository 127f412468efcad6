"""What a simulation's trace shows inside its slices (``simulate(trace_detail=...)``).

The simulator runs a call as its summary (``distir.sim.plan``): one slice per call and slot.
A detailed trace replays the entry's plan with the same timing rules (an op waits for all its
slots, and an ``event`` hand-over also for those it sends from, then its slots advance to its
end; a call maps its slots' clocks by its summary) and,
down to the level asked for, the plans of the called bodies from the clocks their call met:

- ``chunk``: the entry's ops and calls (a pipeline program's chunks) — what the simulator times;
- ``layer``: also what each of those calls runs — the layers of a chunk and its own ops;
- ``op``: every op at every depth.

A call's body is replayed from the clocks its call met, so each nested slice lies within its
call's slice on the same slot (clamped to it, against rounding). Ops that take no time (views)
are left out below the entry. Every slice has arguments: an op its ``op``, ``flops`` (over all
its devices), ``result_bytes`` (the most its results allocate on one GPU) and, when the types
are known, ``inputs``/``outputs`` (types as the IR writes them); a communication op also its
``message_bytes``; a call its ``function``, ``ops`` and ``flops``. A point-to-point op (a
``CommPattern.P2P`` cost: ``Send``, ``MeshSend``) adds a ``Flow`` from each sending slot to its
receiving slot. Times are seconds; slots are the device map's (``DeviceMap.slots``).

Types come from one pass of the type domain over the program (calls memoized by argument
types); bodies carried to another mesh (``distir.sim.relabel``) show the types of the mesh
they were planned on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from distir.interp.loop import interpret
from distir.interp.shapes import Mixed, TypeDomain, type_of
from distir.ir.dtensor import DTensorType
from distir.ir.function import Function, Module
from distir.ir.ops import Op
from distir.ir.types import Device, Type
from distir.ir.values import Value
from distir.limits import MAX_TRACE_EVENTS
from distir.ops.registry import REGISTRY, CommPattern, OpKind
from distir.sim.devices import DeviceMap
from distir.sim.records import CallSummary, FnPlan

# how many levels of calls a detail level shows (None: all)
LEVELS: dict[str, int | None] = {"chunk": 1, "layer": 2, "op": None}


class TraceSizeError(ValueError):
    """A trace refused: more events than ``MAX_TRACE_EVENTS``, or GPUs the program does not use."""


@dataclass(frozen=True, slots=True)
class TraceScope:
    """What a simulation traces: its detail ``level`` and the ``gpus`` shown (None: every GPU)."""

    level: str
    gpus: frozenset[int] | None = None

    def slots(self, dmap: DeviceMap) -> frozenset[int] | None:
        """The device map's slots on the traced GPUs (None: every slot)."""
        if self.gpus is None:
            return None
        return frozenset(j for j, slot in enumerate(dmap.slots) if slot.gpu in self.gpus)

    def check_gpus(self, dmap: DeviceMap) -> None:
        """``TraceSizeError`` for a traced GPU that none of the program's slots is on."""
        if self.gpus is None:
            return
        used = {slot.gpu for slot in dmap.slots}
        missing = sorted(self.gpus - used)
        if missing:
            raise TraceSizeError(
                f"traced GPU {missing[0]} is not one of the program's {len(used):,} GPUs "
                f"({min(used)} to {max(used)})"
            )

    def too_large(self, events: int, dmap: DeviceMap) -> str:
        """Why a trace of ``events`` is refused, and how many GPUs would fit."""
        shown = len(self.gpus) if self.gpus is not None else len({slot.gpu for slot in dmap.slots})
        fit = max(MAX_TRACE_EVENTS.max * shown // max(events, 1), 1)
        deeper = " or --trace-detail chunk" if self.level != "chunk" else ""
        return (
            f"a trace of about {events:,} events ({shown:,} GPUs at {self.level} detail) is above "
            f"distir's bound of {MAX_TRACE_EVENTS.max:,} (docs/limitations.md): trace fewer GPUs with "
            f"--trace-gpus (about {fit:,} fit, e.g. --trace-gpus 0-{fit - 1}){deeper}"
        )


class DetailSlice(NamedTuple):
    name: str
    start: float  # seconds
    end: float
    slot: int  # index into the device map's slots
    depth: int  # 0: the entry's; 1: inside a call of the entry; ...
    comm: bool
    args: dict[str, Any]


class Flow(NamedTuple):
    """A point-to-point transfer from slot ``src`` to slot ``dst`` during [start, end]."""

    name: str
    src: int
    dst: int
    start: float
    end: float


class TraceDetail(NamedTuple):
    level: str
    slices: list[DetailSlice]
    flows: list[Flow]


@dataclass(frozen=True, slots=True)
class DetailSource:
    """What a detailed trace is built from, kept by a traced simulation."""

    level: str
    plan: FnPlan  # the entry's
    module: Module
    fn: Function
    args: tuple[Mixed, ...]
    clock_slots: tuple[tuple[int, ...], ...]  # the plan's clock -> its slots
    dev_slot: Mapping[Device, int]  # program device -> slot
    traced: frozenset[int] | None = None  # the slots the trace shows (None: every slot)


class _Types:
    """The types of every body's values, by (function, argument types), from one type pass."""

    def __init__(self, module: Module, fn: Function, args: Sequence[Mixed]) -> None:
        self.domain = TypeDomain(record=True)
        _, env = interpret(module, fn, args, self.domain)
        self.entry = (fn, env)
        self._by_args: dict[tuple[str, tuple[Type, ...]], dict[Value, Mixed]] = {}
        for name, seen in self.domain.envs.items():
            for types, e in seen:
                self._by_args.setdefault((name, types), e)

    def env(self, plan: FnPlan, top: bool) -> Mapping[Value, Mixed]:
        if top:
            return self.entry[1]
        types = tuple(type_of(a) for a in plan.in_values)
        return self._by_args.get((plan.fn.name, types), {})


def build(src: DetailSource) -> TraceDetail:
    """Replay ``src``'s plan into the slices and flows of its level (module docstring)."""
    w = _Walker(src, _Types(src.module, src.fn, src.args), LEVELS[src.level])
    clock = [0.0] * len(src.clock_slots)
    w.walk(src.plan, None, clock, 0, None)
    return TraceDetail(src.level, w.slices, w.flows)


class _Walker:
    def __init__(self, src: DetailSource, types: _Types, max_depth: int | None) -> None:
        self.src = src
        self.types = types
        self.max_depth = max_depth
        self.slices: list[DetailSlice] = []
        self.flows: list[Flow] = []
        traced = src.traced
        # clocks that stand for a traced slot: the ops and calls of the others emit nothing
        self.shown = [traced is None or not traced.isdisjoint(slots) for slots in src.clock_slots]

    def walk(
        self,
        plan: FnPlan,
        rename: Mapping[int, int] | None,
        clock: list[float],
        depth: int,
        span: Mapping[int, tuple[float, float]] | None,
    ) -> None:
        """Replay ``plan`` on ``clock`` (the plan's clocks renamed by ``rename``), appending the
        slices of ``depth``; ``span``: the enclosing call's slice per clock (None at the top)."""
        env = self.types.env(plan, depth == 0)
        # a body carried to another mesh has the types of the first: its devices are not these
        moved = rename is not None and any(k != v for k, v in rename.items())
        for i, (ds0, c, is_comm) in enumerate(zip(plan.devs, plan.costs, plan.comm, strict=True)):
            ds = ds0 if rename is None else tuple(rename[d] for d in ds0)
            if isinstance(c, CallSummary):
                self._call(c, ds0, rename, clock, depth, span)
                continue
            after = plan.waits[i] if plan.waits is not None else ()  # ``OpRecord.waits``
            if after and rename is not None:
                after = tuple(rename[d] for d in after)
            s = max([clock[d] for d in (*ds, *after)]) if ds else 0.0
            e = s + c
            for d in ds:
                clock[d] = e
            held = plan.stall[i] if plan.stall is not None else ()
            for d, x in held:  # the compute beside a collective, slowed (``distir.sim.interference``)
                clock[d if rename is None else rename[d]] += x
            if (depth > 0 and e <= s) or not any(self.shown[d] for d in ds):
                continue
            instr = plan.fn.body[i]
            assert isinstance(instr, Op)
            args, pairs = self._op_args(instr, env, plan, i)
            if moved:
                pairs = []
            for d in ds:
                a, b = _clamp(s, e, span, d)
                self._emit(instr.name, a, b, d, depth, is_comm, args)
            for x, y in pairs:
                self.flows.append(Flow(instr.name, x, y, s, e))

    def _call(
        self,
        c: CallSummary,
        ds0: Sequence[int],
        rename: Mapping[int, int] | None,
        clock: list[float],
        depth: int,
        span: Mapping[int, tuple[float, float]] | None,
    ) -> None:
        sub = list(c.slots) if rename is None else [rename[j] for j in c.slots]
        m = len(sub)
        if m == 0:
            return
        ins = [clock[j] for j in sub]
        new = [max([ins[a] + c.delay[a][b] for a in range(m)]) for b in range(m)]
        if not any(self.shown[j] for j in sub):  # nothing of it traced: only the clocks move
            for b, j in enumerate(sub):
                clock[j] = new[b]
            return
        starts = [max([ins[a] + c.first[a][b] for a in range(m)]) for b in range(m)]
        args = {"function": c.name, "ops": c.n_ops, "flops": c.flops}
        inner: dict[int, tuple[float, float]] = {}
        for b, j in enumerate(sub):
            a0, b0 = _clamp(starts[b], new[b], span, j)
            inner[j] = (a0, b0)
            self._emit("@" + c.name, a0, b0, j, depth, False, args)
        if c.body is not None and (self.max_depth is None or depth + 1 < self.max_depth):
            to_call = c.body_clocks if c.body_clocks is not None else {x: x for x in c.slots}
            nested = {p: (q if rename is None else rename[q]) for p, q in to_call.items()}
            self.walk(c.body, nested, list(clock), depth + 1, inner)
        for b, j in enumerate(sub):
            clock[j] = new[b]

    def _emit(
        self, name: str, s: float, e: float, clock: int, depth: int, comm: bool, args: dict[str, Any]
    ) -> None:
        traced = self.src.traced
        for slot in self.src.clock_slots[clock]:
            if traced is None or slot in traced:
                self.slices.append(DetailSlice(name, s, e, slot, depth, comm, args))

    def _op_args(
        self, op: Op, env: Mapping[Value, Mixed], plan: FnPlan, i: int
    ) -> tuple[dict[str, Any], list[tuple[int, int]]]:
        """The slice arguments of op ``i`` of ``plan`` and its (sending, receiving) slot pairs."""
        ev = plan.mem[i]
        per_gpu: dict[int, float] = {}
        for g, nb in ev[1] if ev is not None else ():
            per_gpu[g] = per_gpu.get(g, 0.0) + nb
        args: dict[str, Any] = {
            "op": op.name,
            "flops": plan.flops[i],
            "result_bytes": max(per_gpu.values(), default=0.0),
        }
        got = [env.get(v) for v in (*op.inputs, *op.outputs)]
        if any(t is None for t in got):
            return args, []
        types = [type_of(t) for t in got if t is not None]
        ins, outs = types[: len(op.inputs)], types[len(op.inputs) :]
        args["inputs"] = [_text(t) for t in ins]
        args["outputs"] = [_text(t) for t in outs]
        d = REGISTRY[op.name]
        pairs: list[tuple[int, int]] = []
        if d.kind is OpKind.COMM and d.comm_cost is not None:
            desc = d.comm_cost(ins, outs, op.attrs)
            args["message_bytes"] = desc.nbytes
            if desc.pattern is CommPattern.P2P:  # devices: the senders, then their receivers
                half = len(desc.devices) // 2
                slot, traced = self.src.dev_slot, self.src.traced
                for x, y in zip(desc.devices[:half], desc.devices[half:], strict=True):
                    if x not in slot or y not in slot or slot[x] == slot[y]:
                        continue
                    if traced is None or (slot[x] in traced and slot[y] in traced):
                        pairs.append((slot[x], slot[y]))
        return args, pairs


def _text(t: Type) -> str:
    """A type as a slice argument: as the IR writes it, a mesh's devices as ranges."""
    return t.text(short=True) if isinstance(t, DTensorType) else str(t)


def estimate_events(src: DetailSource) -> int:
    """About how many events the trace of ``src`` holds: a slice per op or call and traced slot
    at each level shown (a call's body counted whole below the entry: its ops at ``op`` level,
    its top-level ops at ``layer``), and as many memory samples. Counted on the plan's clocks,
    without replaying it: O(ops x clocks) of the entry."""
    traced = src.traced
    weight = [
        len(slots) if traced is None else sum(1 for j in slots if j in traced) for slots in src.clock_slots
    ]
    depth = LEVELS[src.level]
    total = 0
    for ds, c in zip(src.plan.devs, src.plan.costs, strict=True):
        if isinstance(c, CallSummary):
            inner = 0
            if depth is None:
                inner = c.n_ops
            elif depth > 1:
                inner = len(c.body.devs) if c.body is not None else c.n_ops
            total += (1 + inner) * sum(weight[j] for j in c.slots)
        else:
            total += sum(weight[d] for d in ds)
    return 2 * total


def _clamp(
    s: float, e: float, span: Mapping[int, tuple[float, float]] | None, clock: int
) -> tuple[float, float]:
    """``[s, e]`` within the enclosing call's slice on ``clock`` (equal but for rounding)."""
    if span is None or clock not in span:
        return s, e
    lo, hi = span[clock]
    return min(max(s, lo), hi), max(min(e, hi), lo)


__all__ = [
    "LEVELS",
    "DetailSlice",
    "DetailSource",
    "Flow",
    "TraceDetail",
    "TraceScope",
    "TraceSizeError",
    "build",
    "estimate_events",
]
