"""The simulator's reference planner: what ``simulate`` computes, written plainly.

``distir.sim.plan`` and its fast paths (flat plans, memory columns, devices grouped into units
of identical ranks, call summaries reused per argument types and carried to other meshes) compute
the figures this module defines, faster; ``tests/sim/test_reference_planner.py`` holds each of
them to it, bit for bit. Here nothing is memoized or summarized ahead: every call site walks its
callee again, every device has its own clock and every GPU its own memory. Select it with
``simulate(..., planner="reference")`` (``distir simulate --planner reference``).

**Walk.** The entry is interpreted in program order (``distir.interp.loop.interpret``, types by
``TypeDomain``), each call walking its callee's body at its site. Each primitive op gets its
record (``distir.sim.oprecord.op_record``): the slots (streams of GPUs) it runs on, its seconds,
whether it communicates, its FLOPs, whether it is a view, the bytes per GPU of each result and
its peak bump. An op joining the kernel of the op before it (``distir.sim.fusion``, when the
cost model fuses) is costed as fused; a link through a Redistribute holds only if that
Redistribute moved nothing (its record is a view). When the cost model overlaps tensor-parallel
collectives with their GEMMs (``tp_comm_overlap``), each body's collectives that pair with one
are charged, once the body is walked, what their pair takes beyond the GEMM
(``distir.sim.overlap``).

**Time.** Every slot has a clock, from 0. An op starts when all its slots are free — at the
largest of their clocks — and all of them advance to its end, start + seconds; the seconds add to
each of its slots' communication time if it communicates, else to their busy time. An ``event``
hand-over also waits for the slots it sends from (``OpRecord.waits``: their largest clock counts
for its start) without occupying them: they do not advance. A collective
then advances each slot it stalls (``OpRecord.stall``: the compute stream of a GPU it runs on from
another stream, ``distir.sim.interference``) by that slot's stall, added to its busy time. An op on no
slot takes no time. A call is a max-plus linear map of the clocks of its callee's slots: the
body is timed from zero on its own slots, each slot ``v``'s exit clock as a function of each
entry clock ``u`` (``delay[u][v]``, -inf where ``v`` never waits for ``u``), and the call sets
``clock[v] = max_u(clock[u] + delay[u][v])`` and adds the body's busy and communication time per
slot. In real arithmetic that is the inlined program's timing; in floating point it groups each
body's sums from zero (a layer costs the same float wherever it runs). The step time is the
largest clock. A traced run records a slice per slot for each op of the entry (start to end) and
for each call (from the start of the slot's first op inside, ``first[u][v]`` as for ``delay``,
to its exit clock).

**Memory.** Storage is an entry parameter, live from the start and never freed unless donated,
or a result of an op that is not a view, allocated by that op. A view's results use all of its
inputs' storage; a callee's parameters use its arguments' storage; a call's results use its
callee's results' storage. Storage is freed after the last op (in the walk's order, calls
inlined) that reads a value using it, or after the op that makes it when no op reads it; the
storage of the entry's results is never freed. A donated entry parameter (``Function.donated``)
is freed after the entry instruction ``Gift.end`` names — its last use, or the one before the
instruction making its successor when nothing reads it after that — and, when that instruction
is a call that reads it, after the last op inside that reads it. Per GPU the live bytes start at
the entry's parameters; at each op the peak takes the live bytes plus the op's peak bump (its
allocations summed per GPU; for a multi-step Redistribute its intermediate layouts, smaller when
the only storage its first input uses is freed after it), then the op's
allocations are added, then the storage freed after it is subtracted. The reported peak adds the
GPU's runtime memory (``RuntimeMemory``), as ``simulate`` does for every planner.

**Counts.** FLOPs are the ops' FLOPs summed in program order, a call's being its body's sum; the
op count counts every primitive op the walk meets.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import NamedTuple

from distir.interp.loop import interpret
from distir.interp.shapes import Mixed, TypeDomain, check_arguments, check_declared, type_of
from distir.ir.function import Function, Module
from distir.ir.ops import Call, Op
from distir.ir.values import Value
from distir.sim import overlap
from distir.sim.cost import CostModel, epilogues, fuses
from distir.sim.devices import DeviceMap
from distir.sim.fusion import FusedInput, fused_inputs
from distir.sim.oprecord import op_record
from distir.sim.records import NEG_INF, Gift, OpRecord
from distir.sim.units import Units

# one traced slice: (name, start s, end s, slot index, is communication)
Slice = tuple[str, float, float, int, bool]


@dataclass(eq=False, slots=True)
class Storage:
    """One piece of storage (an entry parameter, or the result of an op that is not a view):
    its bytes per GPU. Compared by identity."""

    nbytes: Sequence[tuple[int, float]]


Uses = tuple[Storage, ...]  # the storage a value uses


class OpStep(NamedTuple):
    """A primitive op met by the walk: its record, the storage each input uses, the storage it
    allocates (one per result; none for a view)."""

    record: OpRecord
    reads: tuple[Uses, ...]
    made: tuple[Storage, ...]


class CallStep(NamedTuple):
    """A call met by the walk: the callee's name, the slots its body runs on, its body's steps."""

    name: str
    slots: tuple[int, ...]
    steps: list[OpStep | CallStep]


Step = OpStep | CallStep


@dataclass(slots=True)
class _Frame:
    """The walk of one function body: the storage of each value, the steps so far, the body's
    fused links (None: none)."""

    storage: dict[Value, Uses]
    links: list[FusedInput | None] | None
    steps: list[Step] = field(default_factory=list)


_CALL = OpRecord((), 0.0, True, "@call", 0.0, False, (), (), (), None)  # a call's place in ``overlap``


class _Walker(TypeDomain):
    """The interpreter's type domain, recording each op's and call's step on the way."""

    def __init__(
        self, units: Units, fuse: bool, tp_overlap: overlap.Form | None, gemm_epilogues: bool = True
    ) -> None:
        super().__init__()
        self.units = units
        self.fuse = fuse
        self.gemm_epilogues = gemm_epilogues  # a GEMM may head a fused chain (``fused_inputs``)
        self.tp_overlap = tp_overlap  # the cost model's tensor-parallel overlap, or None
        self.frames: list[_Frame] = []

    def frame(self, fn: Function, storage: dict[Value, Uses]) -> _Frame:
        links = fused_inputs(fn, self.gemm_epilogues) if self.fuse else None
        return _Frame(storage, links if links is not None and any(links) else None)

    def overlap(self, fn: Function, body: _Frame) -> None:
        """Charge each collective of the walked ``body`` that pairs with a GEMM its exposed part
        (``distir.sim.overlap``), when the cost model overlaps them."""
        if self.tp_overlap is None:
            return
        paired = overlap.pairs(fn)
        if all(c is None for c in paired):
            return
        # the candidates are ops: a call's place holds a record that pairs with nothing
        records = [s.record if isinstance(s, OpStep) else _CALL for s in body.steps]
        for i, rec in enumerate(overlap.apply(records, paired, self.tp_overlap)):
            step = body.steps[i]
            if isinstance(step, OpStep) and rec is not step.record:
                body.steps[i] = step._replace(record=rec)

    def op(self, op: Op, args: Sequence[Mixed]) -> Sequence[Mixed]:
        outs = super().op(op, args)
        if len(outs) != len(op.outputs):  # ``interpret`` reports it
            return outs
        here = self.frames[-1]
        ins, res = [type_of(a) for a in args], [type_of(o) for o in outs]
        rec = op_record(self.units, op, ins, res, self._link(here))
        reads = tuple(here.storage[v] for v in op.inputs)
        made: tuple[Storage, ...] = ()
        if rec.view:
            shared = tuple(dict.fromkeys(chain.from_iterable(reads)))
            for v in op.outputs:
                here.storage[v] = shared
        else:
            made = tuple(Storage(b) for b in rec.out_bytes)
            for v, s in zip(op.outputs, made, strict=True):
                here.storage[v] = (s,)
        here.steps.append(OpStep(rec, reads, made))
        return outs

    def _link(self, here: _Frame) -> FusedInput | None:
        """How the op about to be recorded joins the kernel before it (``distir.sim.fusion``)."""
        if here.links is None:
            return None
        link = here.links[len(here.steps)]
        if link is not None and (link.via >= 0 or link.unless):  # as the Redistributes moved
            steps = here.steps

            def view(i: int) -> bool:
                step = steps[i]
                return isinstance(step, OpStep) and step.record.view

            link = link.resolved(view)
        return link

    def call(self, module: Module, call: Call, callee: Function, args: Sequence[Mixed]) -> Sequence[Mixed]:
        check_arguments(callee, [type_of(a) for a in args])
        here = self.frames[-1]
        passed = {p: here.storage[v] for p, v in zip(callee.params, call.inputs, strict=False)}
        body = self.frame(callee, passed)
        self.frames.append(body)
        try:
            outs, _ = interpret(module, callee, args, self)
        finally:
            self.frames.pop()
        self.overlap(callee, body)
        check_declared(call.outputs, outs, "@" + callee.name)
        for v, r in zip(call.outputs, callee.outputs, strict=False):
            here.storage[v] = body.storage[r]
        here.steps.append(CallStep(callee.name, _slots(body.steps), body.steps))
        return outs


