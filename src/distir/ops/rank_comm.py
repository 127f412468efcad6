"""Rank ops: one device's part of a communication op, in per-rank programs (kind ``RANK_COMM``).

Per-rank projection splits a global ``Send`` into ``rank.Send`` on the source and ``rank.Recv`` on
the destination, and a collective into ``rank.<Collective>`` on every member of its ``group``
(``shapes`` lists the global inputs' shapes, so each rank knows its result's type). Each rank op
has a ``Rendezvous``: who must meet, what must agree among them, and what the meeting computes —
the lock-step executor and the deadlock check (``distir.interp.lockstep``) use it, and the torch
backend will implement each with its torch.distributed call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from distir.ir.types import Device, DType, ScalarType, TensorType, Type
from distir.ir.values import Attrs
from distir.ops.comm import _COLLS, FAMILY, _Coll
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
        kind=OpKind.RANK_COMM,
        inputs=("x",),
        outputs=(),
        infer=_rank_send_rule,
        attrs={"dst": AttrSpec("device")},
        rendezvous=_P2P,
        bytes_written=lambda ins, outs, attrs: 0.0,
        doc="The sending half of a Send, in a per-rank program.",
    )
)
RANK_RECV = register(
    OpDef(
        name="rank.Recv",
        family=FAMILY,
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


for _c in _COLLS:
    register(
        OpDef(
            name="rank." + _c.name,
            family=FAMILY,
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
            },
            rendezvous=_make_rendezvous(_c),
            doc=f"One rank's part of {_c.name}; `shapes` are the global inputs' shapes, in group order.",
        )
    )
