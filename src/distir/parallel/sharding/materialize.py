"""Materialization: a legalized DTensor program becomes an explicit DistIR program over its meshes'
devices, with local shapes — one value per device for every distributed tensor.

- Calls are inlined first (layer functions get the types of each call site). A program may use
  any number of meshes (one per pipeline stage): each value's pieces live on its own mesh.
- A parameter ``%x: DTensor[...]`` becomes one parameter per device, ``%x.d0``, ``%x.d1``, ...,
  each typed with that device's local shape. Shards may be uneven (127 rows over 2 devices: 64
  and 63) — no padding.
- A local op runs once per device on the local pieces; a ``Reshape`` gets its local target shape
  (a constant shape input, or the ``shape`` attribute when the op uses the attribute form), and
  an op with a ``localize`` rule the attributes of its pieces (e.g. a vocabulary-sharded
  ``Gather`` the first row its table piece holds).
  A local op runs on the mesh of its DTensor values (mixing meshes is an error). Constants of
  the logical program are made on every device of the meshes of the ops that use them.
- ``Redistribute`` is lowered, one mesh axis at a time, per group of devices along that axis:
  Partial→Replicate = AllReduce, Shard→Replicate = AllGather, Partial→Shard = ReduceScatter,
  Shard(i)→Shard(j) = AllToAll, Replicate→Shard = a local Slice (``redistribute_steps`` orders
  the per-axis moves; the simulator costs DTensor programs with the same steps).
- An attention op whose sequence is split over a mesh axis as a ring (the ``ring`` attribute)
  becomes the explicit ring of ``distir.parallel.context`` per group along that axis
  (``distir.parallel.sharding.ring``).
- ``MeshSend`` becomes one ``Send`` per device of the source mesh, to the device at the same
  coordinates of the destination mesh; ``MeshView`` becomes nothing (each device's piece is its
  input's).
- Parameters and results become their per-device pieces, in parameter (result) order, each in
  its mesh's device order.

The output is an ordinary global program: it verifies, type-checks, simulates, runs on the
reference executor, and ``distir.interp.project`` turns it into per-rank programs;
``shared_programs`` groups ranks whose programs are identical.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from distir.interp.annotate import annotate_types
from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import DTensorType, Mesh, Partial, Placement, Replicate, Shard, shares_of, split_sizes
from distir.ir.function import Function, Module
from distir.ir.ops import Op
from distir.ir.printer import print_module, print_op
from distir.ir.rewrite import inline_calls
from distir.ir.types import Device, TensorType
from distir.ir.values import Attrs, Value
from distir.ops.conv import CONV, halo_rows, input_range_for_output, window_of
from distir.ops.dist import MESH_SEND, MESH_VIEW, REDISTRIBUTE, redistribute_source
from distir.ops.registry import REGISTRY, LocalPiece, OpKind
from distir.ops.shape.views import RESHAPE
from distir.parallel.sharding.propagate import ShardingError, shards_one_dim_twice
from distir.parallel.sharding.ring import lower_ring


def local_shape(t: DTensorType, device: Device) -> tuple[int, ...]:
    """The shape of ``device``'s piece of ``t``."""
    return local_shape_at(t, t.mesh.coords(device))


def local_shape_at(t: DTensorType, coords: Sequence[int]) -> tuple[int, ...]:
    """The shape of the piece of ``t`` at mesh coordinates ``coords``: a dim sharded along
    several mesh axes is split by each in mesh-axis order, each splitting the piece the axes
    before it left (``[S(1), S(1)]`` over (cp, tp): tp splits each cp rank's block), as DTensor
    nests ``[Shard(1), Shard(1)]``."""
    shape = list(t.shape)
    for ax, p in enumerate(t.placements):
        if isinstance(p, Shard):
            shape[p.dim] = split_sizes(shape[p.dim], t.mesh.shape[ax])[coords[ax]]
    return tuple(shape)


def local_offsets(t: DTensorType, device: Device) -> tuple[int, ...]:
    """Where ``device``'s piece starts in the global tensor, per dim (nested as ``local_shape_at``
    splits: each axis' offset within the piece the axes before it left)."""
    return local_offsets_at(t, t.mesh.coords(device))