def _slots(steps: Sequence[Step]) -> tuple[int, ...]:
    """The slots a body's steps run on or stall, sorted."""
    found = {s for step in steps for s in (_clocks(step.record) if isinstance(step, OpStep) else step.slots)}
    return tuple(sorted(found))


def _clocks(rec: OpRecord) -> tuple[int, ...]:
    """The slots an op runs on, those it waits for (``OpRecord.waits``) and those it stalls
    (``distir.sim.interference``)."""
    return (*rec.devs, *rec.waits, *(s for s, _ in rec.stall)) if rec.stall or rec.waits else rec.devs


# -- time ---------------------------------------------------------------------------------------------
class BodyTiming(NamedTuple):
    """A called body timed from zero on its slots (positions in ``slots``): ``delay[u][v]`` is
    slot ``v``'s exit clock and ``first[u][v]`` the start of ``v``'s first op, each relative to
    ``u``'s entry clock (-inf: independent of it); busy and communication seconds per slot."""

    slots: tuple[int, ...]
    delay: list[list[float]]
    first: list[list[float]]
    busy: list[float]
    comm: list[float]


def time_body(call: CallStep) -> BodyTiming:
    """Time a called body: the module docstring's max-plus map. Each clock is a vector over the
    entry clocks (``clock[v][u]``: ``v``'s clock as far as it depends on ``u``'s)."""
    k = len(call.slots)
    pos = {s: j for j, s in enumerate(call.slots)}
    clock = [[0.0 if u == v else NEG_INF for u in range(k)] for v in range(k)]
    first: list[list[float] | None] = [None] * k
    busy, comm = [0.0] * k, [0.0] * k
    for step in call.steps:
        if isinstance(step, CallStep):
            inner = time_body(step)
            sub = [pos[s] for s in inner.slots]
            ins = [clock[j] for j in sub]
            m = len(sub)
            for b, j in enumerate(sub):
                if first[j] is None:
                    first[j] = [max(ins[a][u] + inner.first[a][b] for a in range(m)) for u in range(k)]
                busy[j] += inner.busy[b]
                comm[j] += inner.comm[b]
            for b, j in enumerate(sub):
                clock[j] = [max(ins[a][u] + inner.delay[a][b] for a in range(m)) for u in range(k)]
            continue
        rec = step.record
        idx = [pos[s] for s in rec.devs]
        if not idx:
            continue
        waited = [*idx, *(pos[s] for s in rec.waits)]
        start = [max(clock[j][u] for j in waited) for u in range(k)]
        end = [x + rec.seconds for x in start]
        for j in idx:
            if first[j] is None:
                first[j] = start
            clock[j] = end
            if rec.comm:
                comm[j] += rec.seconds
            else:
                busy[j] += rec.seconds
        for s, x in rec.stall:  # the compute beside a collective, slowed (``distir.sim.interference``)
            j = pos[s]
            clock[j] = [c + x for c in clock[j]]
            busy[j] += x
    delay = [[clock[v][u] for v in range(k)] for u in range(k)]
    first_m = [[(first[v] or clock[v])[u] for v in range(k)] for u in range(k)]
    return BodyTiming(call.slots, delay, first_m, busy, comm)


