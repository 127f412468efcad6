"""Simulating DTensor programs directly (SPMD), without materializing them.

DistIR semantics for a distributed tensor: an op on DTensors runs synchronously on every device
of its mesh, each device working on its own piece (``distir.parallel.sharding.materialize``'s
``local_type``). So:

- a local op occupies all devices of its mesh for the *slowest* device's compute time on its
  local shard types (costed once per distinct local types and GPU class); FLOPs add up over the
  devices' shards;
- ``Redistribute`` runs ``redistribute_steps`` (the per-axis moves materialization lowers to),
  one after another; a step costs its slowest device group's collective (AllReduce, AllGather,
  ReduceScatter or AllToAll, message sizes of the local pieces as the comm ops of
  ``distir.ops.comm`` define them); Replicate→Shard is a local Slice, costed as compute; a
  ``coalesced`` one (a later part of one collective call over a flat buffer) costs its
  collectives' times less their times for an empty message — its bytes, not the call's latency;
- an attention op split along the sequence as a ring (``distir.parallel.sharding.ring``) is one
  record over its mesh: the ring's steps, each the longer of its blocks and its K/V transfer
  (``distir.sim.ring``);
- ``MeshSend`` occupies both meshes for the slowest pair's point-to-point send; ``MeshView``
  (the same pieces seen on a regrouped mesh) is a view that costs nothing;
- memory: every device holds its own piece of every DTensor value.

With even shards this gives exactly the step time and per-device peak memory of simulating the
materialized program. With uneven shards the step time is an upper bound: a materialized device
with a smaller piece goes on to its next op early, while here every device waits for the largest
piece (and counts that wait as busy: uneven batch shares show less idle time than their
materialized form); memory stays exact. Known differences from the materialized simulation:

- a constant of the logical program (a plain value) is made on its one device here, on every
  device of its users' meshes once materialized (small; it may add a unit for its device);
- a multi-step Redistribute frees a dying source after its first step (as the lowering does)
  only when the source is owned by the function; a dying *parameter* of a called function is
  held until the op ends (an upper bound);
- where the materialized program writes an empty piece (a Slice of zero rows), its simulator
  counts that op as a view, which keeps the input alive longer there;
- a ``MeshSend`` between overlapping meshes costs its slowest pair, while the lowering's Sends
  through a device in both meshes follow one another.

**Units.** A 1024-device program must not cost 1024 clocks per op. Before planning, a pass over
the program's types splits the devices into *units*: devices that every op touches together and
that hold equally shaped pieces of every value, on GPUs of one class (see ``device_units``). The
plan and its call summaries run over units, so a mesh of even shards is one clock and one memory
figure; the simulator expands units back into devices at the end.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from distir.ir.dtensor import DTensorType, Mesh, Partial, Replicate, Shard
from distir.ir.ops import Op
from distir.ir.types import ScalarType, TensorType, Type
from distir.ir.values import Attrs
from distir.ops.dist import MESH_SEND, MESH_VIEW, REDISTRIBUTE, redistribute_source
from distir.ops.dtensor_inference import mesh_free
from distir.ops.registry import REGISTRY, CommPattern, OpDef, OpKind, OpTypeError
from distir.parallel.sharding.materialize import local_offsets_at, unsupported_step
from distir.parallel.sharding.ring import ring_axis
from distir.sim.fusion import FusedInput
from distir.sim.layout import local_piece, mesh_info, piece_bytes, step_types, uniform_shape
from distir.sim.records import Collective, OpRecord
from distir.sim.ring import ring_record
from distir.sim.units import Units, per_gpu

_SLICE = REGISTRY["Slice"]


# -- op records -------------------------------------------------------------------------------------
def record(
    dom: Units, op: Op, d: OpDef, ins: Sequence[Type], outs: Sequence[Type], link: FusedInput | None = None
) -> OpRecord:
    """The plan record of an op on DTensors (see the module docstring); ``link``: how it joins
    the previous op's kernel (``distir.sim.fusion``)."""
    if op.name == REDISTRIBUTE.name:
        return redistribute_record(dom, op, ins, outs)
    if op.name == MESH_SEND.name:
        return mesh_send_record(dom, op, ins, outs)
    if op.name == MESH_VIEW.name:  # the same pieces on the same devices: a view, nothing moves
        devs = devs_of(dom.mesh_units(_mesh_of(op, ins)))
        return OpRecord(devs, 0.0, False, op.name, 0.0, True, *dom.sizes(outs, True), None)
    ax = ring_axis(op.name, op.attrs, ins)
    if ax is not None:  # attention as a ring along the sequence
        return ring_record(dom, op, ins, outs, ax)
    if d.kind is not OpKind.LOCAL:
        raise OpTypeError(
            f"{op.name} on distributed tensors: only local ops, Redistribute, MeshSend and MeshView can be "
            "simulated on DTensors"
        )
    return local_record(dom, op, d, ins, outs, link)


