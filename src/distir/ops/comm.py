"""Communication ops with MPI-style meaning, in two forms.

*Global* ops (kind ``COMM``) appear in a distributed program and span devices; the reference
executor gives them their sequential meaning:

    %y: ...d2 = Send(%x, dst=d2)                      x (on one device) copied to dst
    %y1, ..., %yn = AllReduce(%x1, ..., %xn, op="sum") every yi = op(x1..xn) on xi's device
    %y1, ..., %yn = AllGather(%x1, ..., %xn, dim=0)    every yi = concat(x1..xn, dim)
    %y1, ..., %yn = ReduceScatter(%x1, ..., %xn, dim=0, op="sum")  yi = chunk i of op(x1..xn)
    %y1, ..., %yn = Broadcast(%x, devices=[d0, d1])   yi = x on devices[i] (x's device included)
    %y1, ..., %yn = Scatter(%x, dim=0, devices=[...]) yi = chunk i of x on devices[i]
    %y = MPIGather(%x1, ..., %xn, dim=0, root=d0)     concat onto root (ONNX owns "Gather")
    %y = Reduce(%x1, ..., %xn, root=d0, op="sum")     op(x1..xn) onto root
    %y1, ..., %yn = AllToAll(%x1, ..., %xn, split_dim=0, concat_dim=1)
                                                      yj = concat_i(chunk j of xi, concat_dim)
Inputs of a collective are on distinct devices; chunks are near-equal, larger first (uneven
sizes allowed: 127 rows over 2 devices are 64 and 63).

A global op's ``project`` gives each participating device its part: the *rank* ops of
``distir.ops.rank_comm`` (``rank.Send``/``rank.Recv``, ``rank.<Collective>``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from distir.ir.dtensor import split_sizes
from distir.ir.ops import Op
from distir.ir.types import Device, ScalarType, TensorType, Type, devices_of
from distir.ir.values import Attrs, Value
from distir.ops._rules import norm_axis
from distir.ops.registry import (
    AttrSpec,
    CommCost,
    CommPattern,
    CostClass,
    OpDef,
    OpKind,
    TypeCtx,
    register,
)

FAMILY = "comm"
COST_CLASS = CostClass.COMM  # how the family's ops are costed
REDUCE_OPS = ("sum", "max", "min", "mean", "prod")


def reduce_arrays(arrs: Sequence[Any], how: str) -> np.ndarray:
    """Elementwise reduction of same-shape arrays, keeping the dtype."""
    stack = np.stack([np.asarray(a) for a in arrs])
    fns: dict[str, Callable[..., Any]] = {
        "sum": np.sum,
        "max": np.max,
        "min": np.min,
        "mean": np.mean,
        "prod": np.prod,
    }
    fn = fns[how]
    return np.asarray(fn(stack, axis=0)).astype(stack.dtype, copy=False)


def chunks(x: np.ndarray, n: int, dim: int) -> list[np.ndarray]:
    cuts = np.cumsum(split_sizes(x.shape[dim], n))[:-1]
    return [np.ascontiguousarray(c) for c in np.split(x, cuts, axis=dim)]


# -- type rules shared by global ops ----------------------------------------------------------
def _distinct_devices(ctx: TypeCtx) -> list[TensorType]:
    ts = [ctx.tensor(i) for i in range(len(ctx.types))]
    seen: dict[Device, int] = {}
    for i, t in enumerate(ts):
        if t.device in seen:
            ctx.fail(
                f"{ctx.op.name} inputs {seen[t.device] + 1} and {i + 1} are both on {t.device}; "
                "a collective takes one input per device",
                i,
                "distinct devices",
                t.device,
            )
        seen[t.device] = i
    return ts


def _same_shapes(ctx: TypeCtx, ts: Sequence[TensorType]) -> None:
    for i, t in enumerate(ts[1:], 1):
        if (t.dtype, t.shape) != (ts[0].dtype, ts[0].shape):
            ctx.fail(
                f"{ctx.op.name} input {i + 1} differs from input 1",
                i,
                f"{ts[0].dtype}{ts[0].shape}",
                f"{t.dtype}{t.shape}",
            )


def _check_dev_list(ctx: TypeCtx, name: str) -> tuple[Device, ...]:
    devs: tuple[Device, ...] = ctx.attr(name)
    if not devs or len(set(devs)) != len(devs):
        ctx.fail(
            f"{ctx.op.name} {name} must be a non-empty list of distinct devices",
            None,
            "distinct devices",
            list(map(str, devs)),
        )
    return devs


def _concat_shape(ctx: TypeCtx, ts: Sequence[TensorType], dim: int) -> tuple[int, ...]:
    first = ts[0]
    for i, t in enumerate(ts):
        if (
            t.dtype != first.dtype
            or t.rank != first.rank
            or any(a != b for k, (a, b) in enumerate(zip(t.shape, first.shape, strict=True)) if k != dim)
        ):
            ctx.fail(
                f"{ctx.op.name} input {i + 1} of shape {t.shape} does not match {first.shape} "
                f"outside dim {dim}",
                i,
                first.shape,
                t.shape,
            )
    return (*first.shape[:dim], sum(t.shape[dim] for t in ts), *first.shape[dim + 1 :])


def _chunk_shapes(shape: tuple[int, ...], n: int, dim: int) -> list[tuple[int, ...]]:
    return [(*shape[:dim], s, *shape[dim + 1 :]) for s in split_sizes(shape[dim], n)]


# -- Send ---------------------------------------------------------------------------------------
def _send_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = ctx.types[0]
    if not isinstance(t, TensorType | ScalarType):
        ctx.fail("Send moves one tensor or scalar", 0, "Tensor or Scalar", t)
    dst: Device = ctx.attr("dst")
    if dst == t.device:
        ctx.fail(f"Send from {t.device} to itself", 0, f"a device other than {dst}", t.device)
    return (t.with_device(dst),)


def _recv_attrs(t: Type) -> dict[str, Any]:
    assert isinstance(t, TensorType | ScalarType)
    if isinstance(t, ScalarType):
        return {"dtype": t.dtype}  # no shape: a scalar
    return {"dtype": t.dtype, "shape": t.shape}


def _project_send(
    op: Op, ins: Sequence[Type], outs: Sequence[Type], vmap: Callable[[Value], Value]
) -> dict[Device, list[Op]]:
    src, dst = ins[0], outs[0]
    assert isinstance(src, TensorType | ScalarType) and isinstance(dst, TensorType | ScalarType)
    return {
        src.device: [Op("rank.Send", (vmap(op.inputs[0]),), (), Attrs({"dst": dst.device}))],
        dst.device: [
            Op(
                "rank.Recv",
                (),
                (vmap(op.outputs[0]),),
                Attrs({"src": src.device, **_recv_attrs(dst), "device": dst.device}),
            )
        ],
    }


SEND = register(
    OpDef(
        name="Send",
        family=FAMILY,
        cost_class=COST_CLASS,
        kind=OpKind.COMM,
        inputs=("x",),
        outputs=("y",),
        infer=_send_rule,
        attrs={"dst": AttrSpec("device"), "event": AttrSpec("bool", default=False)},
        reference=lambda args, attrs: (np.array(args[0], copy=True),),
        project=_project_send,
        comm_cost=lambda ins, outs, attrs: CommCost(
            CommPattern.P2P,
            float(ins[0].nbytes),
            (*devices_of(ins[0]), *devices_of(outs[0])),
        ),
        doc="Point-to-point copy: one op models both ends (blocks sender and receiver); event=true: "
        "a hand-over between streams, the receiver waits for the sender, the sender goes on.",
    )
)


# -- collectives --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Coll:
    """A collective's definition in terms of a numpy function over all participants' inputs."""

    name: str
    global_inputs: tuple[str, ...]
    attrs: dict[str, AttrSpec]
    global_rule: Callable[[TypeCtx], Sequence[Type]]
    reference: Callable[[Sequence[Any], Attrs], Sequence[Any]]
    # which devices get an output of the global op, given the input types and attrs
    out_devices: Callable[[Sequence[TensorType], Attrs], tuple[Device, ...]]
    # devices participating (group), given the global op's input types and attrs
    group: Callable[[Sequence[TensorType], Attrs], tuple[Device, ...]]
    # which devices contribute an input
    in_devices: Callable[[Sequence[TensorType], Attrs], tuple[Device, ...]]
    # attrs (besides group) passed to the rank ops
    rank_attrs: tuple[str, ...]
    doc: str
    # cost descriptor: the pattern and which message size its formula takes
    pattern: CommPattern
    message: Callable[[Sequence[TensorType], Sequence[Type]], float]


def _ins_devs(ts: Sequence[TensorType], attrs: Attrs) -> tuple[Device, ...]:
    return tuple(t.device for t in ts)


def _attr_devs(ts: Sequence[TensorType], attrs: Attrs) -> tuple[Device, ...]:
    return tuple(attrs["devices"])  # type: ignore[arg-type]


def _root_only(ts: Sequence[TensorType], attrs: Attrs) -> tuple[Device, ...]:
    return (attrs["root"],)  # type: ignore[return-value]


def _first_dev(ts: Sequence[TensorType], attrs: Attrs) -> tuple[Device, ...]:
    return (ts[0].device,)


def _allreduce_rule(ctx: TypeCtx) -> Sequence[Type]:
    ts = _distinct_devices(ctx)
    _same_shapes(ctx, ts)
    return tuple(ts)


def _allgather_rule(ctx: TypeCtx) -> Sequence[Type]:
    ts = _distinct_devices(ctx)
    dim = norm_axis(ctx, ctx.attr("dim"), ts[0].rank, "AllGather dim")
    shape = _concat_shape(ctx, ts, dim)
    return tuple(TensorType(t.dtype, shape, t.device) for t in ts)


def _reducescatter_rule(ctx: TypeCtx) -> Sequence[Type]:
    ts = _distinct_devices(ctx)
    _same_shapes(ctx, ts)
    dim = norm_axis(ctx, ctx.attr("dim"), ts[0].rank, "ReduceScatter dim")
    shapes = _chunk_shapes(ts[0].shape, len(ts), dim)
    return tuple(TensorType(t.dtype, s, t.device) for t, s in zip(ts, shapes, strict=True))


def _broadcast_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = ctx.tensor(0)
    devs = _check_dev_list(ctx, "devices")
    if t.device not in devs:
        ctx.fail(f"Broadcast devices must include the source {t.device}", 0, list(map(str, devs)), t.device)
    return tuple(t.with_device(d) for d in devs)


def _scatter_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = ctx.tensor(0)
    devs = _check_dev_list(ctx, "devices")
    if t.device not in devs:
        ctx.fail(f"Scatter devices must include the source {t.device}", 0, list(map(str, devs)), t.device)
    dim = norm_axis(ctx, ctx.attr("dim"), t.rank, "Scatter dim")
    return tuple(
        TensorType(t.dtype, s, d) for s, d in zip(_chunk_shapes(t.shape, len(devs), dim), devs, strict=True)
    )


def _gather_rule(ctx: TypeCtx) -> Sequence[Type]:
    ts = _distinct_devices(ctx)
    root: Device = ctx.attr("root")
    if root not in [t.device for t in ts]:
        ctx.fail(f"MPIGather root {root} holds none of the inputs", None, "a device of an input", root)
    dim = norm_axis(ctx, ctx.attr("dim"), ts[0].rank, "MPIGather dim")
    return (TensorType(ts[0].dtype, _concat_shape(ctx, ts, dim), root),)


def _reduce_rule(ctx: TypeCtx) -> Sequence[Type]:
    ts = _distinct_devices(ctx)
    _same_shapes(ctx, ts)
    root: Device = ctx.attr("root")
    if root not in [t.device for t in ts]:
        ctx.fail(f"Reduce root {root} holds none of the inputs", None, "a device of an input", root)
    return (ts[0].with_device(root),)


def _alltoall_rule(ctx: TypeCtx) -> Sequence[Type]:
    ts = _distinct_devices(ctx)
    sd = norm_axis(ctx, ctx.attr("split_dim"), ts[0].rank, "AllToAll split_dim")
    cd = norm_axis(ctx, ctx.attr("concat_dim"), ts[0].rank, "AllToAll concat_dim")
    n = len(ts)
    if sd == cd:
        _same_shapes(ctx, ts)
        total = [piece[cd] * n for piece in _chunk_shapes(ts[0].shape, n, sd)]
    else:  # inputs may differ along concat_dim (uneven shards regrouped onto another dim)
        total = [_concat_shape(ctx, ts, cd)[cd]] * n
    outs = []
    for t, piece, size in zip(ts, _chunk_shapes(ts[0].shape, n, sd), total, strict=True):
        shape = list(piece)
        shape[cd] = size
        outs.append(TensorType(t.dtype, tuple(shape), t.device))
    return tuple(outs)


def _alltoall_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    n = len(args)
    sd: Any = attrs.get("split_dim", 0)
    cd: Any = attrs.get("concat_dim", 0)
    pieces = [chunks(np.asarray(a), n, sd) for a in args]
    return tuple(np.concatenate([pieces[i][j] for i in range(n)], axis=cd) for j in range(n))


def _as_tensors(ins: Sequence[Type]) -> list[TensorType]:
    """Inputs of a collective as tensors: a scalar is a 0-d tensor."""
    return [
        TensorType(t.dtype, (), t.device) if isinstance(t, ScalarType) else t
        for t in ins
        if isinstance(t, TensorType | ScalarType)
    ]


def _each_in(ins: Sequence[TensorType], outs: Sequence[Type]) -> float:
    """The size of one participant's input (all inputs have the same size)."""
    return float(ins[0].nbytes)