def local_offsets_at(t: DTensorType, coords: Sequence[int]) -> tuple[int, ...]:
    """``local_offsets`` at mesh coordinates ``coords``."""
    off = [0] * len(t.shape)
    size = list(t.shape)
    for ax, p in enumerate(t.placements):
        if isinstance(p, Shard):
            sizes = split_sizes(size[p.dim], t.mesh.shape[ax])
            off[p.dim] += sum(sizes[: coords[ax]])
            size[p.dim] = sizes[coords[ax]]
    return tuple(off)


def local_type(t: DTensorType, device: Device) -> TensorType:
    return TensorType(t.dtype, local_shape(t, device), device)


def materialize(module: Module) -> Module:
    """The explicit per-device program of a legalized DTensor program (module docstring)."""
    fn = _flat_typed(module)
    fb = FunctionBuilder(fn.name, REGISTRY.out_arity)
    local: dict[tuple[Value, Device], Value] = {}
    logical: dict[Value, Value] = {}  # plain values of the logical program (constants)
    const_devices = _constant_devices(fn)

    def piece(v: Value, d: Device) -> Value:
        got = local.get((v, d))
        if got is None:
            raise ShardingError(f"%{v.name} has no piece on {d} (is it a DTensor of this mesh?)")
        return got

    for p in fn.params:
        t = p.type
        if not isinstance(t, DTensorType):
            raise ShardingError(f"parameter %{p.name} of @{fn.name} must be a DTensor, got {t}")
        for d in t.mesh.devices:
            local[(p, d)] = fb.param(f"{p.name}.{d}", local_type(t, d))
    for instr in fn.body:
        if not isinstance(instr, Op):  # pragma: no cover - _flat_typed inlined every call
            raise ShardingError("calls must be inlined before materialization")
        if instr.name == REDISTRIBUTE.name:
            _redistribute(fb, instr, _op_mesh(instr), local)
            continue
        if instr.name == MESH_SEND.name:
            _mesh_send(fb, instr, local)
            continue
        if instr.name == MESH_VIEW.name:  # every device keeps its piece
            x, y = instr.inputs[0], instr.outputs[0]
            assert isinstance(y.type, DTensorType)
            for d in y.type.mesh.devices:
                local[(y, d)] = local[(x, d)]
            continue
        if REGISTRY[instr.name].kind is not OpKind.LOCAL:
            raise ShardingError(
                f"`{print_op(instr)}`: only local ops, Redistribute, MeshSend and MeshView can be "
                "materialized"
            )
        if not instr.inputs:  # a constant of the logical program: one per device of its users' meshes
            for d in const_devices[instr.outputs[0]]:
                attrs = Attrs({**dict(instr.attrs.items()), "device": d})
                outs = fb.emit(instr.name, (), attrs, [f"{o.name}.{d}" for o in instr.outputs])
                for o, lo in zip(instr.outputs, outs, strict=True):
                    local[(o, d)] = lo
            logical.update({o: o for o in instr.outputs})
            continue
        if all(v in logical for v in instr.inputs) and instr.outputs[0] in const_devices:
            _derived_constant(fb, instr, const_devices[instr.outputs[0]], local)
            logical.update({o: o for o in instr.outputs})
            continue
        for o in instr.outputs:
            if not isinstance(o.type, DTensorType):
                raise ShardingError(f"`{print_op(instr)}`: results of sharded ops must be DTensors")
        mesh = _op_mesh(instr)
        if REGISTRY[instr.name].family == "conv" and _halo(fb, instr, mesh, local):
            continue
        if lower_ring(fb, instr, mesh, local):  # attention as a ring along the sequence
            continue
        localize = REGISTRY[instr.name].localize
        for d in mesh.devices:
            ins = [piece(v, d) for v in instr.inputs]
            attrs = instr.attrs
            if localize is not None:  # attributes holding global sizes or positions
                attrs = localize(attrs, _pieces(instr.inputs, d), _pieces(instr.outputs, d))
            if instr.name == RESHAPE.name:  # the local target shape; allowzero: an empty piece's 0 is literal
                target = local_shape(instr.outputs[0].type, d)  # type: ignore[arg-type]
                if len(ins) == 2:
                    (ins[1],) = fb.op(
                        "Constant", names=[f"{instr.outputs[0].name}_shape.{d}"], value=list(target), device=d
                    )
                    attrs = Attrs({**dict(instr.attrs.items()), "allowzero": 1})
                else:
                    attrs = Attrs({**dict(instr.attrs.items()), "allowzero": 1, "shape": tuple(target)})
            outs = fb.emit(
                instr.name,
                ins,
                attrs,
                [f"{o.name}.{d}" for o in instr.outputs],
                [local_type(o.type, d) for o in instr.outputs],  # type: ignore[arg-type]
            )
            for o, lo in zip(instr.outputs, outs, strict=True):
                local[(o, d)] = lo
    results = [
        piece(v, d)
        for v in fn.outputs
        for d in (v.type.mesh.devices if isinstance(v.type, DTensorType) else const_devices[v])
    ]
    return Module((fb.ret(*results),))