def _mesh_of(op: Op, types: Iterable[Type]) -> Mesh:
    mesh: Mesh | None = None
    for t in types:
        if isinstance(t, DTensorType) and t.mesh is not mesh:
            if mesh is not None and t.mesh != mesh:
                raise OpTypeError(f"{op.name} mixes tensors of different meshes", None, mesh, t.mesh)
            mesh = t.mesh
    assert mesh is not None
    return mesh


def local_record(
    dom: Units, op: Op, d: OpDef, ins: Sequence[Type], outs: Sequence[Type], link: FusedInput | None = None
) -> OpRecord:
    """A local op on DTensors: all of its mesh, for the slowest device's local compute.

    What does not depend on which devices the mesh has — the time, FLOPs, whether it is a view
    and each result's bytes per unit of the mesh — is computed once per (op, attributes, types
    without their meshes' devices, the mesh's axes and, per unit it covers, the unit's position,
    device count and GPU class; ``Units.local_shapes``): the same layer on every pipeline
    stage's mesh. Only the units and their memory figures are filled in per mesh."""
    mesh = _mesh_of(op, (*ins, *outs))
    units = dom.mesh_units(mesh)
    if not all(type(t) is DTensorType for t in outs):  # pragma: no cover - inference gives DTensors
        seconds, flops, view, _ = _local_shape(dom, op, d, ins, outs, mesh, link)
        return OpRecord(devs_of(units), seconds, False, op.name, flops, view, *dom.sizes(outs, view), None)
    key = (
        op.name,
        op.attrs,
        *map(mesh_free, ins),
        None,
        *map(mesh_free, outs),
        mesh.axes,
        *[(pos, count, dom.gpu_class_of(rep)) for _u, rep, pos, count in units],
        link,
    )
    got = dom.local_shapes.get(key)
    if got is None:
        got = dom.local_shapes[key] = _local_shape(dom, op, d, ins, outs, mesh, link)
    seconds, flops, view, per_bytes = got
    gpu_of = dom.slot_gpu
    gpus = [gpu_of[u] for u, *_ in units]
    per = tuple(list(zip(gpus, bs, strict=True)) for bs in per_bytes)
    allocs = () if view else tuple(x for p in per for x in p)
    return OpRecord(devs_of(units), seconds, False, op.name, flops, view, per, allocs, per_gpu(allocs), None)


def devs_of(units: Sequence[tuple[int, Any, int, int]]) -> tuple[int, ...]:
    """The units of ``Units.mesh_units``, sorted: the clocks an op on that mesh runs on."""
    return tuple(sorted(u for u, *_ in units))