def _each_out(ins: Sequence[TensorType], outs: Sequence[Type]) -> float:
    """The size of the full gathered result."""
    return float(outs[0].nbytes)


_OP = {"op": AttrSpec("str", "sum", REDUCE_OPS)}
_COLLS = [
    _Coll(
        "AllReduce",
        ("*xs",),
        dict(_OP),
        _allreduce_rule,
        lambda a, at: tuple(reduce_arrays(a, at.get("op", "sum")) for _ in a),  # type: ignore[arg-type]
        _ins_devs,
        _ins_devs,
        _ins_devs,
        ("op",),
        "Every participant gets the reduction of all inputs.",
        CommPattern.ALLREDUCE,
        _each_in,
    ),
    _Coll(
        "AllGather",
        ("*xs",),
        {"dim": AttrSpec("int", 0)},
        _allgather_rule,
        lambda a, at: tuple(np.concatenate([np.asarray(x) for x in a], axis=at.get("dim", 0)) for _ in a),  # type: ignore[arg-type]
        _ins_devs,
        _ins_devs,
        _ins_devs,
        ("dim",),
        "Every participant gets the concatenation of all inputs along dim (uneven sizes allowed).",
        CommPattern.ALLGATHER,
        _each_out,
    ),
    _Coll(
        "ReduceScatter",
        ("*xs",),
        {"dim": AttrSpec("int", 0), **_OP},
        _reducescatter_rule,
        lambda a, at: tuple(chunks(reduce_arrays(a, at.get("op", "sum")), len(a), at.get("dim", 0))),  # type: ignore[arg-type]
        _ins_devs,
        _ins_devs,
        _ins_devs,
        ("dim", "op"),
        "Participant i gets chunk i (along dim) of the reduction of all inputs.",
        CommPattern.REDUCESCATTER,
        _each_in,
    ),
    _Coll(
        "Broadcast",
        ("x",),
        {"devices": AttrSpec("devices")},
        _broadcast_rule,
        lambda a, at: tuple(np.array(a[0], copy=True) for _ in at["devices"]),  # type: ignore[union-attr]
        _attr_devs,
        _attr_devs,
        _first_dev,
        (),
        "Every listed device gets a copy of x (x's device must be listed).",
        CommPattern.BROADCAST,
        _each_in,
    ),
    _Coll(
        "Scatter",
        ("x",),
        {"dim": AttrSpec("int", 0), "devices": AttrSpec("devices")},
        _scatter_rule,
        lambda a, at: tuple(chunks(np.asarray(a[0]), len(at["devices"]), at.get("dim", 0))),  # type: ignore[arg-type]
        _attr_devs,
        _attr_devs,
        _first_dev,
        ("dim",),
        "devices[i] gets chunk i of x along dim.",
        CommPattern.SCATTER,
        _each_in,
    ),
    _Coll(
        "MPIGather",
        ("*xs",),
        {"dim": AttrSpec("int", 0), "root": AttrSpec("device")},
        _gather_rule,
        lambda a, at: (np.concatenate([np.asarray(x) for x in a], axis=at.get("dim", 0)),),  # type: ignore[arg-type]
        _root_only,
        _ins_devs,
        _ins_devs,
        ("dim", "root"),
        "The root gets the concatenation of all inputs along dim (MPI Gather).",
        CommPattern.GATHER,
        _each_out,
    ),
    _Coll(
        "Reduce",
        ("*xs",),
        {"root": AttrSpec("device"), **_OP},
        _reduce_rule,
        lambda a, at: (reduce_arrays(a, at.get("op", "sum")),),  # type: ignore[arg-type]
        _root_only,
        _ins_devs,
        _ins_devs,
        ("root", "op"),
        "The root gets the reduction of all inputs.",
        CommPattern.REDUCE,
        _each_in,
    ),
    _Coll(
        "AllToAll",
        ("*xs",),
        {"split_dim": AttrSpec("int", 0), "concat_dim": AttrSpec("int", 0)},
        _alltoall_rule,
        _alltoall_ref,
        _ins_devs,
        _ins_devs,
        _ins_devs,
        ("split_dim", "concat_dim"),
        "Participant j gets chunk j (along split_dim) of every input, concatenated on concat_dim.",
        CommPattern.ALLTOALL,
        _each_in,
    ),
]