def _pieces(vs: Sequence[Value], d: Device) -> list[LocalPiece | None]:
    """``device``'s piece of each of ``vs`` (None for a value that is not distributed)."""
    return [
        LocalPiece(local_offsets(t, d), local_shape(t, d), t.shape) if isinstance(t, DTensorType) else None
        for t in (v.type for v in vs)
    ]


def _flat_typed(module: Module) -> Function:
    """The entry with every call inlined and every value typed (layer functions are often written
    untyped; their values get the types of each call site)."""
    fn = module.entry
    typed = all(v.type is not None for v in fn.params) and all(
        isinstance(i, Op) and all(v.type is not None for v in i.outputs) for i in fn.body
    )
    if typed:
        return fn
    return annotate_types(Module((inline_calls(module),))).entry


def _op_mesh(op: Op) -> Mesh:
    """The one mesh of an op's distributed values (a local op runs on the mesh of its DTensors)."""
    meshes: dict[Mesh, None] = {}
    for v in (*op.inputs, *op.outputs):
        if isinstance(v.type, DTensorType):
            meshes[v.type.mesh] = None
    if len(meshes) != 1:
        found = ", ".join(map(str, meshes)) or "none"
        raise ShardingError(f"`{print_op(op)}` must run on one mesh; its DTensors are on: {found}")
    return next(iter(meshes))


def _constant_devices(fn: Function) -> dict[Value, tuple[Device, ...]]:
    """Where each constant of the logical program (a plain value) is made: on every device of the
    meshes of the ops that use it; an unused one on the meshes holding its ``device`` (or on the
    program's only mesh). A value computed from constants alone (an imported model's positions,
    ``Range`` then ``Unsqueeze``) is a constant made where it is used, and so are its inputs."""
    meshes: dict[Mesh, None] = {}
    users: dict[Value, dict[Device, None]] = {}
    consts: list[tuple[Value, object]] = []
    derived: list[Op] = []
    for v in fn.params:
        if isinstance(v.type, DTensorType):
            meshes[v.type.mesh] = None
    for instr in fn.body:
        if not isinstance(instr, Op):  # pragma: no cover - inlined
            continue
        dts = [v.type.mesh for v in (*instr.inputs, *instr.outputs) if isinstance(v.type, DTensorType)]
        meshes.update(dict.fromkeys(dts))
        if not instr.inputs:
            consts.extend((o, instr.attrs.get("device")) for o in instr.outputs)
            continue
        if not dts:  # computed from constants alone: a constant too
            derived.append(instr)
            continue
        for v in instr.inputs:
            if not isinstance(v.type, DTensorType):
                for m in dts:
                    users.setdefault(v, {}).update(dict.fromkeys(m.devices))
    for instr in reversed(derived):  # made where its results are used, its inputs with it
        devs: dict[Device, None] = {}
        for o in instr.outputs:
            devs.update(users.get(o, {}))
        for v in instr.inputs:
            users.setdefault(v, {}).update(devs)
    made = [(o, getattr(o.type, "device", None)) for op in derived for o in op.outputs]
    out: dict[Value, tuple[Device, ...]] = {}
    for v, dev in (*consts, *made):
        if v in users:
            out[v] = tuple(users[v])
            continue
        holding = list(meshes) if len(meshes) == 1 else [m for m in meshes if dev in m.devices]
        if not holding:
            raise ShardingError(
                f"constant %{v.name} is used by no sharded op and its device {dev} is on none of the meshes"
            )
        out[v] = tuple(dict.fromkeys(d for m in holding for d in m.devices))
    return out


