"""Rank ops: one device's part of a communication op, in per-rank programs (kind ``RANK_COMM``).

Per-rank projection splits a global ``Send`` into ``rank.Send`` on the source and ``rank.Recv`` on
the destination, and a collective into ``rank.<Collective>`` on every member of its ``group``
(``shapes`` lists the global inputs' shapes, so each rank knows its result's type). Each rank op
has a ``Rendezvous``: who must meet, what must agree among them, and what the meeting computes —
the lock-step executor and the deadlock check (``distir.interp.lockstep``) use it. Each rank op's
``torch`` implementation is its torch.distributed call (``distir.backend``): ``rank.Send`` and
``rank.Recv`` post a point-to-point operation (``TorchContext.post``; the runner starts a rank's
consecutive ones together with ``batch_isend_irecv``), a collective calls the torch collective on
the process group of its ``group`` (uneven pieces padded to the largest, then cut back; AllToAll
as point-to-point exchanges, which any piece shapes allow). Ranks of a torch process group are
ordered by global rank, pieces of a DistIR group by its ``group`` list; the implementations map
one order to the other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from distir.ir.dtensor import split_sizes
from distir.ir.types import Device, DType, ScalarType, TensorType, Type
from distir.ir.values import Attrs
from distir.ops.comm import _COLLS, COST_CLASS, FAMILY, _Coll
from distir.ops.registry import REGISTRY, AttrSpec, OpDef, OpKind, TypeCtx, register


# -- Rendezvous: what rank ops do when their participants meet ----------------------------------
@dataclass(frozen=True, slots=True)
class Rendezvous:
    """How a rank op meets its peers.

    ``participants(attrs, me)``: the devices that must all reach a matching op;
    ``key(name, attrs, me)``: what must be equal among the participants' ops for them to match;
    ``run(inputs, attrs)``: given each participant's inputs (and attrs), each one's outputs.
    """

    participants: Callable[[Attrs, Device], tuple[Device, ...]]
    key: Callable[[str, Attrs, Device], tuple[Any, ...]]
    run: Callable[[Mapping[Device, Sequence[Any]], Mapping[Device, Attrs]], dict[Device, tuple[Any, ...]]]


def _group(attrs: Attrs, me: Device) -> tuple[Device, ...]:
    g: Any = attrs["group"]
    return tuple(g)


def _collective_key(*names: str) -> Callable[[str, Attrs, Device], tuple[Any, ...]]:
    def key(opname: str, attrs: Attrs, me: Device) -> tuple[Any, ...]:
        return (opname, *(attrs.get(n) for n in names))

    return key


def _p2p_participants(attrs: Attrs, me: Device) -> tuple[Device, ...]:
    other: Any = attrs.get("dst", attrs.get("src"))
    return (me, other) if "dst" in attrs else (other, me)


def _p2p_key(opname: str, attrs: Attrs, me: Device) -> tuple[Any, ...]:
    src, dst = _p2p_participants(attrs, me)
    return ("p2p", src, dst)


def _p2p_run(
    inputs: Mapping[Device, Sequence[Any]], attrs: Mapping[Device, Attrs]
) -> dict[Device, tuple[Any, ...]]:
    (src,) = [d for d, a in attrs.items() if "dst" in a]
    (dst,) = [d for d, a in attrs.items() if "src" in a]
    want: Any = attrs[dst]["dtype"]
    return {src: (), dst: (np.array(inputs[src][0], copy=True).astype(want.to_numpy(), copy=False),)}


_P2P = Rendezvous(_p2p_participants, _p2p_key, _p2p_run)
P2P = _P2P  # the rendezvous of rank.Send and rank.Recv: the ops the torch runner batches


def _torch_send(ctx: Any, inputs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    dist = ctx.dist
    dst: Any = attrs["dst"]
    ctx.post(dist.P2POp(dist.isend, inputs[0].contiguous(), ctx.rank(dst)))
    return ()


def _torch_recv(ctx: Any, inputs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    dist = ctx.dist
    shape: Any = attrs.get("shape")
    src: Any = attrs["src"]
    buf = ctx.torch.empty(
        tuple(shape) if shape is not None else (), dtype=ctx.dtype(attrs["dtype"]), device=ctx.device
    )
    ctx.post(dist.P2POp(dist.irecv, buf, ctx.rank(src)))
    return (buf,)


def _rank_send_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = ctx.types[0]
    if not isinstance(t, TensorType | ScalarType):
        ctx.fail("rank.Send moves one tensor or scalar", 0, "Tensor or Scalar", t)
    if ctx.attr("dst") == ctx.device:
        ctx.fail("rank.Send to its own device", None, "another device", ctx.attr("dst"))
    return ()


def _rank_recv_rule(ctx: TypeCtx) -> Sequence[Type]:
    if ctx.attr("src") == ctx.device:
        ctx.fail("rank.Recv from its own device", None, "another device", ctx.attr("src"))
    shape = ctx.attr("shape")
    if shape is None:
        assert ctx.device is not None
        return (ScalarType(ctx.attr("dtype"), ctx.device),)
    return (ctx.out(ctx.attr("dtype"), shape),)


RANK_SEND = register(
    OpDef(
        name="rank.Send",
        family=FAMILY,
        cost_class=COST_CLASS,
        kind=OpKind.RANK_COMM,
        inputs=("x",),
        outputs=(),
        infer=_rank_send_rule,
        attrs={"dst": AttrSpec("device")},
        rendezvous=_P2P,
        torch=_torch_send,
        bytes_written=lambda ins, outs, attrs: 0.0,
        doc="The sending half of a Send, in a per-rank program.",
    )
)
RANK_RECV = register(
    OpDef(
        name="rank.Recv",
        family=FAMILY,
        cost_class=COST_CLASS,
        kind=OpKind.RANK_COMM,
        inputs=(),
        outputs=("y",),
        infer=_rank_recv_rule,
        attrs={
            "src": AttrSpec("device"),
            "dtype": AttrSpec("dtype"),
            "shape": AttrSpec("ints", None),
            "device": AttrSpec("device"),
        },
        rendezvous=_P2P,
        torch=_torch_recv,
        bytes_read=lambda ins, outs, attrs: 0.0,
        doc="The receiving half of a Send, in a per-rank program.",
    )
)


def _rank_rule(c: _Coll) -> Callable[[TypeCtx], Sequence[Type]]:
    def rule(ctx: TypeCtx) -> Sequence[Type]:
        me = ctx.device
        assert me is not None
        group: tuple[Device, ...] = ctx.attr("group")
        shapes = ctx.attr("shapes")
        if len(set(group)) != len(group) or me not in group:
            ctx.fail(
                f"rank.{c.name} group must list distinct devices including {me}",
                None,
                f"distinct devices with {me}",
                list(map(str, group)),
            )
        dtype: DType = ctx.attr("dtype")
        n_in = len(c.global_inputs) if not c.global_inputs[0].startswith("*") else len(group)
        if len(shapes) != n_in:
            ctx.fail(
                f"rank.{c.name} needs the shape of each of the {n_in} global inputs", None, n_in, len(shapes)
            )
        variadic = c.global_inputs[0].startswith("*")
        src = group if variadic else [ctx.attr("root")]
        if not variadic and src[0] not in group:
            ctx.fail(f"rank.{c.name} root must be in the group", None, list(map(str, group)), src[0])
        in_types = [TensorType(dtype, tuple(s), d) for s, d in zip(shapes, src, strict=False)]
        attrs = {k: v for k, v in ctx.attrs.items() if k in c.attrs}
        if "devices" in c.attrs:
            attrs["devices"] = group
        sub = TypeCtx(REGISTRY[c.name], in_types, Attrs(attrs), [None] * n_in, None)
        outs = c.global_rule(sub)
        mine = [t for t in outs if isinstance(t, TensorType | ScalarType) and t.device == me]
        expect = [x for x in in_types if x.device == me]
        if bool(expect) != bool(ctx.types):
            ctx.fail(
                f"rank.{c.name} on {me} must {'take' if expect else 'not take'} an input",
                None,
                1 if expect else 0,
                len(ctx.types),
            )
        if ctx.types:
            t = ctx.tensor(0)
            if (t.dtype, t.shape) != (expect[0].dtype, expect[0].shape):
                ctx.fail(
                    f"rank.{c.name} input does not match the declared global input shapes",
                    0,
                    expect[0] if expect else "no input",
                    t,
                )
        return tuple(mine)

    return rule


def _make_rendezvous(c: _Coll) -> Rendezvous:
    def run(
        inputs: Mapping[Device, Sequence[Any]], attrs: Mapping[Device, Attrs]
    ) -> dict[Device, tuple[Any, ...]]:
        any_attrs = next(iter(attrs.values()))
        group: Any = any_attrs["group"]
        args = [inputs[d][0] for d in group if inputs[d]]
        gattrs = {k: v for k, v in any_attrs.items() if k in c.attrs}
        if "devices" in c.attrs:
            gattrs["devices"] = group
        results = c.reference(args, Attrs(gattrs))
        shapes: Any = any_attrs["shapes"]
        ts = [
            TensorType(any_attrs["dtype"], tuple(s), d)  # type: ignore[arg-type]
            for s, d in zip(shapes, group, strict=False)
        ]
        out_devs = c.out_devices(ts, Attrs(gattrs))
        out: dict[Device, tuple[Any, ...]] = {d: () for d in group}
        for d, r in zip(out_devs, results, strict=True):
            out[d] = (r,)
        return out

    names = tuple(dict.fromkeys(("group", "shapes", "dtype", "root", *c.rank_attrs)))
    return Rendezvous(_group, _collective_key(*names), run)


# -- torch implementations of the collectives ----------------------------------------------------
class _Members:
    """A rank op's group as torch sees it: the process group, this rank's position in the DistIR
    group order, and the global rank of each member (in group order)."""

    def __init__(self, ctx: Any, attrs: Attrs) -> None:
        group: Any = attrs["group"]
        self.devices: tuple[Device, ...] = tuple(group)
        self.pg = ctx.group(self.devices)
        self.me = self.devices.index(ctx.me)
        self.ranks = [ctx.rank(d) for d in self.devices]
        # torch orders a group's ranks by global rank; order[i]: the group position of torch's i-th
        self.order = sorted(range(len(self.ranks)), key=self.ranks.__getitem__)
        self.n = len(self.devices)


_REDUCE = {"sum": "SUM", "mean": "SUM", "max": "MAX", "min": "MIN", "prod": "PRODUCT"}


def _reduce_op(ctx: Any, attrs: Attrs) -> Any:
    how: Any = attrs.get("op", "sum")
    return getattr(ctx.dist.ReduceOp, _REDUCE[how])


def _finish_reduce(y: Any, attrs: Attrs, n: int) -> Any:
    """``mean`` is a sum divided by the group size (torch's gloo has no average)."""
    if attrs.get("op", "sum") != "mean":
        return y
    return y / n if y.is_floating_point() else y // n


def _empty(ctx: Any, shape: Sequence[int], attrs: Attrs) -> Any:
    return ctx.torch.empty(tuple(shape), dtype=ctx.dtype(attrs["dtype"]), device=ctx.device)


def _pad(ctx: Any, x: Any, dim: int, size: int) -> Any:
    """``x`` padded with zeros along ``dim`` to ``size`` (uneven pieces travel at the largest size)."""
    if x.shape[dim] == size:
        return x.contiguous()
    shape = list(x.shape)
    shape[dim] = size - x.shape[dim]
    return ctx.torch.cat([x, ctx.torch.zeros(shape, dtype=x.dtype, device=x.device)], dim=dim).contiguous()


def _gather_pieces(ctx: Any, x: Any, attrs: Attrs, dim: int, root: int | None) -> list[Any] | None:
    """Every member's piece, in group order (on every rank, or on global rank ``root`` only)."""
    m = _Members(ctx, attrs)
    shapes: Any = attrs["shapes"]
    dim = dim % max(len(shapes[0]), 1)
    size = max(s[dim] for s in shapes)
    mine = _pad(ctx, x, dim, size)
    bufs = [ctx.torch.empty_like(mine) for _ in range(m.n)]
    if root is None:
        ctx.dist.all_gather(bufs, mine, group=m.pg)
    else:
        ctx.dist.gather(mine, bufs if ctx.rank(ctx.me) == root else None, dst=root, group=m.pg)
        if ctx.rank(ctx.me) != root:
            return None
    by_pos = {m.order[i]: b for i, b in enumerate(bufs)}
    return [by_pos[i].narrow(dim, 0, shapes[i][dim]) for i in range(m.n)]


def _t_allreduce(ctx: Any, inputs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    m = _Members(ctx, attrs)
    y = inputs[0].clone()
    ctx.dist.all_reduce(y, op=_reduce_op(ctx, attrs), group=m.pg)
    return (_finish_reduce(y, attrs, m.n),)


def _t_allgather(ctx: Any, inputs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    dim: Any = attrs.get("dim", 0)
    pieces = _gather_pieces(ctx, inputs[0], attrs, dim, None)
    assert pieces is not None
    return (ctx.torch.cat(pieces, dim=dim),)


def _t_mpigather(ctx: Any, inputs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    dim: Any = attrs.get("dim", 0)
    root: Any = attrs["root"]
    pieces = _gather_pieces(ctx, inputs[0], attrs, dim, ctx.rank(root))
    return () if pieces is None else (ctx.torch.cat(pieces, dim=dim),)


def _my_chunk(x: Any, attrs: Attrs, n: int, me: int) -> Any:
    dim: Any = attrs.get("dim", 0)
    dim = dim % max(x.dim(), 1)
    sizes = split_sizes(x.shape[dim], n)
    return x.narrow(dim, sum(sizes[:me]), sizes[me]).contiguous()


def _t_reducescatter(ctx: Any, inputs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    m = _Members(ctx, attrs)
    x = inputs[0]
    dim: Any = attrs.get("dim", 0)
    sizes = split_sizes(x.shape[dim % x.dim()], m.n)
    if dim % x.dim() == 0 and len(set(sizes)) == 1 and m.order == sorted(m.order):
        out = ctx.torch.empty((sizes[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        # reduce_scatter_single where torch has it (reduce_scatter_tensor is deprecated there)
        rs = getattr(ctx.dist, "reduce_scatter_single", None) or ctx.dist.reduce_scatter_tensor
        rs(out, x.contiguous(), op=_reduce_op(ctx, attrs), group=m.pg)
        return (_finish_reduce(out, attrs, m.n),)
    y = x.clone()  # uneven pieces or a group out of rank order: reduce everything, keep mine
    ctx.dist.all_reduce(y, op=_reduce_op(ctx, attrs), group=m.pg)
    return (_finish_reduce(_my_chunk(y, attrs, m.n, m.me), attrs, m.n),)


def _t_reduce(ctx: Any, inputs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    m = _Members(ctx, attrs)
    root: Any = attrs["root"]
    y = inputs[0].clone()
    ctx.dist.reduce(y, dst=ctx.rank(root), op=_reduce_op(ctx, attrs), group=m.pg)
    return (_finish_reduce(y, attrs, m.n),) if ctx.me == root else ()


def _t_broadcast(ctx: Any, inputs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    m = _Members(ctx, attrs)
    root: Any = attrs["root"]
    shapes: Any = attrs["shapes"]
    y = inputs[0].clone().contiguous() if ctx.me == root else _empty(ctx, shapes[0], attrs)
    ctx.dist.broadcast(y, src=ctx.rank(root), group=m.pg)
    return (y,)


def _t_scatter(ctx: Any, inputs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """The root's tensor broadcast, then each member keeps its chunk (any chunk sizes)."""
    (y,) = _t_broadcast(ctx, inputs, attrs)
    m = _Members(ctx, attrs)
    return (_my_chunk(y, attrs, m.n, m.me),)


def _t_alltoall(ctx: Any, inputs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """Chunk j of every member's input to member j: one batch of point-to-point exchanges."""
    m = _Members(ctx, attrs)
    dist, torch = ctx.dist, ctx.torch
    shapes: Any = attrs["shapes"]
    x = inputs[0]
    sd: Any = attrs.get("split_dim", 0)
    cd: Any = attrs.get("concat_dim", 0)
    sd, cd = sd % x.dim(), cd % x.dim()
    sizes = split_sizes(x.shape[sd], m.n)
    pieces: list[Any] = []
    ops = []
    for i in range(m.n):
        if i == m.me:
            pieces.append(x.narrow(sd, sum(sizes[:i]), sizes[i]).contiguous())
            continue
        shape = list(shapes[i])
        shape[sd] = split_sizes(shape[sd], m.n)[m.me]
        buf = _empty(ctx, shape, attrs)
        pieces.append(buf)
        chunk = x.narrow(sd, sum(sizes[:i]), sizes[i]).contiguous()
        ops.append(dist.P2POp(dist.isend, chunk, m.ranks[i], group=m.pg))
        ops.append(dist.P2POp(dist.irecv, buf, m.ranks[i], group=m.pg))
    for req in dist.batch_isend_irecv(ops) if ops else ():
        req.wait()
    return (torch.cat(pieces, dim=cd),)


# -- coalesced parts: one collective call over a flat buffer ------------------------------------
# A trainer reduces a gradient bucket (DDP's and Megatron-LM's contiguous buffer) or gathers a
# layer's flat parameter (FSDP) in ONE collective call; DistIR writes each tensor's part as its own
# op, the later ones ``coalesced`` (``distir.ops.dist``). These run the parts as that one call:
# each part's local data copied into one flat buffer, one torch collective, each part's result
# copied out of the flat result (DDP's copy into its bucket and back out, by default: its
# ``gradient_as_bucket_view=False``), so each result is a tensor of its own as the part's op
# promises. The flat buffers are the call's own, kept from one step to the next as a trainer
# keeps its buckets (``buffer(slot, numel, dtype)``, given by the runner; a fresh multi-MiB
# buffer per call would add its page faults, ~2 ms per 3 MiB here, that no trainer pays). Every
# rank of the group builds the same layout from the parts' global ``shapes``. Parts that cannot
# share a call (different dtypes or reduce ops) return None: the runner runs them one by one.
Parts = Sequence[tuple[Sequence[Any], Attrs]]
Buffer = Callable[[int, int, Any], Any]  # (slot, elements, torch dtype) -> a flat tensor


def _any(value: Any) -> Any:
    """An attribute as the implementation reads it (the IR types attributes as a union)."""
    return value


def _same(parts: Parts, *names: str) -> bool:
    """The parts agree on ``names`` (and on the torch reduction, ``mean`` being a sum)."""
    first = parts[0][1]
    how = _REDUCE[str(first.get("op", "sum"))]
    return all(
        all(a.get(n) == first.get(n) for n in names) and _REDUCE[str(a.get("op", "sum"))] == how
        for _, a in parts
    )


def _flat(ctx: Any, buffer: Buffer, slot: int, xs: Sequence[Any]) -> Any:
    """``xs`` flattened, one after another, into the call's buffer ``slot``."""
    flat = buffer(slot, sum(int(x.numel()) for x in xs), xs[0].dtype)
    ctx.torch.cat([x.reshape(-1) for x in xs], out=flat)
    return flat


def _coalesced_allreduce(ctx: Any, parts: Parts, buffer: Buffer) -> list[tuple[Any, ...]] | None:
    if not _same(parts, "group", "dtype"):
        return None
    m = _Members(ctx, parts[0][1])
    xs = [ins[0] for ins, _ in parts]
    flat = _flat(ctx, buffer, 0, xs)
    ctx.dist.all_reduce(flat, op=_reduce_op(ctx, parts[0][1]), group=m.pg)
    out: list[tuple[Any, ...]] = []
    at = 0
    for x, (_, attrs) in zip(xs, parts, strict=True):
        out.append((_finish_reduce(flat.narrow(0, at, x.numel()).view(x.shape).clone(), attrs, m.n),))
        at += x.numel()
    return out


def _padded(x: Any, dim: int, size: int) -> tuple[int, ...]:
    shape = list(x.shape)
    shape[dim] = size
    return tuple(shape)


def _coalesced_allgather(ctx: Any, parts: Parts, buffer: Buffer) -> list[tuple[Any, ...]] | None:
    """Each member's pieces of every part, padded to the part's largest piece, in one flat
    buffer; one all-gather of it; every part's pieces cut out and concatenated."""
    if not _same(parts, "group", "dtype"):
        return None
    m = _Members(ctx, parts[0][1])
    layout = []  # per part: (dim, padded piece shape, its elements, the members' sizes on dim)
    mine = []
    for ins, attrs in parts:
        x, shapes, dim = ins[0], _any(attrs["shapes"]), _any(attrs.get("dim", 0))
        dim = int(dim) % max(x.dim(), 1)
        sizes = [int(s[dim]) for s in shapes]
        p = _pad(ctx, x, dim, max(sizes))
        layout.append((dim, tuple(p.shape), p.numel(), sizes))
        mine.append(p.reshape(-1))
    flat = _flat(ctx, buffer, 0, mine)
    gathered = buffer(1, m.n * flat.numel(), flat.dtype)
    bufs = list(gathered.view(m.n, flat.numel()).unbind(0))
    ctx.dist.all_gather(bufs, flat, group=m.pg)
    by_pos = {m.order[i]: b for i, b in enumerate(bufs)}
    out: list[tuple[Any, ...]] = []
    at = 0
    for dim, shape, numel, sizes in layout:
        pieces = [by_pos[i].narrow(0, at, numel).view(shape).narrow(dim, 0, sizes[i]) for i in range(m.n)]
        out.append((ctx.torch.cat(pieces, dim=dim),))
        at += numel
    return out


def _coalesced_reducescatter(ctx: Any, parts: Parts, buffer: Buffer) -> list[tuple[Any, ...]] | None:
    """Every part's chunk for torch's i-th rank (padded to the part's largest chunk) in block i
    of one flat buffer; one reduce-scatter; this rank's chunk of every part cut out of its block."""
    if not _same(parts, "group", "dtype"):
        return None
    m = _Members(ctx, parts[0][1])
    layout = []  # per part: (dim, padded chunk shape, its elements, my chunk's size on dim)
    blocks: list[list[Any]] = [[] for _ in range(m.n)]
    for ins, attrs in parts:
        x = ins[0]
        dim = int(_any(attrs.get("dim", 0))) % max(x.dim(), 1)
        sizes = split_sizes(x.shape[dim], m.n)
        big = max(sizes)
        for i in range(m.n):  # torch's i-th rank is group position order[i]
            pos = m.order[i]
            chunk = x.narrow(dim, sum(sizes[:pos]), sizes[pos])
            blocks[i].append(_pad(ctx, chunk, dim, big).reshape(-1))
        shape = _padded(x, dim, big)
        layout.append((dim, shape, int(np.prod(shape)), sizes[m.me], attrs))
    flat = _flat(ctx, buffer, 0, [x for b in blocks for x in b])
    out_flat = buffer(1, flat.numel() // m.n, flat.dtype)
    rs = getattr(ctx.dist, "reduce_scatter_single", None) or ctx.dist.reduce_scatter_tensor
    rs(out_flat, flat, op=_reduce_op(ctx, parts[0][1]), group=m.pg)
    out: list[tuple[Any, ...]] = []
    at = 0
    for dim, shape, numel, size, attrs in layout:
        piece = out_flat.narrow(0, at, numel).view(shape).narrow(dim, 0, size).clone()
        out.append((_finish_reduce(piece, attrs, m.n),))
        at += numel
    return out


_TORCH_COALESCED: dict[str, Callable[[Any, Parts, Buffer], list[tuple[Any, ...]] | None]] = {
    "AllReduce": _coalesced_allreduce,
    "AllGather": _coalesced_allgather,
    "ReduceScatter": _coalesced_reducescatter,
}


_TORCH_COLLS: dict[str, Callable[[Any, Sequence[Any], Attrs], tuple[Any, ...]]] = {
    "AllReduce": _t_allreduce,
    "AllGather": _t_allgather,
    "ReduceScatter": _t_reducescatter,
    "Broadcast": _t_broadcast,
    "Scatter": _t_scatter,
    "MPIGather": _t_mpigather,
    "Reduce": _t_reduce,
    "AllToAll": _t_alltoall,
}


for _c in _COLLS:
    register(
        OpDef(
            name="rank." + _c.name,
            family=FAMILY,
            cost_class=COST_CLASS,
            kind=OpKind.RANK_COMM,
            inputs=("x?",),
            outputs=lambda n, attrs: -1,
            infer=_rank_rule(_c),
            attrs={
                **{k: v for k, v in _c.attrs.items() if k != "devices"},
                "group": AttrSpec("devices"),
                "shapes": AttrSpec("any"),
                "dtype": AttrSpec("dtype"),
                "device": AttrSpec("device"),
                "root": AttrSpec("device", None),
                # a later part of one collective call (the global op's flag, projected)
                "coalesced": AttrSpec("bool", default=False),
            },
            rendezvous=_make_rendezvous(_c),
            torch=_TORCH_COLLS[_c.name],
            torch_coalesced=_TORCH_COALESCED.get(_c.name),
            doc=f"One rank's part of {_c.name}; `shapes` are the global inputs' shapes, in group order.",
        )
    )