def time_entry(
    steps: Sequence[Step], n_slots: int, trace: bool
) -> tuple[list[float], list[float], list[float], list[Slice] | None]:
    """Run the entry's steps on one clock per slot: the clocks at the end, busy and
    communication seconds per slot, and (``trace``) the slices."""
    clock, busy, comm = [0.0] * n_slots, [0.0] * n_slots, [0.0] * n_slots
    slices: list[Slice] | None = [] if trace else None
    for step in steps:
        if isinstance(step, OpStep):
            rec = step.record
            if not rec.devs:
                continue
            start = max(clock[d] for d in (*rec.devs, *rec.waits))
            end = start + rec.seconds
            for d in rec.devs:
                clock[d] = end
                (comm if rec.comm else busy)[d] += rec.seconds
            for d, x in rec.stall:
                clock[d] += x
                busy[d] += x
            if slices is not None:
                slices.extend((rec.name, start, end, d, rec.comm) for d in rec.devs)
            continue
        t = time_body(step)
        ins = [clock[j] for j in t.slots]
        m = len(ins)
        for b, j in enumerate(t.slots):
            end = max(ins[a] + t.delay[a][b] for a in range(m))
            if slices is not None:
                start = max(ins[a] + t.first[a][b] for a in range(m))
                slices.append(("@" + step.name, start, end, j, False))
            clock[j] = end
            busy[j] += t.busy[b]
            comm[j] += t.comm[b]
    return clock, busy, comm, slices


