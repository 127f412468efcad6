"""Devices as the simulator's clocks and memory figures: slots, or *units* of a DTensor program.

A plan runs one clock per "slot" and keeps memory per "GPU". For plain programs those are the
device map's slots (streams of GPUs) and GPUs. A DTensor program on a 1024-device mesh must not
cost 1024 clocks per op, so before planning ``Units.prepare`` groups devices into *units*:
devices that every op touches together, that hold equally shaped pieces of every value, on the
same stream of GPUs that cost alike (``device_units``); and GPUs into *memory figures*: GPUs whose
streams fall into the same units. Plans and call summaries then run over units and figures — a
mesh of even shards is one clock and one memory figure — and the simulator expands them back
into slots and GPUs at the end.

``prepare``'s pass over the program is a full type propagation; it keeps the entry's final state,
each instruction's arguments and each call's results (``Units.take_trace``), so the planner's walk
of the entry (``PlanDomain._walk``) looks up no value twice: the entry of a 1024-device pipeline
program has ~1M value edges. ``assume`` skips that pass: it makes the units the entry's parameter
types and the meshes named by attributes call for, the planner notes every type it meets
(``note``), and ``confirm`` checks afterwards that they call for the same units (else the
simulator plans again after ``prepare``). Which slots group into units is
``distir.sim.grouping``; laying out DTensor pieces (``mesh_info``, ``piece_bytes``,
``local_piece``, re-exported here) is ``distir.sim.layout``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from itertools import islice
from typing import Any

from distir.interp.loop import PROGRAM_FAULTS, interpret, walk_unchecked
from distir.interp.shapes import Concrete, Mixed, TypeDomain, check_declared, type_of
from distir.ir.dtensor import DTensorType, Mesh
from distir.ir.function import Function, Module
from distir.ir.ops import Op
from distir.ir.types import Device, ScalarType, TensorType, TupleType, Type
from distir.ir.values import Attrs, Value
from distir.ops.dist import REDISTRIBUTE, redistribute_source
from distir.ops.registry import CommCost, CommPattern, OpDef, OpTypeError
from distir.sim import interference
from distir.sim.cost import CostModel, gpu_class, host_copy_time, host_time
from distir.sim.costmemo import cost_memos
from distir.sim.devices import HOST_STREAM, DeviceMap
from distir.sim.grouping import (
    Groups,
    add_groups,
    attribute_meshes,
    device_groups,
    sent_groups,
    split_units,
)
from distir.sim.layout import (  # re-exported: the layout helpers' former home
    MeshInfo,
    local_piece,
    mesh_info,
    piece_bytes,
    shape_groups,
    step_types,
    uniform_shape,
)

# ``spmd.local_record``'s part that does not depend on the mesh's devices: seconds, FLOPs,
# whether it is a view, and per result its bytes on each unit of the mesh
LocalShape = tuple[float, float, bool, tuple[tuple[float, ...], ...]]
# a function's final state, each instruction's arguments and results, from one walk of its body
Trace = tuple[dict[Value, Mixed], list[list[Mixed]], list[Sequence[Mixed]]]
# per result its bytes per GPU; all allocations; their sum per GPU
Pairs = tuple[tuple[int, float], ...]
Sizes = tuple[tuple[list[tuple[int, float]], ...], Pairs, Pairs]


# -- units ----------------------------------------------------------------------------------------
class _TypeCollector(TypeDomain):
    """Type propagation that notes every DTensor type (with Redistribute's intermediate layouts)
    and every device a plain value lives on; a device without a slot is an error at its op."""

    def __init__(self, dev_slot: Mapping[Device, int]) -> None:
        super().__init__()
        self.dev_slot = dev_slot
        self.dtensors: dict[DTensorType, None] = {}
        self.devices: dict[Device, None] = {}
        self._checked: dict[int, Mesh] = {}  # meshes whose devices are known mapped, by id
        self.op_types: dict[tuple[Any, ...], Sequence[Mixed]] = {}  # (op, attributes, input types)

    def note(self, t: Type) -> None:
        if isinstance(t, DTensorType):
            if t not in self.dtensors:
                self.dtensors[t] = None
                if id(t.mesh) not in self._checked:
                    for d in t.mesh.devices:
                        self._mapped(d)
                    self._checked[id(t.mesh)] = t.mesh
        elif isinstance(t, TupleType):
            for e in t.elements:
                self.note(e)
        elif t.device not in self.devices:
            self._mapped(t.device)
            self.devices[t.device] = None

    def _mapped(self, d: Device) -> None:
        if d not in self.dev_slot:
            raise OpTypeError(f"device {d} is not mapped onto the cluster")

    def op(self, op: Op, args: Sequence[Mixed]) -> Sequence[Mixed]:
        key = (op.name, op.attrs, *args) if Concrete not in map(type, args) else None
        if key is not None:  # an op seen before: its types are noted already
            hit = self.op_types.get(key)
            if hit is not None:
                for v in op.outputs:  # declared types are rare: checked only when there is one
                    if v.type is not None:
                        check_declared(op.outputs, hit, op.name)
                        break
                return hit
        outs = super().op(op, args)
        for x in (*args, *outs):
            self.note(type_of(x))
        if op.name == REDISTRIBUTE.name:
            src, dst = type_of(args[0]), type_of(outs[0])
            if isinstance(src, TensorType) and len(args) > 1:  # a plain one, replicated
                src = redistribute_source(src, type_of(args[1]))
            if isinstance(src, DTensorType) and isinstance(dst, DTensorType):
                for *_, after in step_types(src, dst):
                    self.dtensors[after] = None
        if key is not None and Concrete not in map(type, outs):
            self.op_types[key] = outs
        return outs

    def walk(self, module: Module, fn: Function, args: Sequence[Mixed]) -> Trace:
        """``interpret`` of the top function that also keeps each instruction's arguments and
        results, for the planner's walk of the same body (``Units.take_trace``); returns the final
        state, those arguments and those results. Any failure is re-run through ``interpret``,
        which reports it precisely.

        A call's results are the very tuple ``TypeDomain.call`` cached for its (callee, argument
        types), so call sites that share a results tuple (of at least one value: the empty tuple
        is one object) share their callee and argument types."""
        try:
            ins_at: list[list[Mixed]] = []
            outs_at: list[Sequence[Mixed]] = []
            env = walk_unchecked(module, fn, args, self, (ins_at, outs_at))
            for v in fn.outputs:
                env[v]  # an undefined result is an error (as in ``interpret``)
            return env, ins_at, outs_at
        except PROGRAM_FAULTS:  # a wrong program, which ``interpret`` reports precisely; if it
            # finds no fault, the walk failed where ``interpret`` does not: a bug, raised as it is
            interpret(module, fn, list(args), _TypeCollector(self.dev_slot))
            raise


def device_units(
    module: Module,
    fn: Function,
    args: Sequence[Mixed],
    dev_slot: Mapping[Device, int],
    n_slots: int,
    slot_class: Sequence[Hashable],
) -> tuple[list[int], set[DTensorType], dict[tuple[Any, ...], Sequence[Mixed]], Trace, bool]:
    """The unit of every slot (units numbered 0..k-1 in order of their first slot), and the
    DTensor types the units were made for. Slots start as one unit, then are split by: each
    plain value's device (ops on plain values run on one device or a few), for each DTensor type
    the devices holding equally shaped pieces (a mesh is the union of those groups), and the GPU
    class. Every op then touches whole units, and within a unit every device holds the same bytes
    and costs alike: one clock and one memory figure per unit are exact. Also returns the result
    types of every op seen, keyed by (op, attributes, input types), and ``fn``'s final state and
    per-instruction arguments (``_TypeCollector.walk``), for the planner to reuse; and whether
    any value is a plain (per-device) one."""
    col = _TypeCollector(dev_slot)
    trace = col.walk(module, fn, args)
    for a in args:
        col.note(type_of(a))
    groups = device_groups(col.dtensors, col.devices, slot_of(dev_slot), slot_class)
    return split_units(groups, n_slots), set(col.dtensors), col.op_types, trace, bool(col.devices)


def slot_of(dev_slot: Mapping[Device, int]) -> Callable[[Device], int]:
    """A device's slot; an unmapped device is the program's error."""

    def slot(d: Device) -> int:
        try:
            return dev_slot[d]
        except KeyError:
            raise OpTypeError(f"device {d} is not mapped onto the cluster") from None

    return slot


class Units:
    """The plan's clocks and memory figures for one simulation (module docstring). ``dev_slot``
    maps a program device to its clock, ``slot_gpu`` a clock to its memory figure, ``dev_gpu`` a
    device to its real GPU (for costs); ``units`` lists each unit's real slots (None: the clocks
    are the real slots)."""

    def __init__(self, dmap: DeviceMap, cost: CostModel) -> None:
        self.cost = cost
        slot_index = {s: i for i, s in enumerate(dmap.slots)}
        self.dev_slot = {d: slot_index[s] for d, s in dmap.mapping.items()}
        self.slot_gpu = [s.gpu for s in dmap.slots]
        self.dev_gpu = {d: s.gpu for d, s in dmap.mapping.items()}
        # devices on a GPU's host (``HOST_STREAM``): their values live in host memory, not the
        # GPU's; their ops run on the node's CPUs; a transfer to or from them crosses PCIe
        self.host_devs = frozenset(d for d, s in dmap.mapping.items() if s.stream == HOST_STREAM)
        self.streams = dmap.slots
        self.units: list[tuple[int, ...]] | None = None
        self.gpu_figure: dict[int, int] = {}  # real GPU -> its memory figure (with units)
        self.prepared = False
        # a DTensor program without any plain (per-device) value: every op runs on a mesh
        self.all_dtensor = False
        # ``assume``: the units assumed, the types and plain devices the planner met, whether one
        # of them is unevenly sharded; how many calls were carried to another mesh (``relabel``)
        self._assumed = False
        self._assumed_units: list[int] = []
        self._attr_meshes: list[Mesh] = []
        self._slot_of: Callable[[Device], int] = slot_of(self.dev_slot)
        self._seen_dtensors: dict[DTensorType, None] = {}
        self._seen_devices: dict[Device, None] = {}
        # ``met_groups``: the groups of the types and devices seen, a memo of their meshes' slots,
        # and how many of ``_seen_dtensors`` and ``_seen_devices`` they hold
        self._groups: tuple[Groups, dict[int, tuple[Mesh, tuple[int, ...]]], int, int] | None = None
        self.uneven = False
        self.relabels = 0
        # while not None, every type noted (``PlanDomain.op``: what an op record's making noted,
        # replayed where the record is taken from ``SharedRecords`` instead)
        self.captured: list[Type] | None = None
        self._unit_types: set[DTensorType] | None = None  # the DTensor types units were made for
        # by id (see mesh_info), with the mesh kept alive
        self._mesh_units: dict[int, tuple[Mesh, tuple[tuple[int, Device, int, int], ...]]] = {}
        self._gpu_class: dict[int, Hashable] = {}
        # the cost memos below are shared by every domain on an equal cost model (``costmemo``)
        memos = cost_memos(cost)
        self._comm_memo: dict[tuple[Any, ...], float] = memos.comm
        self.local_costs: dict[tuple[Any, ...], tuple[float, float]] = memos.local_costs  # (seconds, FLOPs)
        self._dtensor_bytes: dict[DTensorType, list[tuple[int, float]]] = {}  # ``bytes_by_gpu``
        # the same by identity (the type kept alive): comparing two equal types compares meshes
        self._dtensor_bytes_ids: dict[int, tuple[DTensorType, list[tuple[int, float]]]] = {}
        # ``spmd.local_record``'s mesh-free part: (seconds, FLOPs, view, bytes per mesh unit)
        self.local_shapes: dict[tuple[Any, ...], LocalShape] = memos.local_shapes
        # result types per (op, attributes, input types) from ``prepare``'s pass over the program
        # (the same type domain): planning does not infer an op's types twice
        self.op_types: dict[tuple[Any, ...], Sequence[Mixed]] = {}
        # (the function prepared, its arguments) and its ``Trace``
        self._trace: tuple[Function, Sequence[Mixed], Trace] | None = None
        # GPU -> the clock of its compute stream (``compute_clocks``)
        self._compute_clocks: dict[int, int] | None = None

    @property
    def assumed(self) -> bool:
        """Whether the units were assumed from the entry's types (``assume``), not prepared."""
        return self._assumed

    def take_trace(self, fn: Function, args: Sequence[Mixed]) -> Trace | None:
        """``prepare``'s walk of ``fn`` (``_TypeCollector.walk``) when it prepared this very
        function on these very arguments (handed out once; the type domain is the planner's, so
        the values are what the planner's own walk would compute), else None."""
        t, self._trace = self._trace, None
        if t is not None and t[0] is fn and t[1] is args:
            return t[2]
        return None

    def prepare(self, module: Module, fn: Function, args: Sequence[Mixed]) -> None:
        """Before planning a DTensor program: group devices into units (``device_units``), and
        GPUs into memory figures: GPUs whose streams fall into the same units hold the same bytes."""
        self.prepared = True
        if not any(has_dtensor(type_of(a)) for a in args):
            return
        unit_of, self._unit_types, self.op_types, trace, plain = device_units(
            module, fn, args, self.dev_slot, len(self.slot_gpu), self._slot_classes()
        )
        self.all_dtensor = not plain
        self._trace = (fn, args, trace)
        self._finish(unit_of)

    def assume(self, module: Module, fn: Function, args: Sequence[Mixed], also: Sequence[Type] = ()) -> None:
        """``prepare`` without its pass over the program: the units the entry's parameter types
        and the meshes named by attributes call for (``grouping.attribute_meshes``), assuming the
        rest of the program adds no group — the planner notes every type it meets (``note``) and
        ``confirm`` checks the assumption afterwards. The planner then infers the types itself.
        ``also``: types known to be met too (noted after the arguments: units as fine as they
        call for, ``distir.sim.probe.GroupPlans``)."""
        self.prepared = True
        if not any(has_dtensor(type_of(a)) for a in args):
            return
        self._assumed = True
        self._slot_of = slot_of(self.dev_slot)  # by slot, before units replace slots
        for a in args:
            self.note(type_of(a))
        for t in also:
            self.note(t)
        self.all_dtensor = not self._seen_devices
        self._attr_meshes = attribute_meshes(module, fn)
        groups = device_groups(
            self._seen_dtensors, self._seen_devices, self._slot_of, self._slot_classes(), self._attr_meshes
        )
        # the uneven parameters' groups on the other streams of their GPUs (``sent_groups``): where
        # the program sends them, assuming them spares planning it twice; where it does not, the
        # units are only finer than needed, which changes no figure (``confirm``)
        gpu_of = self.dev_gpu.__getitem__
        groups.update(sent_groups(self._seen_dtensors, self._attr_meshes, self._slot_of, gpu_of))
        # ``confirm`` adds the groups of the types met since (a set: the same as all of them anew)
        self._groups = (groups, {}, len(self._seen_dtensors), len(self._seen_devices))
        self._assumed_units = split_units(groups, len(self.slot_gpu))
        self._finish(self._assumed_units)

    def note(self, t: Type) -> None:
        """A type the planner met (under ``assume``; a no-op after ``prepare``)."""
        if not self._assumed:
            return
        if self.captured is not None:  # kept with an op record shared with other domains
            self.captured.append(t)
        if isinstance(t, DTensorType):
            if t not in self._seen_dtensors:
                self._seen_dtensors[t] = None
                if uniform_shape(t) is None:
                    self.uneven = True
        elif isinstance(t, TupleType):
            for e in t.elements:
                self.note(e)
        else:
            self._seen_devices[t.device] = None
            self.all_dtensor = False  # as ``prepare`` would have found (no more carried calls)

    def met_types(self) -> list[Type]:
        """The DTensor types noted so far under ``assume``, in the order met."""
        return list(self._seen_dtensors)

    def confirm(self) -> bool:
        """Whether the units ``assume`` made are the ones ``prepare`` would have made, or finer: the
        types the planner met call for no group the assumed ones do not hold. (Finer units give
        the same figures: every op still touches whole units, whose devices still hold equal
        pieces and run alike; ``sent_groups``' guess may split a few more than needed.) (It meets
        every value's type but those in the bodies of calls carried to another mesh, ``relabel``:
        carried only while no type met is unevenly sharded, they are evenly sharded on that mesh,
        whose group is there already.)"""
        if not self._assumed:
            return True
        return split_units(self.met_groups(), len(self._assumed_units)) == self._assumed_units

    def met_groups(self) -> Groups:
        """``device_groups`` of every type met so far (and the meshes attributes name), kept up
        to date from ``assume`` on: each call adds only the types met since the last (a domain
        planning several programs, ``SharedPlans``, confirms after each)."""
        assert self._groups is not None
        groups, whole, n_dt, n_dev = self._groups
        dts, devs = self._seen_dtensors, self._seen_devices
        if len(dts) > n_dt or len(devs) > n_dev:
            add_groups(groups, whole, islice(dts, n_dt, None), islice(devs, n_dev, None), self._slot_of)
            self._groups = (groups, whole, len(dts), len(devs))
        return groups

    def _slot_classes(self) -> list[Hashable]:
        # a unit holds slots of one stream name (so never two slots of one GPU) and GPU class
        return [(gpu_class(self.cost, s.gpu), s.stream) for s in self.streams]

    def _finish(self, unit_of: list[int]) -> None:
        """Units from each slot's unit: split further until the GPUs of a unit have their other
        streams in equal units, then memory figures (GPUs whose slots fall into the same units)."""
        gpu_of = self.slot_gpu

        def signatures() -> dict[int, tuple[int, ...]]:
            """Per GPU, the units of its slots."""
            by_gpu: dict[int, list[int]] = {}
            for j, u in enumerate(unit_of):
                by_gpu.setdefault(gpu_of[j], []).append(u)
            return {g: tuple(sorted(us)) for g, us in by_gpu.items()}

        while True:
            sig = signatures()
            keys: dict[tuple[int, tuple[int, ...]], int] = {}
            split = [keys.setdefault((u, sig[gpu_of[j]]), len(keys)) for j, u in enumerate(unit_of)]
            if len(keys) == max(unit_of, default=-1) + 1:
                break
            unit_of = split
        figures: dict[tuple[int, ...], int] = {}
        self.gpu_figure = {g: figures.setdefault(us, len(figures)) for g, us in signatures().items()}
        n = max(unit_of, default=-1) + 1
        members: list[list[int]] = [[] for _ in range(n)]
        for j, u in enumerate(unit_of):
            members[u].append(j)
        self.units = [tuple(m) for m in members]
        self.dev_slot = {d: unit_of[j] for d, j in self.dev_slot.items()}
        self.slot_gpu = [self.gpu_figure[gpu_of[m[0]]] for m in members]
        self._mesh_units.clear()  # anything asked before was in terms of slots, not units
        self._compute_clocks = None
        self._dtensor_bytes.clear()
        self._dtensor_bytes_ids.clear()

    def compute_clocks(self) -> dict[int, int]:
        """GPU -> the clock of its compute stream (``distir.sim.interference``)."""
        if self._compute_clocks is None:
            self._compute_clocks = interference.compute_clocks(self.streams, self.units)
        return self._compute_clocks

    def mesh_units(self, mesh: Mesh) -> tuple[tuple[int, Device, int, int], ...]:
        """(unit, a device of it, that device's position in the mesh, devices of the mesh in it)
        for every unit the mesh covers."""
        hit = self._mesh_units.get(id(mesh))
        if hit is not None and hit[0] is mesh:
            return hit[1]
        acc: dict[int, list[Any]] = {}
        for i, d in enumerate(mesh.devices):
            try:
                u = self.dev_slot[d]
            except KeyError:
                raise OpTypeError(f"device {d} is not mapped onto the cluster") from None
            if u in acc:
                acc[u][3] += 1
            else:
                acc[u] = [u, d, i, 1]
        got = tuple((u, d, i, c) for u, d, i, c in acc.values())
        self._mesh_units[id(mesh)] = (mesh, got)
        return got

    def gpu_class_of(self, d: Device) -> Hashable:
        g = self.dev_gpu[d]
        c = self._gpu_class.get(g)
        if c is None:
            c = self._gpu_class[g] = gpu_class(self.cost, g)
        return (HOST_STREAM, c) if d in self.host_devs else c

    def op_seconds(
        self, d: OpDef, ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, dev: Device, link: Any
    ) -> float:
        """The cost model's time for a compute op on device ``dev``: on a host device the host's
        (``host_time``: its CPUs, no kernel fusion), else the GPU's (``fused_time`` when ``link``
        joins it to the kernel before)."""
        gpu = self.dev_gpu[dev]
        if dev in self.host_devs:
            return float(host_time(self.cost, d, ins, outs, attrs, gpu))
        if link is None:
            return float(self.cost.compute_time(d, ins, outs, attrs, gpu))
        return float(self.cost.fused_time(d, ins, outs, attrs, gpu, link))  # type: ignore[attr-defined]

    def comm_seconds(
        self, pattern: CommPattern, nbytes: float, group: tuple[Device, ...], coalesced: bool = False
    ) -> float:
        """The cost model's time for one collective (or P2P send: group = (source, dest));
        ``coalesced``: a later part of one call (``CommCost.coalesced``)."""
        gpus = tuple(map(self.dev_gpu.__getitem__, group))
        if pattern is CommPattern.P2P and (group[0] in self.host_devs) != (group[-1] in self.host_devs):
            # between a GPU and its host: a copy over its PCIe link
            hkey: tuple[Any, ...] = (HOST_STREAM, nbytes, gpus[0], gpus[-1])
            t = self._comm_memo.get(hkey)
            if t is None:
                t = self._comm_memo[hkey] = float(host_copy_time(self.cost, nbytes, gpus[0], gpus[-1]))
            return t
        key = (pattern, nbytes, gpus, coalesced)
        t = self._comm_memo.get(key)
        if t is None:
            cost = CommCost(pattern, nbytes, group, coalesced=coalesced)
            t = self._comm_memo[key] = float(self.cost.comm_time(cost, gpus))
        return t

    def bytes_by_gpu(self, t: Type) -> list[tuple[int, float]]:
        """(memory unit, bytes) of a value of type ``t``: a DTensor holds a piece on each device.
        A DTensor's answer is computed once per type (a pipeline entry has a parameter per weight
        and optimizer state, most of a few types); callers never modify the list."""
        if isinstance(t, DTensorType):
            pinned = self._dtensor_bytes_ids.get(id(t))  # a type met before as this very object
            if pinned is not None and pinned[0] is t:
                return pinned[1]
            got = self._dtensor_bytes.get(t)
            if got is None:
                if self._unit_types is not None and t not in self._unit_types:  # pragma: no cover
                    raise OpTypeError(f"internal: {t} was not seen when devices were grouped into units")
                host = self.host_devs  # a piece in host memory holds none of the GPU's
                got = [
                    (self.slot_gpu[u], 0.0 if d in host else piece_bytes(t, i))
                    for u, d, i, _c in self.mesh_units(t.mesh)
                ]
                self._dtensor_bytes[t] = got
            self._dtensor_bytes_ids[id(t)] = (t, got)
            return got
        if isinstance(t, TupleType):
            return [x for e in t.elements for x in self.bytes_by_gpu(e)]
        if self.host_devs and isinstance(t, TensorType) and t.device in self.host_devs:
            return [(self.slot_gpu[self.dev_slot[t.device]], 0.0)]  # in host memory: none of the GPU's
        return plain_bytes_by_gpu(t, self.dev_slot, self.slot_gpu)

    def sizes(self, outs: Sequence[Type], view: bool) -> Sizes:
        """Per result its bytes per GPU; all allocations (none for a view); their sum per GPU."""
        per = tuple(self.bytes_by_gpu(t) for t in outs)
        allocs = () if view else tuple(x for p in per for x in p)
        return per, allocs, per_gpu(allocs)