def _make_project(c: _Coll) -> Callable[..., dict[Device, list[Op]]]:
    def project(
        op: Op, ins: Sequence[Type], outs: Sequence[Type], vmap: Callable[[Value], Value]
    ) -> dict[Device, list[Op]]:
        ts = _as_tensors(ins)
        group = c.group(ts, op.attrs)
        in_devs = c.in_devices(ts, op.attrs)
        out_devs = c.out_devices(ts, op.attrs)
        base = {k: op.attrs[k] for k in c.rank_attrs if k in op.attrs}
        # every rank learns the global input types it cannot see, so its op's type is local
        sizes = [list(t.shape) for t in ts]
        result: dict[Device, list[Op]] = {}
        for d in group:
            rin = tuple(vmap(op.inputs[in_devs.index(d)]) for _ in (0,) if d in in_devs)
            rout = tuple(vmap(op.outputs[out_devs.index(d)]) for _ in (0,) if d in out_devs)
            attrs = dict(base, group=group, shapes=sizes, dtype=ts[0].dtype, device=d)
            if op.attrs.get("coalesced"):  # a later part of one call: the rank runs it in that call
                attrs["coalesced"] = True
            if "root" not in c.attrs and not c.global_inputs[0].startswith("*"):
                attrs["root"] = ts[0].device
            result[d] = [Op("rank." + c.name, rin, rout, Attrs(attrs))]
        return result

    return project