# -- memory -------------------------------------------------------------------------------------------
def inlined_ops(steps: Sequence[Step]) -> Iterator[OpStep]:
    """The primitive ops of ``steps`` in program order, calls inlined."""
    for step in steps:
        if isinstance(step, OpStep):
            yield step
        else:
            yield from inlined_ops(step.steps)


def _donations(fn: Function, params: dict[Value, Storage]) -> dict[Storage, Gift]:
    """The entry's donated parameters' storage, each with its ``Gift``: its bytes and the entry
    instruction making the result written into it (-1: none)."""
    made_by = {v: i for i, instr in enumerate(fn.body) for v in instr.outputs}
    out: dict[Storage, Gift] = {}
    for d in fn.donated:
        s = params[fn.params[d.param]]
        until = made_by.get(fn.outputs[d.result], -1) if d.result >= 0 else -1
        out[s] = Gift(s.nbytes, until)
    return out


def freed_after(
    fn: Function, steps: Sequence[Step], params: dict[Value, Storage], results: Uses
) -> dict[Storage, int]:
    """After which op (its position in the inlined order; -1: before the first) each storage
    that is ever freed is freed (module docstring)."""
    last: dict[Storage, int] = {}
    made_at: dict[Storage, int] = {}
    span: list[tuple[int, int]] = []  # per entry instruction, the positions of its ops
    reads_in: list[dict[Storage, int]] = []  # per entry instruction, last position reading each storage
    p = 0
    for step in steps:
        mine: dict[Storage, int] = {}
        first = p
        for op in inlined_ops([step]):
            for s in chain.from_iterable(op.reads):
                last[s] = mine[s] = p
            for s in op.made:
                made_at[s] = p
            p += 1
        span.append((first, p))
        reads_in.append(mine)
    never = set(results)
    out = {s: last.get(s, at) for s, at in made_at.items() if s not in never}
    for s, gift in _donations(fn, params).items():
        if s in never:
            continue
        read_by = [i for i, mine in enumerate(reads_in) if s in mine]
        e = gift.end(read_by[-1] if read_by else -1)
        if e < len(steps):
            out[s] = reads_in[e].get(s, span[e][1] - 1)
    return out


