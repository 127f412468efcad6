"""An independent, deliberately naive simulator of *call-free* programs, written from the
docs/simulator.md's stated semantics only (not from ``distir.sim.plan``):

- timing: ops run in program order; an op starts at the max clock of the slots of its inputs'
  and results' devices, and all of them advance to its end;
- memory: the entry's parameters are live from the start (and never freed); every other storage
  root is live from the op creating it to its last use (the function's results: to the end);
  view ops (local ops with inputs that write no bytes) create no storage, their results share
  all of their inputs' roots. The peak of op ``i`` counts every root live at ``i``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from distir.interp.shapes import infer_types, type_of
from distir.ir import Call, Module, Op, TupleType, Type, Value
from distir.ops.registry import REGISTRY, OpKind
from distir.sim.devices import DeviceMap


@dataclass
class OracleResult:
    step_time_s: float
    busy_s: list[float]
    comm_s: list[float]
    peak_memory: dict[int, float]
    n_ops: int


def _leaves(t: Type) -> list[Any]:
    if isinstance(t, TupleType):
        return [x for e in t.elements for x in _leaves(e)]
    return [t]


def oracle(module: Module, dmap: DeviceMap, cost: Any) -> OracleResult:
    fn = module.entry
    assert not any(isinstance(i, Call) for i in fn.body), "the oracle runs call-free programs"
    _, env = infer_types(module)
    ty: dict[Value, Type] = {v: type_of(x) for v, x in env.items()}
    slots = dmap.slots
    slot_of = {d: slots.index(s) for d, s in dmap.mapping.items()}
    gpu_of = {d: s.gpu for d, s in dmap.mapping.items()}
    clock = [0.0] * len(slots)
    busy = [0.0] * len(slots)
    comm = [0.0] * len(slots)

    def by_gpu(t: Type) -> dict[int, float]:
        out: dict[int, float] = {}
        for leaf in _leaves(t):
            g = gpu_of[leaf.device]
            out[g] = out.get(g, 0.0) + float(leaf.nbytes)
        return out

    roots: dict[Value, frozenset[Value]] = {}
    created: dict[Value, int] = {}
    last: dict[Value, int] = {}
    n = len(fn.body)
    for i, op in enumerate(fn.body):
        assert isinstance(op, Op)
        d = REGISTRY[op.name]
        ins: Sequence[Type] = [ty[v] for v in op.inputs]
        outs: Sequence[Type] = [ty[v] for v in op.outputs]
        devs = sorted({slot_of[leaf.device] for t in (*ins, *outs) for leaf in _leaves(t)})
        is_comm = d.kind is OpKind.COMM
        if is_comm:
            assert d.comm_cost is not None
            desc = d.comm_cost(ins, outs, op.attrs)
            c = cost.comm_time(desc, [gpu_of[x] for x in desc.devices])
        else:
            c = cost.compute_time(d, ins, outs, op.attrs, slots[devs[0]].gpu)
        start = max(clock[j] for j in devs)
        for j in devs:
            clock[j] = start + c
            if is_comm:
                comm[j] += c
            else:
                busy[j] += c
        for v in op.inputs:
            for r in roots.get(v, frozenset({v})):
                last[r] = i
        view = not is_comm and bool(op.inputs) and d.bytes_written(ins, outs, op.attrs) == 0
        for o in op.outputs:
            if view:
                roots[o] = frozenset(r for v in op.inputs for r in roots.get(v, frozenset({v})))
            else:
                created[o] = i
                last[o] = i
    for v in fn.outputs:
        for r in roots.get(v, frozenset({v})):
            last[r] = n
    base: dict[int, float] = {s.gpu: 0.0 for s in slots}
    for p in fn.params:
        for g, b in by_gpu(ty[p]).items():
            base[g] += b
    peak = dict(base)
    for i in range(n):
        live = dict(base)
        for r, c0 in created.items():
            if c0 <= i <= last[r]:
                for g, b in by_gpu(ty[r]).items():
                    live[g] += b
        for g, b in live.items():
            peak[g] = max(peak[g], b)
    return OracleResult(max(clock, default=0.0), busy, comm, peak, n)


def has_multi_result_gpu(module: Module, dmap: DeviceMap) -> bool:
    """Whether some non-view op of the (call-free) entry has two fresh results on one GPU — the
    case the simulator's peak under-counts (``test_minimal_programs.py``)."""
    _, env = infer_types(module)
    for op in module.entry.body:
        assert isinstance(op, Op)
        d = REGISTRY[op.name]
        ins = [type_of(env[v]) for v in op.inputs]
        outs = [type_of(env[v]) for v in op.outputs]
        if d.kind is not OpKind.COMM and op.inputs and d.bytes_written(ins, outs, op.attrs) == 0:
            continue
        gpus = [dmap.mapping[leaf.device].gpu for t in outs for leaf in _leaves(t) if leaf.nbytes > 0]
        if len(gpus) != len(set(gpus)):
            return True
    return False
