"""Ops of sharded (DTensor) programs: ``Redistribute`` changes a distributed tensor's placements;
``MeshSend`` moves one to another mesh (the next pipeline stage); ``MeshView`` sees one on its
devices with the mesh axes regrouped (no data moves).

``%z: DTensor[..., [R]] = Redistribute(%z1, to="R")`` is the explicit point where a value moves
from one layout to another (Partial→Replicate is an all-reduce, Shard→Replicate an all-gather,
Partial→Shard a reduce-scatter, Shard(i)→Shard(j) an all-to-all, Replicate→Shard a local slice);
materialization (``distir.parallel.sharding.materialize``) lowers it to those communication ops. Its
sequential meaning is the identity: a redistribution never changes the logical value.

``%y = MeshSend(%x, mesh="dp=2, tp=2; d4, d5, d6, d7")`` moves a DTensor from its mesh A to mesh B
(the attribute: axes, then devices in row-major order) of the same shape — the same axis names
and sizes — keeping dtype, shape and placements: the device at coordinates c of A sends its local
piece to the device at c of B (materialization lowers it to one ``Send`` per device of A). A device
at the same coordinates in both meshes would send to itself: that is an error, like ``Send`` to
itself. Its sequential meaning is the identity too.

``MeshSend(%g, mesh="…", event=true)`` is a *hand-over* between streams: as an op it occupies only
the destination mesh, which waits for the work the source mesh was given before it, while the
source goes on without waiting for the destination — a CUDA event recorded on the source stream
that the destination stream waits for (``cudaStreamWaitEvent``), as a trainer passes a gradient
bucket from the compute stream to its reduction stream (``distir.sim.simulate``: the record's
``waits``). Without it a MeshSend occupies both meshes, so each waits for the other. It changes
nothing else: the value, the lowering (a ``Send`` with the same flag per device) and the memory.

``Redistribute(%g, to="S(0), R", coalesced=true)`` is one part of a *coalesced* collective: the
trainer reduces (or gathers) several tensors as one flat buffer in one collective call — a
gradient bucket (PyTorch DDP's and Megatron-LM's contiguous grad buffer, DeepSpeed's IPG bucket),
a layer's flat parameter (FSDP, Megatron's parameter buckets) — and writes each tensor's part of
it as its own Redistribute, the first without the flag and the others with it. The call's fixed
latency is paid once, by the first part: a flagged part costs only its bytes (the simulator
charges its collective's time less that of an empty message, ``distir.sim.spmd``). It changes
nothing else: the value, the lowering and the memory are those of an ordinary Redistribute.

``%y = MeshView(%x, mesh="dpr=2, dp=4, tp=1; d0, …, d7")`` is ``%x`` on a mesh of the same
devices in the same order whose axes split or merge ``%x``'s (``regroup_placements``): each
device keeps its piece, so it costs nothing and materializes to nothing. HSDP uses it to reduce
and gather within groups of the data-parallel axis.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from distir.ir.dtensor import (
    DTensorType,
    Mesh,
    Partial,
    Placement,
    Replicate,
    Shard,
    parse_placements,
    shares_of,
    split_sizes,
)
from distir.ir.types import _ITEMSIZE, IRTypeError, TensorType, Type
from distir.ir.values import Attrs
from distir.ops.registry import (
    AttrSpec,
    CommCost,
    CommPattern,
    CostClass,
    Fusion,
    OpDef,
    OpKind,
    TypeCtx,
    register,
)

FAMILY = "dist"
COST_CLASS = CostClass.DIST  # how the family's ops are costed


def redistribute_source(t: Type, like: Type | None = None) -> DTensorType:
    """``Redistribute``'s input as a DTensor: itself, or a plain tensor (computed from constants,
    which every device makes for itself) replicated on the mesh of ``like``, its second input."""
    if isinstance(t, DTensorType):
        return t
    if not isinstance(t, TensorType) or not isinstance(like, DTensorType):
        raise IRTypeError("needs a distributed tensor, or a plain one and a DTensor of its mesh")
    return DTensorType(t.dtype, t.shape, like.mesh, (Replicate(),) * len(like.mesh.axes))


def _redistribute_rule(ctx: TypeCtx) -> Sequence[Type]:
    given = ctx.types[0]
    try:
        t = redistribute_source(given, ctx.types[1] if len(ctx.types) > 1 else None)
    except IRTypeError:
        why = "Redistribute needs a distributed tensor (or a plain one and a DTensor of its mesh)"
        ctx.fail(why, 0, "DTensor[...]", given)
    try:
        to = parse_placements(ctx.attr("to"))
        out = t.with_placements(to)
    except IRTypeError as e:
        ctx.fail(str(e), None, f"{len(t.mesh.axes)} placements", ctx.attr("to"))
    for a, (src, dst) in enumerate(zip(t.placements, out.placements, strict=True)):
        if isinstance(dst, Partial) and dst != src:
            ctx.fail(
                f"Redistribute cannot create a pending reduction on mesh axis {t.mesh.names[a]}",
                0,
                "R or S(dim)",
                dst,
            )
    return (out,)


def _identity(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    return (np.array(args[0], copy=True),)


REDISTRIBUTE = register(
    OpDef(
        name="Redistribute",
        family=FAMILY,
        cost_class=COST_CLASS,
        kind=OpKind.COMM,
        fusion=Fusion.TRANSPARENT,
        inputs=("x", "like?"),
        outputs=("y",),
        infer=_redistribute_rule,
        attrs={"to": AttrSpec("str"), "coalesced": AttrSpec("bool", default=False)},
        reference=_identity,
        doc='Change a DTensor\'s placements, e.g. to="R" or to="S(0), R" (one per mesh axis); '
        "coalesced=true: a later part of one collective call over a flat buffer (no latency of its own). "
        "With a second input (any DTensor), x may be a plain tensor computed from constants, which "
        "every device makes for itself: replicated on that DTensor's mesh (torch's distribute_tensor "
        "of a tensor every rank holds), so a step to S(d) slices it.",
    )
)


# -- MeshSend -----------------------------------------------------------------------------------
def parse_mesh_attr(text: str, attr: str = "mesh") -> Mesh:
    """``"dp=2, tp=2; d4, d5, d6, d7"`` -> that mesh; raises IRTypeError naming the attribute.
    The same text gives the same Mesh object (type propagation meets one MeshSend per microbatch
    and stage, and a 1024-device mesh is slow to build and to hash)."""
    return _parse_mesh(text, attr)


@functools.lru_cache(maxsize=256)
def _parse_mesh(text: str, attr: str) -> Mesh:
    axes, sep, devices = text.partition(";")
    if not sep:
        raise IRTypeError(
            f'attribute {attr}={text!r} is not like "dp=2, tp=2; d4, d5, d6, d7" (axes; devices)'
        )
    try:
        return Mesh.parse(axes, devices)
    except IRTypeError as e:
        raise IRTypeError(f"attribute {attr}={text!r}: {e}") from None


@functools.lru_cache(maxsize=4096)
def format_mesh_attr(mesh: Mesh) -> str:
    """The inverse of ``parse_mesh_attr``: ``mesh(dp=2; d4, d5)`` -> ``"dp=2; d4, d5"``.
    Cached: a pipeline program names each stage's mesh (of up to thousands of devices) once
    per microbatch and stage boundary."""
    return str(mesh)[len("mesh(") : -1]


def largest_piece_bytes(t: DTensorType) -> int:
    """Bytes of the largest local piece of ``t``: the one at coordinate 0 along every axis (shards
    are split larger first, along each sharding axis in order, as ``split_sizes`` does; along an
    axis with uneven shares, its largest piece)."""
    shape = list(t.shape)
    for ax, p in enumerate(t.placements):
        if isinstance(p, Shard):
            n = t.mesh.shape[ax]
            if shares_of(n) is None:
                shape[p.dim] = -(-shape[p.dim] // n)
            else:
                shape[p.dim] = max(split_sizes(shape[p.dim], n))
    return math.prod(shape) * _ITEMSIZE[t.dtype]


_MESH_SENT: dict[tuple[DTensorType, str], DTensorType] = {}  # (x's type, mesh) -> y's type


def _meshsend_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = ctx.types[0]
    if not isinstance(t, DTensorType):
        ctx.fail("MeshSend needs a distributed tensor", 0, "DTensor[...]", t)
    text = ctx.attr("mesh")
    hit = _MESH_SENT.get((t, text))  # a pipeline sends alike per microbatch: check once
    if hit is not None:
        return (hit,)
    try:
        dst = parse_mesh_attr(text)
    except IRTypeError as e:
        ctx.fail(str(e), None, '"axes; devices" like "dp=2, tp=2; d4, d5, d6, d7"', text)
    if dst.axes != t.mesh.axes:
        ctx.fail(
            f"MeshSend needs meshes of the same shape (axis names and sizes): from {t.mesh} to {dst}",
            None,
            ", ".join(f"{a}={n}" for a, n in t.mesh.axes),
            ", ".join(f"{a}={n}" for a, n in dst.axes),
        )
    for a, b in zip(t.mesh.devices, dst.devices, strict=True):
        if a == b:
            ctx.fail(
                f"MeshSend from {t.mesh} to {dst} would send {a}'s piece to itself "
                "(the same device at the same mesh coordinates)",
                None,
                f"a device other than {a}",
                b,
            )
    out = DTensorType(t.dtype, t.shape, dst, t.placements)
    if len(_MESH_SENT) > 4096:
        _MESH_SENT.clear()
    _MESH_SENT[(t, text)] = out
    return (out,)


def _meshsend_cost(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> CommCost:
    """Point-to-point, the largest piece's bytes; devices: A's devices, then B's (device i of A
    sends to device i of B)."""
    src, dst = ins[0], outs[0]
    assert isinstance(src, DTensorType) and isinstance(dst, DTensorType)
    return CommCost(CommPattern.P2P, float(largest_piece_bytes(src)), (*src.mesh.devices, *dst.mesh.devices))


MESH_SEND = register(
    OpDef(
        name="MeshSend",
        family=FAMILY,
        cost_class=COST_CLASS,
        kind=OpKind.COMM,
        inputs=("x",),
        outputs=("y",),
        infer=_meshsend_rule,
        attrs={"mesh": AttrSpec("str"), "event": AttrSpec("bool", default=False)},
        reference=_identity,
        comm_cost=_meshsend_cost,
        doc='Move a DTensor to another mesh of the same shape, e.g. mesh="dp=2, tp=2; d4, d5, d6, d7": '
        "each device sends its piece to the device at the same coordinates; event=true: a hand-over "
        "between streams, the destination waits for the source, the source goes on.",
    )
)


# -- MeshView -----------------------------------------------------------------------------------
def regroup_placements(
    src: tuple[int, ...], places: tuple[Placement, ...], dst: tuple[int, ...]
) -> tuple[Placement, ...] | str:
    """The placements over axes of sizes ``dst`` of a tensor placed ``places`` over axes of sizes
    ``src``, the same devices in the same row-major order, when every device keeps its piece:
    consecutive axes of one side group with consecutive axes of the other of the same product
    (an axis split in two, or two merged); an axis kept as it is keeps its placement, a split or
    merged group must be replicated or pending the same reduction along all of it. Otherwise the
    reason, in words."""
    out: list[Placement] = []
    i = j = 0
    while i < len(src) and j < len(dst):
        a, b = [i], [j]
        pa, pb = src[i], dst[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb and i < len(src):
                pa, i = pa * src[i], i + 1
                a.append(i - 1)
            elif pb < pa and j < len(dst):
                pb, j = pb * dst[j], j + 1
                b.append(j - 1)
            else:
                return f"axes of sizes {src} do not regroup into {dst}"
        if len(a) == 1 and len(b) == 1:
            out.append(places[a[0]])
            continue
        # an axis of size 1 holds the whole tensor whatever it is called (R or a sum of one)
        kinds = {places[x] for x in a if src[x] > 1} or {places[a[0]]}
        p = next(iter(kinds))
        if len(kinds) != 1 or isinstance(p, Shard):
            shown = ", ".join(str(places[x]) for x in a)
            return f"axes {a} placed {shown} cannot regroup (a regrouped axis must be all R or all P)"
        out.extend([p] * len(b))
    if i != len(src) or j != len(dst):
        return f"axes of sizes {src} do not regroup into {dst}"
    return tuple(out)


def _meshview_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = ctx.types[0]
    if not isinstance(t, DTensorType):
        ctx.fail("MeshView needs a distributed tensor", 0, "DTensor[...]", t)
    text = ctx.attr("mesh")
    try:
        dst = parse_mesh_attr(text)
    except IRTypeError as e:
        ctx.fail(str(e), None, '"axes; devices" like "dpr=2, dp=4, tp=1; d0, …, d7"', text)
    if dst.devices != t.mesh.devices:
        ctx.fail(f"MeshView needs the same devices in the same order: {t.mesh} to {dst}", None, t.mesh, dst)
    if any(shares_of(n) is not None for n in (*t.mesh.shape, *dst.shape)):
        ctx.fail("MeshView regroups axes of even shares only", None, "even axes", dst)
    got = regroup_placements(t.mesh.shape, t.placements, dst.shape)
    if isinstance(got, str):
        ctx.fail(f"MeshView from {t.mesh} to {dst}: {got}", 0, "regroupable placements", t)
    return (DTensorType(t.dtype, t.shape, dst, got),)


MESH_VIEW = register(
    OpDef(
        name="MeshView",
        family=FAMILY,
        cost_class=COST_CLASS,
        kind=OpKind.COMM,
        fusion=Fusion.TRANSPARENT,
        inputs=("x",),
        outputs=("y",),
        infer=_meshview_rule,
        attrs={"mesh": AttrSpec("str")},
        reference=_identity,
        doc='View a DTensor on the same devices with its mesh axes regrouped, e.g. mesh="dpr=2, dp=4, '
        'tp=1; d0, …, d7" for one of mesh(dp=8, tp=1): every device keeps its piece, nothing moves '
        "(HSDP's shard groups inside the data-parallel axis).",
    )
)