def plain_bytes_by_gpu(t: Type, dev_slot: dict[Any, int], slot_gpu: list[int]) -> list[tuple[int, float]]:
    if isinstance(t, TupleType):
        return [x for e in t.elements for x in plain_bytes_by_gpu(e, dev_slot, slot_gpu)]
    if isinstance(t, DTensorType):
        raise OpTypeError("DTensor values must be materialized into per-device tensors first")
    return [(slot_gpu[dev_slot[t.device]], float(t.nbytes))]


def has_dtensor(t: Type) -> bool:
    if isinstance(t, TupleType):
        return any(has_dtensor(e) for e in t.elements)
    return isinstance(t, DTensorType)


def leaves(t: Type) -> list[TensorType | ScalarType]:
    """The plain tensors and scalars of a (tuple) type."""
    if isinstance(t, TupleType):
        return [x for e in t.elements for x in leaves(e)]
    assert isinstance(t, TensorType | ScalarType)
    return [t]


def per_gpu(pairs: Sequence[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    """(gpu, bytes) pairs summed per GPU: all results of one op are live together."""
    if len(pairs) <= 1:
        return tuple(pairs)
    acc: dict[int, float] = {}
    for g, b in pairs:
        acc[g] = acc.get(g, 0.0) + b
    return tuple(acc.items())


__all__ = [
    "MeshInfo",
    "Trace",
    "Units",
    "device_units",
    "has_dtensor",
    "leaves",
    "local_piece",
    "mesh_info",
    "per_gpu",
    "piece_bytes",
    "plain_bytes_by_gpu",
    "shape_groups",
    "slot_of",
    "step_types",
    "uniform_shape",
]
