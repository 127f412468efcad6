"""Legalization: make every change of placement an explicit ``Redistribute`` op.

For each op of a DTensor program, the strategy is the one (of the op's sharding rule) that gives
its results their declared placements and needs the least communication for its inputs (a
requirement that would shard one dim of an input along two mesh axes only as a last resort); every
input whose placements differ from what that strategy takes is redistributed first (one
``Redistribute`` per value and target, reused by later ops). Results of the function that are
still partial (a pending reduction) are reduced, unless the caller keeps them pending. The
output type-checks: every op then takes its inputs exactly as its strategy says. A pure pass
``Module -> Module``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import DTensorType, Partial, Placement, Replicate, Shard, format_placements
from distir.ir.function import Module
from distir.ir.ops import Op
from distir.ir.printer import print_op
from distir.ir.rewrite import ValueMap, copy_instr
from distir.ir.types import TensorType, Type
from distir.ir.values import Value
from distir.ops.registry import REGISTRY, OpKind, global_view
from distir.ops.sharding import Strategy
from distir.parallel.propagate import ShardingError, op_strategies, redistribution_bytes

# ``_required`` answers, by (op name, sharding rule, input types, result types, attributes): it is
# a pure function of them, and the layers of a model (every microbatch size, TP degree, forward
# and backward) meet the same typed ops again and again. Bounded: cleared when full.
_REQUIRED: dict[tuple[object, ...], list[tuple[Placement, ...] | None]] = {}
_REQUIRED_MAX: Final = 1 << 15


def _required(op: Op) -> list[tuple[Placement, ...] | None]:
    """Per input, the placements (one per mesh axis) the op's strategy needs; None for inputs
    that are not distributed tensors. Memoized (``_REQUIRED``); callers must not mutate the list."""
    key = (
        op.name,
        REGISTRY[op.name].sharding,
        tuple(v.type for v in op.inputs),
        tuple(v.type for v in op.outputs),
        op.attrs,
    )
    got = _REQUIRED.get(key)
    if got is None:
        got = _required_of(op)
        if len(_REQUIRED) >= _REQUIRED_MAX:
            _REQUIRED.clear()
        _REQUIRED[key] = got
    return got


def _required_of(op: Op) -> list[tuple[Placement, ...] | None]:
    """``_required`` computed."""
    types: list[Type | None] = [v.type for v in op.inputs]
    dts = [t for t in types if isinstance(t, DTensorType)]
    if not dts:
        return [None] * len(types)
    mesh = dts[0].mesh
    glob = [global_view(t, mesh) for t in types if t is not None]
    outs = [v.type for v in op.outputs]
    if any(not isinstance(t, DTensorType) for t in outs) or len(glob) != len(types):
        raise ShardingError(f"`{print_op(op)}`: every value of a sharded op needs a DTensor type")
    gouts = [t.global_type() for t in outs if isinstance(t, DTensorType)]
    per_axis: list[tuple[Placement, ...]] = []
    for ax, (axis, n) in enumerate(mesh.axes):
        want = tuple(t.placements[ax] for t in outs if isinstance(t, DTensorType))
        have = tuple(t.placements[ax] if isinstance(t, DTensorType) else Replicate() for t in types)
        options = [s for s in op_strategies(op.name, glob, gouts, op.attrs, n) if s.outs == want]
        if not options:
            raise ShardingError(
                f"`{print_op(op)}`: no strategy of {op.name} gives results ({format_placements(want)}) "
                f"on mesh axis {axis}"
            )

        def cost(
            s: Strategy, have: tuple[Placement, ...] = have, n: int = n, ax: int = ax
        ) -> tuple[int, float]:
            """Inputs that would be sharded along the same dim on two mesh axes (which
            materialization cannot lay out) first, then the bytes to move."""
            clash = sum(
                isinstance(w, Shard)
                and isinstance(t, DTensorType)
                and any(
                    (per_axis[b][i] if b < ax else t.placements[b]) == w
                    for b in range(len(mesh.axes))
                    if b != ax
                )
                for i, (t, w) in enumerate(zip(types, s.ins, strict=True))
            )
            return clash, float(
                sum(
                    redistribution_bytes(g, h, w, n)
                    for g, h, w in zip(glob, have, s.ins, strict=True)
                    if isinstance(g, TensorType)
                )
            )

        per_axis.append(options[0].ins if len(options) == 1 else min(options, key=cost).ins)
    return [
        tuple(pa[i] for pa in per_axis) if isinstance(types[i], DTensorType) else None
        for i in range(len(types))
    ]


def _tag(places: tuple[Placement, ...]) -> str:
    """A name suffix for a redistributed value: R, S0, Psum per axis (``%Z_R``, ``%x_S0R``)."""
    return "".join(
        "R" if isinstance(p, Replicate) else f"S{p.dim}" if isinstance(p, Shard) else f"P{p.op}"
        for p in places
    )


def legalize(module: Module, pending: Collection[int] = ()) -> Module:
    """Insert ``Redistribute`` ops (see the module docstring); other functions are kept. The
    results at positions ``pending`` keep their pending sums (a layer's weight gradient, summed
    over data parallelism once after the last microbatch, not inside every backward)."""
    fn = module.entry
    fb = FunctionBuilder(fn.name)
    vmap = ValueMap()
    for p in fn.params:
        vmap.bind(p, fb.param(p.name, p.type))
    moved: dict[tuple[Value, tuple[Placement, ...]], Value] = {}

    def redistribute(v: Value, to: tuple[Placement, ...]) -> Value:
        t = v.type
        assert isinstance(t, DTensorType)
        if t.placements == to:
            return vmap(v)
        key = (v, to)
        if key not in moved:
            (moved[key],) = fb.op(
                "Redistribute",
                vmap(v),
                names=[f"{v.name}_{_tag(to)}"],
                types=[t.with_placements(to)],
                to=format_placements(to),
            )
        return moved[key]

    for instr in fn.body:
        if isinstance(instr, Op) and REGISTRY[instr.name].kind is OpKind.LOCAL:
            need = _required(instr)
            if any(n is not None for n in need):
                ins = tuple(
                    redistribute(v, n) if n is not None else vmap(v)
                    for v, n in zip(instr.inputs, need, strict=True)
                )
                fb.append(Op(instr.name, ins, tuple(vmap(o) for o in instr.outputs), instr.attrs))
                continue
        fb.append(copy_instr(instr, vmap))
    outs = []
    for i, v in enumerate(fn.outputs):
        t = v.type
        if i in pending:
            outs.append(vmap(v))
        elif isinstance(t, DTensorType) and any(isinstance(p, Partial) for p in t.placements):
            outs.append(
                redistribute(v, tuple(Replicate() if isinstance(p, Partial) else p for p in t.placements))
            )
        else:
            outs.append(vmap(v))
    return module.replace(fb.ret(*outs))


__all__ = ["legalize"]