def _local_shape(
    dom: Units,
    op: Op,
    d: OpDef,
    ins: Sequence[Type],
    outs: Sequence[Type],
    mesh: Mesh,
    link: FusedInput | None = None,
) -> tuple[float, float, bool, tuple[tuple[float, ...], ...]]:
    """``local_record``'s part that does not depend on the mesh's devices: seconds, FLOPs,
    whether it is a view, and per result its bytes on each unit of the mesh (in
    ``mesh_units`` order)."""
    x = ins[0] if ins else None
    if (
        d.family == "conv"
        and isinstance(x, DTensorType)
        and any(isinstance(p, Shard) and p.dim >= 2 for p in x.placements)
    ):
        raise OpTypeError(
            f"{op.name} with its input sharded along a spatial dim exchanges halo rows; the SPMD "
            "simulation does not model that: simulate the materialized program",
            0,
            "no spatial dim sharded",
            x,
        )
    seconds = 0.0
    flops = 0.0
    cache = dom.local_costs
    for _unit, rep, pos, count in dom.mesh_units(mesh):
        lins = [local_piece(t, rep, pos) for t in ins]
        louts = [local_piece(t, rep, pos) for t in outs]
        key = (
            op.name,
            op.attrs,
            *map(_shape_key, lins),
            None,
            *map(_shape_key, louts),
            dom.gpu_class_of(rep),
            link,
        )
        got = cache.get(key)
        if got is None:
            got = cache[key] = (
                dom.op_seconds(d, lins, louts, op.attrs, rep, link),
                float(d.flops(lins, louts, op.attrs)),
            )
        seconds = max(seconds, got[0])
        flops += got[1] * count
    view = bool(ins) and d.bytes_written(ins, outs, op.attrs) == 0
    per_bytes = tuple(tuple(b for _g, b in dom.bytes_by_gpu(t)) for t in outs if isinstance(t, DTensorType))
    return seconds, flops, view, per_bytes


def _shape_key(t: Type) -> Any:
    if isinstance(t, TensorType):
        return (t.dtype, t.shape)
    if isinstance(t, ScalarType):
        return (t.dtype,)
    return t


_PATTERN = {
    (Partial, Replicate): CommPattern.ALLREDUCE,
    (Shard, Replicate): CommPattern.ALLGATHER,
    (Partial, Shard): CommPattern.REDUCESCATTER,
    (Shard, Shard): CommPattern.ALLTOALL,
}