def _make_comm_cost(c: _Coll) -> Callable[[Sequence[Type], Sequence[Type], Attrs], CommCost]:
    def cost(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> CommCost:
        ts = _as_tensors(ins)
        root: Any = attrs.get("root")
        if c.pattern is CommPattern.SCATTER:
            root = ts[0].device
        coalesced = bool(attrs.get("coalesced"))
        return CommCost(c.pattern, c.message(ts, outs), c.group(ts, attrs), root, coalesced)

    return cost


def _out_count(c: _Coll) -> Callable[[int, Attrs], int]:
    if c.out_devices is _root_only:
        return lambda n, attrs: 1
    if c.out_devices is _attr_devs:
        return lambda n, attrs: len(attrs["devices"]) if isinstance(attrs.get("devices"), tuple) else 1  # type: ignore[arg-type]
    return lambda n, attrs: n


for _c in _COLLS:
    register(
        OpDef(
            name=_c.name,
            family=FAMILY,
            cost_class=COST_CLASS,
            kind=OpKind.COMM,
            inputs=_c.global_inputs,
            outputs=_out_count(_c),
            infer=_c.global_rule,
            # coalesced: a later part of one collective call (``Redistribute``'s, lowered)
            attrs={**_c.attrs, "coalesced": AttrSpec("bool", default=False)},
            reference=_c.reference,
            project=_make_project(_c),
            comm_cost=_make_comm_cost(_c),
            doc=_c.doc,
        )
    )