def _derived_constant(
    fb: FunctionBuilder, op: Op, devices: Sequence[Device], local: dict[tuple[Value, Device], Value]
) -> None:
    """An op of constants alone (``_constant_devices``), once on each of ``devices``."""
    for d in devices:
        outs = fb.emit(
            op.name,
            [local[(v, d)] for v in op.inputs],
            op.attrs,
            [f"{o.name}.{d}" for o in op.outputs],
            [replace(o.type, device=d) if isinstance(o.type, TensorType) else o.type for o in op.outputs],
        )
        for o, lo in zip(op.outputs, outs, strict=True):
            local[(o, d)] = lo


def _mesh_send(fb: FunctionBuilder, op: Op, local: dict[tuple[Value, Device], Value]) -> None:
    """``MeshSend``: one ``Send`` per device of the source mesh, to the device at the same
    coordinates of the destination mesh."""
    x, y = op.inputs[0], op.outputs[0]
    src, dst = x.type, y.type
    assert isinstance(src, DTensorType) and isinstance(dst, DTensorType)
    event = {"event": True} if op.attrs.get("event") else {}  # a hand-over between streams
    for a, b in zip(src.mesh.devices, dst.mesh.devices, strict=True):
        (local[(y, b)],) = fb.op(
            "Send", local[(x, a)], names=[f"{y.name}.{b}"], types=[local_type(dst, b)], dst=b, **event
        )


def _halo(fb: FunctionBuilder, op: Op, mesh: Mesh, local: dict[tuple[Value, Device], Value]) -> bool:
    """A sliding-window op (Conv, pooling) whose input is sharded along a spatial dim: each device
    gathers the input rows its output rows read — its own shard plus halo rows Sent by its
    neighbours — and runs the op with the padding of its piece (the RFC's Example 2). Returns
    False when no spatial dim is sharded (the op then runs on local pieces as usual)."""
    x_v, y_v = op.inputs[0], op.outputs[0]
    xt, yt = x_v.type, y_v.type
    assert isinstance(xt, DTensorType) and isinstance(yt, DTensorType)
    spatial = [(ax, p.dim) for ax, p in enumerate(xt.placements) if isinstance(p, Shard) and p.dim >= 2]
    if not spatial:
        return False
    if len(spatial) > 1:
        raise ShardingError(f"`{print_op(op)}`: only one spatial dim may be sharded")
    ax, dim = spatial[0]
    if op.name == CONV.name:
        w = op.inputs[1].type
        assert isinstance(w, DTensorType | TensorType)
        kernel = w.shape[2:]
    else:
        kernel = tuple(x for x in op.attrs.get("kernel_shape", ()) if isinstance(x, int))  # type: ignore[union-attr]
    win = window_of(op.attrs, kernel)
    i, r = dim - 2, len(kernel)
    for group in mesh.groups(ax):
        owned = {
            e: (local_offsets(xt, e)[dim], local_offsets(xt, e)[dim] + local_shape(xt, e)[dim]) for e in group
        }
        for d in group:
            o0 = local_offsets(yt, d)[dim]
            o1 = o0 + local_shape(yt, d)[dim]
            lo, hi = input_range_for_output(
                o0, o1, win.kernel[i], win.strides[i], win.pads_begin[i], win.dilations[i]
            )
            start, stop, pad_b, pad_e = halo_rows(lo, hi, xt.shape[dim])
            parts: list[Value] = []
            for e in group:
                a, b = max(start, owned[e][0]), min(stop, owned[e][1])
                if a >= b:
                    continue
                piece = local[(x_v, e)]
                if (a, b) != owned[e]:
                    (piece,) = fb.op(
                        "Slice",
                        piece,
                        names=[f"{x_v.name}_halo.{e}"],
                        starts=[a - owned[e][0]],
                        ends=[b - owned[e][0]],
                        axes=[dim],
                    )
                if e != d:
                    (piece,) = fb.op("Send", piece, names=[f"{x_v.name}_halo.{d}"], dst=d)
                parts.append(piece)
            if len(parts) > 1:
                (x_d,) = fb.op("Concat", *parts, names=[f"{x_v.name}_win.{d}"], axis=dim)
            else:
                x_d = parts[0]
            pads = [*win.pads_begin, *win.pads_end]
            pads[i], pads[i + r] = pad_b, pad_e
            attrs = Attrs({**dict(op.attrs.items()), "pads": pads})
            ins = [x_d, *(local[(v, d)] for v in op.inputs[1:])]
            (local[(y_v, d)],) = fb.emit(op.name, ins, attrs, [f"{y_v.name}.{d}"], [local_type(yt, d)])
    return True