def redistribute_record(dom: Units, op: Op, ins: Sequence[Type], outs: Sequence[Type]) -> OpRecord:
    """``Redistribute``: its steps one after another, each as long as its slowest group (a
    collective per group of devices along the step's axis; Replicate→Shard a local Slice)."""
    src, dst = redistribute_source(ins[0], ins[1] if len(ins) > 1 else None), outs[0]
    assert isinstance(dst, DTensorType)
    mesh = src.mesh
    units = dom.mesh_units(mesh)
    devs = tuple(sorted(u for u, *_ in units))
    steps = step_types(src, dst)
    for *_, after in steps:  # the layouts it passes through (``Units.assume`` notes every type)
        dom.note(after)
    for ax, a, _before, after in steps:
        why = unsupported_step(mesh, ax, a, after.placements[ax])
        if why is not None:
            raise OpTypeError(f"Redistribute {why}", 0)
    # along an axis of one device every placement is the same piece (S(0), R and P(sum) of one
    # device all hold the whole): such a step moves nothing
    sizes_of = mesh.shape
    steps = [s for s in steps if sizes_of[s[0]] > 1]
    if not steps:  # nothing moves: the result is the input (a view)
        return OpRecord(devs, 0.0, False, op.name, 0.0, True, *dom.sizes(outs, True), None)
    info = mesh_info(mesh)
    coalesced = bool(op.attrs.get("coalesced"))  # ``distir.ops.dist``: a later part of one call
    seconds = 0.0
    communicates = False
    collective: Collective | None = None
    sizes: list[dict[int, float]] = []  # bytes per unit of each step's result
    for ax, a, before, after in steps:
        b = after.placements[ax]
        if isinstance(a, Replicate):  # R -> S: every device slices its own rows
            assert isinstance(b, Shard)
            step = 0.0
            for _unit, rep, pos, _count in units:
                lin, lout = local_piece(before, rep, pos), local_piece(after, rep, pos)
                assert isinstance(lout, TensorType)
                key = ("Slice", _shape_key(lin), _shape_key(lout), dom.gpu_class_of(rep))
                got = dom.local_costs.get(key)
                if got is None:
                    attrs = _slice_attrs(before, after, b.dim, pos, lout.shape[b.dim])
                    gpu = dom.dev_gpu[rep]
                    got = dom.local_costs[key] = (
                        float(dom.cost.compute_time(_SLICE, [lin], [lout], attrs, gpu)),
                        0.0,
                    )
                step = max(step, got[0])
        else:
            communicates = True
            pattern = _PATTERN[(type(a), type(b))]
            # message sizes as the comm ops define them: the gathered result for AllGather, the
            # first participant's input otherwise
            sized = after if pattern is CommPattern.ALLGATHER else before
            if len(steps) == 1:
                collective = Collective(pattern, sizes_of[ax])
            step = 0.0
            for g in info.groups(ax):
                group = tuple(mesh.devices[i] for i in g)
                seconds_of = dom.comm_seconds(pattern, piece_bytes(sized, g[0]), group, coalesced)
                if coalesced:  # a later part of one call: its bytes only, the latency paid once
                    seconds_of -= dom.comm_seconds(pattern, 0.0, group)
                step = max(step, seconds_of)
        seconds += step
        sizes.append({u: piece_bytes(after, pos) for u, _rep, pos, _c in units})
    per, allocs, bump = dom.sizes(outs, False)
    dying: tuple[tuple[int, float], ...] | None = None
    if len(sizes) > 1:  # intermediate layouts: step j holds step j-1's result and its own
        src_b = {u: piece_bytes(src, pos) for u, _rep, pos, _c in units}
        held = {u: max(sizes[j - 1][u] + sizes[j][u] for j in range(1, len(sizes))) for u in sizes[0]}
        gpu_of = dom.slot_gpu
        bump = _summed((gpu_of[u], max(sizes[0][u], held[u])) for u in sizes[0])
        # when the source dies here, it is freed after the first step (as in the lowering)
        dying = _summed((gpu_of[u], max(sizes[0][u], held[u] - src_b[u])) for u in sizes[0])
    return OpRecord(devs, seconds, communicates, op.name, 0.0, False, per, allocs, bump, dying, collective)


def _slice_attrs(before: DTensorType, after: DTensorType, dim: int, position: int, size: int) -> Attrs:
    """The ``Slice`` a device at ``position`` runs for an R -> S step: its rows of the piece it
    holds (``before``: a dim other axes shard too starts past 0)."""
    coords = mesh_info(after.mesh).coords[position]
    start = local_offsets_at(after, coords)[dim] - local_offsets_at(before, coords)[dim]
    return Attrs({"starts": [start], "ends": [start + size], "axes": [dim]})


def _summed(pairs: Iterable[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    acc: dict[int, float] = {}
    for g, b in pairs:
        acc[g] = acc.get(g, 0.0) + b
    return tuple(acc.items())


def mesh_send_record(dom: Units, op: Op, ins: Sequence[Type], outs: Sequence[Type]) -> OpRecord:
    """``MeshSend``: both meshes, for the slowest (source device, destination device) send."""
    src, dst = ins[0], outs[0]
    assert isinstance(src, DTensorType) and isinstance(dst, DTensorType)
    seconds = 0.0
    even = uniform_shape(src) is not None  # every piece the same bytes: computed once
    nbytes = piece_bytes(src, 0) if even else 0.0
    for i, (a, b) in enumerate(zip(src.mesh.devices, dst.mesh.devices, strict=True)):
        sized = nbytes if even else piece_bytes(src, i)
        seconds = max(seconds, dom.comm_seconds(CommPattern.P2P, sized, (a, b)))
    devs = tuple(sorted({u for m in (src.mesh, dst.mesh) for u, *_ in dom.mesh_units(m)}))
    return OpRecord(devs, seconds, True, op.name, 0.0, False, *dom.sizes(outs, False), None)


__all__ = ["local_record", "mesh_send_record", "record", "redistribute_record"]
