"""Ops of sharded (DTensor) programs: ``Redistribute`` changes a distributed tensor's placements.

``%z: DTensor[..., [R]] = Redistribute(%z1, to="R")`` is the explicit point where a value moves
from one layout to another (Partial→Replicate is an all-reduce, Shard→Replicate an all-gather,
Partial→Shard a reduce-scatter, Shard(i)→Shard(j) an all-to-all, Replicate→Shard a local slice);
materialization (``distir.parallel.materialize``) lowers it to those communication ops. Its
sequential meaning is the identity: a redistribution never changes the logical value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from distir.ir.dtensor import DTensorType, Partial, parse_placements
from distir.ir.types import IRTypeError, Type
from distir.ir.values import Attrs
from distir.ops.registry import AttrSpec, OpDef, OpKind, TypeCtx, register

FAMILY = "dist"


def _redistribute_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = ctx.types[0]
    if not isinstance(t, DTensorType):
        ctx.fail("Redistribute needs a distributed tensor", 0, "DTensor[...]", t)
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
        kind=OpKind.COMM,
        inputs=("x",),
        outputs=("y",),
        infer=_redistribute_rule,
        attrs={"to": AttrSpec("str")},
        reference=_identity,
        doc='Change a DTensor\'s placements, e.g. to="R" or to="S(0), R" (one per mesh axis).',
    )
)
