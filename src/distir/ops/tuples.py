"""Tuple ops: group values (a layer's weights) and take them apart again (the paper's
``UnpackTuple``). Tuples are free at run time: no FLOPs, no bytes moved."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distir.ir.types import TupleType, Type
from distir.ir.values import Attrs
from distir.ops.registry import CostClass, OpDef, TypeCtx, register

FAMILY = "tuples"
COST_CLASS = CostClass.TUPLES  # how the family's ops are costed


def _free(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    return 0.0


def _make_rule(ctx: TypeCtx) -> Sequence[Type]:
    return (TupleType(tuple(ctx.types)),)


def _unpack_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = ctx.types[0]
    if not isinstance(t, TupleType):
        ctx.fail("UnpackTuple needs a tuple", 0, "Tuple[...]", t)
    return t.elements


def _unpack_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    return tuple(args[0])


MAKE_TUPLE = register(
    OpDef(
        name="MakeTuple",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("*elements",),
        outputs=("tuple",),
        infer=_make_rule,
        reference=lambda args, attrs: (tuple(args),),
        bytes_read=_free,
        bytes_written=_free,
    )
)
UNPACK_TUPLE = register(
    OpDef(
        name="UnpackTuple",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("tuple",),
        outputs=lambda n, attrs: -1,
        infer=_unpack_rule,
        reference=_unpack_ref,
        bytes_read=_free,
        bytes_written=_free,
        doc="One result per tuple element; the count comes from the input's type.",
    )
)

# torch implementations (contract: distir.ops._torch): tuples are Python tuples of tensors
MAKE_TUPLE.fill("torch", lambda ctx, xs, attrs: (tuple(xs),))
UNPACK_TUPLE.fill("torch", lambda ctx, xs, attrs: tuple(xs[0]))
