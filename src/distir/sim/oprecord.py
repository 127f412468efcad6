"""One op's record: the clocks it runs on, its cost, whether it communicates, its FLOPs and the
bytes its results hold per GPU — the op-level semantics both planners share.

``op_record`` is what the simulator knows of one primitive op given its input and result types:
an op on plain tensors runs on the slots of its values' devices (a local op costs the cost
model's ``compute_time`` on the GPU of its first value, or ``fused_time`` when it joins the
kernel before it, ``distir.sim.fusion``; a communication op its ``comm_time``); an op on
DTensors follows ``distir.sim.spmd``. A *view* (a local op with inputs that writes no bytes)
allocates nothing. Slots and GPUs are ``units``' clocks and memory figures: the real slots and
GPUs, or units of a DTensor program (``distir.sim.units``).
"""

from __future__ import annotations

from collections.abc import Sequence

from distir.ir.dtensor import DTensorType
from distir.ir.ops import Op
from distir.ir.types import Device, TupleType, Type
from distir.ops.dist import MESH_SEND
from distir.ops.registry import REGISTRY, CommPattern, OpDef, OpKind, OpTypeError
from distir.sim import interference, spmd
from distir.sim.cost import charged
from distir.sim.fusion import FusedInput
from distir.sim.records import OpRecord
from distir.sim.units import Units, has_dtensor, leaves


def op_record(
    units: Units, op: Op, ins: Sequence[Type], outs: Sequence[Type], link: FusedInput | None = None
) -> OpRecord:
    """The record of ``op`` with input types ``ins`` and result types ``outs`` (module
    docstring); ``link``: how it joins the kernel of the op before it, or None."""
    d = REGISTRY[op.name]
    if d.kind is OpKind.RANK_COMM:
        raise OpTypeError(f"{op.name} belongs in a per-rank program; simulate the global program")
    if op.attrs.get("event"):  # a hand-over between streams: the destination waits for the source
        return handed_over(units, _record(units, op, d, ins, outs, link), outs)
    return _record(units, op, d, ins, outs, link)


def handed_over(units: Units, rec: OpRecord, outs: Sequence[Type]) -> OpRecord:
    """``rec`` as an ``event`` hand-over (``MeshSend``/``Send`` with ``event=true``): it runs on
    the clocks of its results only and waits for the others it touched (the source's) without
    occupying them — a CUDA event recorded on the source stream that the destination stream waits
    for, so the source goes on whatever the destination is still doing."""
    dst = set(slots_of(units, outs))
    return rec._replace(devs=tuple(sorted(dst)), waits=tuple(s for s in rec.devs if s not in dst))


def _record(
    units: Units, op: Op, d: OpDef, ins: Sequence[Type], outs: Sequence[Type], link: FusedInput | None
) -> OpRecord:
    if any(has_dtensor(t) for t in (*ins, *outs)):
        rec = spmd.record(units, op, d, ins, outs, link)
        if rec.comm and op.name != MESH_SEND.name:  # a transfer between meshes: point to point
            return rec._replace(stall=interference.stall(units, rec.devs, rec.seconds))
        return rec
    devs = tuple(sorted(set(slots_of(units, [*ins, *outs]))))
    cost = units.cost
    if d.kind is OpKind.COMM:
        assert d.comm_cost is not None
        desc = d.comm_cost(ins, outs, op.attrs)
        gpus = [units.dev_gpu[x] for x in desc.devices]
        if desc.pattern is CommPattern.P2P and units.host_devs.intersection(desc.devices):
            seconds = units.comm_seconds(desc.pattern, desc.nbytes, desc.devices)  # over PCIe
        else:
            seconds = charged(cost, desc, gpus)
        held = interference.stall(units, devs, seconds) if desc.pattern is not CommPattern.P2P else ()
        return OpRecord(devs, seconds, True, op.name, 0.0, False, *units.sizes(outs, False), None, stall=held)
    dev = _first_device(ins, outs, op) if devs else None
    seconds = 0.0 if dev is None else units.op_seconds(d, ins, outs, op.attrs, dev, link)
    view = bool(ins) and d.bytes_written(ins, outs, op.attrs) == 0
    flops = d.flops(ins, outs, op.attrs)
    return OpRecord(devs, seconds, False, op.name, flops, view, *units.sizes(outs, view), None)


def slots_of(units: Units, types: Sequence[Type]) -> list[int]:
    """The clocks the values of ``types`` live on (a DTensor: every unit of its mesh)."""
    out: list[int] = []
    for t in types:
        for e in t.elements if isinstance(t, TupleType) else (t,):
            if isinstance(e, TupleType):
                out.extend(slots_of(units, [e]))
                continue
            if isinstance(e, DTensorType):
                out.extend(u for u, *_ in units.mesh_units(e.mesh))
                continue
            try:
                out.append(units.dev_slot[e.device])
            except KeyError:
                raise OpTypeError(f"device {e.device} is not mapped onto the cluster") from None
    return out


def _first_device(ins: Sequence[Type], outs: Sequence[Type], op: Op) -> Device | None:
    """The program device a local op runs on (its first value's; None: none named)."""
    for t in (*ins, *outs):
        for e in leaves(t):
            return e.device
    a = op.attrs.get("device")
    return a if isinstance(a, Device) else None