def peak_memory(
    fn: Function, steps: Sequence[Step], params: dict[Value, Storage], results: Uses, gpus: Sequence[int]
) -> tuple[dict[int, float], dict[int, float]]:
    """Per GPU, the bytes of the entry's parameters and the tensors' peak (module docstring)."""
    live = dict.fromkeys(gpus, 0.0)
    for s in params.values():
        for g, b in s.nbytes:
            live[g] += b
    held = dict(live)
    peak = dict(live)
    free_at = freed_after(fn, steps, params, results)
    frees: dict[int, list[Storage]] = {}
    for s, p in free_at.items():
        frees.setdefault(p, []).append(s)
    for p, op in enumerate(chain([None], inlined_ops(steps)), start=-1):
        if op is not None:
            rec = op.record
            bump = rec.bump
            dying = rec.bump_dying is not None and op.reads and len(op.reads[0]) == 1
            if dying and free_at.get(op.reads[0][0]) == p:
                bump = rec.bump_dying  # type: ignore[assignment]  # not None: checked above
            for g, b in bump:
                peak[g] = max(peak[g], live[g] + b)
            for s in op.made:
                for g, b in s.nbytes:
                    live[g] += b
        for s in frees.get(p, ()):
            for g, b in s.nbytes:
                live[g] -= b
    return held, peak


# -- the run ------------------------------------------------------------------------------------------
class ReferenceRun(NamedTuple):
    """The reference planner's figures, per real slot and GPU (``simulate`` adds the runtime
    memory and makes a ``SimResult``)."""

    clock: list[float]
    busy: list[float]
    comm: list[float]
    peak: dict[int, float]  # gpu -> tensors' peak bytes
    params: dict[int, float]  # gpu -> bytes of the entry's parameters
    flops: float
    n_ops: int
    slices: list[Slice] | None


def _flops(steps: Sequence[Step]) -> float:
    return sum(s.record.flops if isinstance(s, OpStep) else _flops(s.steps) for s in steps)


def run_reference(
    module: Module,
    fn: Function,
    args: Sequence[Mixed],
    dmap: DeviceMap,
    cost: CostModel,
    trace: bool = False,
) -> ReferenceRun:
    """Walk ``fn`` at ``args`` and run it (module docstring). A wrong program raises
    ``InterpretError`` naming the op."""
    units = Units(dmap, cost)  # never grouped: the real slots and GPUs
    walker = _Walker(units, fuses(cost), overlap.form_of(cost), epilogues(cost))
    params = {p: Storage(units.bytes_by_gpu(type_of(a))) for p, a in zip(fn.params, args, strict=True)}
    entry = walker.frame(fn, {p: (s,) for p, s in params.items()})
    walker.frames.append(entry)
    interpret(module, fn, args, walker)
    walker.overlap(fn, entry)
    results = tuple(s for v in fn.outputs for s in entry.storage[v])
    clock, busy, comm, slices = time_entry(entry.steps, len(dmap.slots), trace)
    gpus = sorted({s.gpu for s in dmap.slots})
    held, peak = peak_memory(fn, entry.steps, params, results, gpus)
    n_ops = sum(1 for _ in inlined_ops(entry.steps))
    return ReferenceRun(clock, busy, comm, peak, held, _flops(entry.steps), n_ops, slices)


__all__ = [
    "BodyTiming",
    "CallStep",
    "OpStep",
    "ReferenceRun",
    "Storage",
    "freed_after",
    "peak_memory",
    "run_reference",
    "time_body",
    "time_entry",
]