def _redistribute(fb: FunctionBuilder, op: Op, mesh: Mesh, local: dict[tuple[Value, Device], Value]) -> None:
    src_v, dst_v = op.inputs[0], op.outputs[0]
    like = op.inputs[1].type if len(op.inputs) > 1 else None
    src, dst = redistribute_source(src_v.type, like), dst_v.type  # type: ignore[arg-type]
    assert isinstance(dst, DTensorType)
    cur = list(src.placements)
    pieces = {d: local[(src_v, d)] for d in mesh.devices}
    coalesced = bool(op.attrs.get("coalesced"))
    for ax, b in redistribute_steps(src.placements, dst.placements, mesh.shape):
        nxt = [*cur]
        nxt[ax] = b
        t_cur, t_next = src.with_placements(tuple(cur)), src.with_placements(tuple(nxt))
        if mesh.shape[ax] == 1:  # one device holds the whole along this axis: nothing moves
            cur = nxt
            continue
        why = unsupported_step(mesh, ax, cur[ax], b)
        if why is not None:
            raise ShardingError(f"`{print_op(op)}`: {why}")
        for group in mesh.groups(ax):
            ins = [pieces[d] for d in group]
            outs = _lower(fb, cur[ax], b, ins, group, (t_cur, t_next), dst_v.name, print_op(op), coalesced)
            for d, o in zip(group, outs, strict=True):
                pieces[d] = o
        cur = nxt
    for d in mesh.devices:
        local[(dst_v, d)] = pieces[d]


def unsupported_step(mesh: Mesh, ax: int, a: Placement, b: Placement) -> str | None:
    """Why the step ``a -> b`` along ``mesh``'s axis ``ax`` has no lowering, or None: along an axis
    with uneven shares, ReduceScatter and AllToAll would split near-equally. The simulator refuses
    what materialization cannot lower (``distir.sim.spmd``)."""
    if shares_of(mesh.shape[ax]) is not None and isinstance(b, Shard) and not isinstance(a, Replicate):
        return f"{a} -> {b} along mesh axis {mesh.axes[ax][0]} with uneven shares is not supported yet"
    return None


def redistribute_steps(
    src: Sequence[Placement], dst: Sequence[Placement], sizes: Sequence[int] | None = None
) -> list[tuple[int, Placement]]:
    """One-axis moves (axis, new placement) from ``src`` to ``dst``, each one a collective along
    its axis can do (``step_lowers``; ``sizes``: the mesh's axis sizes, when known). When neither
    end shards a dim along two mesh axes, no intermediate layout does either: moves to Replicate
    first, then any move whose result is valid; when none is (``[S(0), S(1)] -> [S(1), S(0)]``),
    a blocking axis is replicated first. Otherwise (``_nested_steps``) a dim is gathered from its
    innermost axis out and split from its outermost in, as DTensor redistributes nested shards."""
    if shards_one_dim_twice(src) or shards_one_dim_twice(dst):
        return _nested_steps(src, dst, sizes or (2,) * len(src))
    cur = list(src)
    steps: list[tuple[int, Placement]] = []

    def ok(ax: int, p: Placement) -> bool:
        return not isinstance(p, Shard) or all(q != p for k, q in enumerate(cur) if k != ax)

    while cur != list(dst):
        todo = [ax for ax in range(len(cur)) if cur[ax] != dst[ax]]
        ax = next((ax for ax in todo if isinstance(dst[ax], Replicate)), None)
        ax = ax if ax is not None else next((ax for ax in todo if ok(ax, dst[ax])), None)
        if ax is not None:
            move = dst[ax]
        else:  # every move collides with a shard of another axis: replicate that axis first
            ax = next((k for k in todo if not isinstance(cur[k], Replicate)), todo[0])
            move = dst[ax] if isinstance(cur[ax], Replicate) else Replicate()  # (an invalid target: reported)
        steps.append((ax, move))
        cur[ax] = move
    return steps


def step_lowers(places: Sequence[Placement], ax: int, b: Placement, sizes: Sequence[int]) -> bool:
    """Whether a collective along axis ``ax`` (of a mesh of axis sizes ``sizes``) alone moves
    ``places`` to ``b`` there: the dims it gathers or splits (``places[ax]``'s and ``b``'s) are
    sharded by no later axis of more than one device. A later axis splits each of this axis'
    pieces further, so a device along ``ax`` holds a scattered part of the block this axis gives
    out; along the innermost axis of a dim the pieces are contiguous parts of the block the axes
    before it leave (an AllGather over tp of ``[S(1), S(1)]`` on (cp, tp) gives each cp rank's
    block). Along an axis of one device nothing moves: every step lowers."""
    if sizes[ax] == 1:
        return True
    dims = {p.dim for p in (places[ax], b) if isinstance(p, Shard)}
    later = range(ax + 1, len(places))
    return not any(isinstance(q := places[k], Shard) and q.dim in dims and sizes[k] > 1 for k in later)


def _nested_steps(
    src: Sequence[Placement], dst: Sequence[Placement], sizes: Sequence[int]
) -> list[tuple[int, Placement]]:
    """``redistribute_steps`` when an end nests a dim: the moves to Replicate that lower, then the
    rest in mesh-axis order, each axis' move once every later axis blocking it (``step_lowers``)
    is replicated (an axis so replicated is moved to its target when its turn comes)."""
    cur = list(src)
    steps: list[tuple[int, Placement]] = []

    def move(ax: int, p: Placement) -> None:
        steps.append((ax, p))
        cur[ax] = p

    changed = True
    while changed:  # gathers first, innermost out: each may unblock the one before it
        changed = False
        for ax in reversed(range(len(cur))):
            if cur[ax] != dst[ax] and isinstance(dst[ax], Replicate) and step_lowers(cur, ax, dst[ax], sizes):
                move(ax, dst[ax])
                changed = True
    for ax in range(len(cur)):
        if cur[ax] == dst[ax]:
            continue
        while not step_lowers(cur, ax, dst[ax], sizes):
            dims = {p.dim for p in (cur[ax], dst[ax]) if isinstance(p, Shard)}
            # the innermost blocker: no later axis shards its dim, so its gather lowers
            later = range(ax + 1, len(cur))
            inner = max(k for k in later if isinstance(q := cur[k], Shard) and q.dim in dims and sizes[k] > 1)
            move(inner, Replicate())
        move(ax, dst[ax])
    return steps


def _lower(
    fb: FunctionBuilder,
    a: Placement,
    b: Placement,
    ins: Sequence[Value],
    group: Sequence[Device],
    layouts: tuple[DTensorType, DTensorType],
    name: str,
    where: str,
    coalesced: bool = False,
) -> Sequence[Value]:
    """The collective (or slices) moving one group's pieces from ``a`` to ``b`` along an axis;
    ``layouts``: the tensor before and after the step."""
    t_cur, t_next = layouts
    names = [f"{name}.{d}" for d in group]
    types = [local_type(t_next, d) for d in group]
    part = {"coalesced": True} if coalesced else {}  # a later part of one call, as the Redistribute
    if isinstance(a, Partial) and isinstance(b, Replicate):
        return fb.op("AllReduce", *ins, names=names, types=types, op=a.op, **part)
    if isinstance(a, Shard) and isinstance(b, Replicate):
        return fb.op("AllGather", *ins, names=names, types=types, dim=a.dim, **part)
    if isinstance(a, Partial) and isinstance(b, Shard):
        return fb.op("ReduceScatter", *ins, names=names, types=types, dim=b.dim, op=a.op, **part)
    if isinstance(a, Shard) and isinstance(b, Shard):
        return fb.op("AllToAll", *ins, names=names, types=types, split_dim=b.dim, concat_dim=a.dim, **part)
    if isinstance(a, Replicate) and isinstance(b, Shard):
        outs = []
        for v, d, t in zip(ins, group, types, strict=True):
            # within the piece the device holds (a dim other axes shard too starts past 0)
            start = local_offsets(t_next, d)[b.dim] - local_offsets(t_cur, d)[b.dim]
            (o,) = fb.op(
                "Slice",
                v,
                names=[f"{name}.{d}"],
                types=[t],
                starts=[start],
                ends=[start + t.shape[b.dim]],
                axes=[b.dim],
            )
            outs.append(o)
        return outs
    raise ShardingError(f"{where}: cannot redistribute {a} to {b}")


# -- values: splitting global arrays into pieces and putting them back --------------------------
def shard_value(x: Any, t: DTensorType) -> dict[Device, np.ndarray]:
    """Each device's piece of the global array ``x`` laid out as ``t`` (partials: device
    coordinate 0 along each partial axis holds the value, the others zeros)."""
    arr = np.asarray(x)
    out: dict[Device, np.ndarray] = {}
    for d in t.mesh.devices:
        off, shape = local_offsets(t, d), local_shape(t, d)
        sl = tuple(slice(o, o + s) for o, s in zip(off, shape, strict=True))
        piece = np.array(arr[sl], copy=True)
        coords = t.mesh.coords(d)
        if any(
            isinstance(p, Partial) and p.op == "sum" and coords[ax] != 0 for ax, p in enumerate(t.placements)
        ):
            piece = np.zeros_like(piece)  # (max, min, mean of copies of the value: the value)
        out[d] = piece
    return out


def unshard_value(pieces: Mapping[Device, Any], t: DTensorType) -> np.ndarray:
    """The global array from its pieces (reduces partial axes with their op, in axis order as
    the lowering does; takes any copy of replicas)."""
    from distir.ops.comm import reduce_arrays

    arrays = {d: np.asarray(pieces[d]) for d in t.mesh.devices}
    for ax, p in enumerate(t.placements):
        if isinstance(p, Partial):
            for group in t.mesh.groups(ax):
                r = reduce_arrays([arrays[d] for d in group], p.op)
                arrays.update({d: r for d in group})
    first = arrays[t.mesh.devices[0]]
    out = np.zeros(t.shape, dtype=first.dtype)
    filled = np.zeros(t.shape, dtype=bool)
    for d in t.mesh.devices:
        off, shape = local_offsets(t, d), local_shape(t, d)
        sl = tuple(slice(o, o + s) for o, s in zip(off, shape, strict=True))
        if not filled[sl].all():
            out[sl] = arrays[d]
            filled[sl] = True
    return out


def shared_programs(ranks: Mapping[Device, Module]) -> list[tuple[tuple[Device, ...], Module]]:
    """Group ranks whose per-rank programs are the same once each rank's own device is renamed
    (identical ranks share one program); groups in order of their first device."""
    groups: dict[str, list[Device]] = {}
    first: dict[str, Module] = {}
    for d, m in sorted(ranks.items()):
        text = print_module(m)
        groups_attr = re.findall(r"group=\[[^\]]*\]", text)  # the same list on every member: keep
        text = re.sub(r"group=\[[^\]]*\]", "group=<>", text)
        key = re.sub(rf"\b{d}\b", "d?", text)
        for g in groups_attr:
            key = key.replace("group=<>", g, 1)
        key = re.sub(r"%([A-Za-z0-9_]+)\.d\?", r"%\1", key)
        groups.setdefault(key, []).append(d)
        first.setdefault(key, m)
    return [(tuple(devs), first[k]) for k, devs in groups.items()]


__all__ = [
    "local_offsets_at",
    "local_shape",
    "local_shape_at",
    "local_type",
    "materialize",
    "redistribute_steps",
    "shard_value",
    "shared_programs",
    "step_lowers",
    "unshard_value",
]
