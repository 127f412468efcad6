"""Legalization: make every change of placement an explicit ``Redistribute`` op.

For each op of a DTensor program, the strategy is the one (of the op's sharding rule) that gives
its results their declared placements and needs the least communication for its inputs (a
requirement that would shard one dim of an input along two mesh axes only as a last resort, and
then refused: ``ShardingError``, unless the op's values already nest a dim and the strategy
keeps the sizes of the dims it shards: ``choices.keeps_dim_sizes``); every input whose
placements differ from what that strategy takes is redistributed first (one ``Redistribute``
per value and target, reused by later ops).
Results of the function that are still partial (a pending reduction) are reduced, unless the
caller keeps them pending. The output type-checks: every op then takes its inputs exactly as its
strategy says. A pure pass ``Module -> Module``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Final

from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import DTensorType, Mesh, Partial, Placement, Replicate, Shard, format_placements
from distir.ir.function import Module
from distir.ir.ops import Op
from distir.ir.printer import print_op
from distir.ir.rewrite import ValueMap, copy_instr
from distir.ir.types import TensorType, Type
from distir.ir.values import Attrs, Value
from distir.ops.dist import redistribute_source
from distir.ops.dtensor_inference import global_view
from distir.ops.registry import REGISTRY, OpKind
from distir.parallel.sharding.choices import keeps_dim_sizes
from distir.parallel.sharding.propagate import (
    Placed,
    ShardingError,
    op_strategies,
    redistribution_bytes,
    shards_one_dim_twice,
)

# ``_required`` answers, by (op name, sharding rule, input types, result types, attributes): it is
# a pure function of them, and the layers of a model (every microbatch size, TP degree, forward
# and backward) meet the same typed ops again and again. Also ``legalize_placed``'s answers
# (``_moves``), by keys that start with ``_PLACED``. Bounded: cleared when full.
_REQUIRED: dict[tuple[object, ...], list[tuple[Placement, ...] | None]] = {}
_REQUIRED_MAX: Final = 1 << 15


def _required(op: Op, nest: bool = False) -> list[tuple[Placement, ...] | None]:
    """Per input, the placements (one per mesh axis) the op's strategy needs; None for inputs
    that are not distributed tensors (``nest``: the program nests a dim somewhere, so the op may
    too). Memoized (``_REQUIRED``); callers must not mutate the list."""
    key = (
        op.name,
        REGISTRY[op.name].sharding,
        tuple(v.type for v in op.inputs),
        tuple(v.type for v in op.outputs),
        op.attrs,
        nest,
    )
    got = _REQUIRED.get(key)
    if got is None:
        got = _required_of(op, nest)
        if len(_REQUIRED) >= _REQUIRED_MAX:
            _REQUIRED.clear()
        _REQUIRED[key] = got
    return got


def _required_of(op: Op, nest: bool = False) -> list[tuple[Placement, ...] | None]:
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
    return _required_core(
        op,
        glob,
        [t.placements if isinstance(t, DTensorType) else None for t in types],
        gouts,
        [t.placements for t in outs if isinstance(t, DTensorType)],
        mesh,
        nest,
    )


def _required_core(
    op: Op,
    glob: Sequence[Type],
    in_places: Sequence[tuple[Placement, ...] | None],
    gouts: Sequence[Type],
    out_places: Sequence[tuple[Placement, ...]],
    mesh: Mesh,
    nest: bool = False,
) -> list[tuple[Placement, ...] | None]:
    """``_required`` from the global types of ``op``'s inputs and results on the mesh's first
    device (``glob``, ``gouts``), the placements of its inputs (None: not a distributed tensor)
    and of its results. ``op`` gives the name, attributes and error messages."""
    per_axis: list[tuple[Placement, ...]] = []
    n_axes = len(mesh.axes)
    # a program that nests a dim (``nest``; ``distir.parallel.sharding.choices._choose_op``), or
    # values that already do: nesting is then no worse than any other layout, by a strategy that
    # keeps its dims' sizes
    nested = nest or any(pl is not None and shards_one_dim_twice(pl) for pl in (*in_places, *out_places))
    forced = False
    for ax, (axis, n) in enumerate(mesh.axes):
        want = tuple(pl[ax] for pl in out_places)
        have = tuple(pl[ax] if pl is not None else Replicate() for pl in in_places)
        options = [s for s in op_strategies(op.name, glob, gouts, op.attrs, n) if s.outs == want]
        if not options:
            raise ShardingError(
                f"`{print_op(op)}`: no strategy of {op.name} gives results ({format_placements(want)}) "
                f"on mesh axis {axis}"
            )

        if len(options) == 1:
            per_axis.append(options[0].ins)
            continue
        # the cheapest: inputs that would be sharded along the same dim on two mesh axes (where
        # nothing nests, or by a strategy that changes the dim's size) last, then the bytes to
        # move; the first of equals
        # (``min``). Nothing is cheaper than (0, 0.0): the first option costing that is it.
        best = options[0]
        best_cost: tuple[int, float] | None = None
        for st in options:
            clash = 0
            for i, (pl, w) in enumerate(zip(in_places, st.ins, strict=True)):
                if (
                    pl is not None
                    and isinstance(w, Shard)
                    and not (nested and keeps_dim_sizes(st, glob, gouts))
                ):
                    for b in range(n_axes):
                        if b != ax and (per_axis[b][i] if b < ax else pl[b]) == w:
                            clash += 1
                            break
            c = (
                clash,
                float(
                    sum(
                        [
                            redistribution_bytes(g, h, w, n)
                            for g, h, w in zip(glob, have, st.ins, strict=True)
                            if isinstance(g, TensorType)
                        ]
                    )
                ),
            )
            if best_cost is None or c < best_cost:
                best, best_cost = st, c
                if c == (0, 0.0):
                    break
        forced = forced or bool(best_cost and best_cost[0])
        per_axis.append(best.ins)
    need = [tuple(pa[i] for pa in per_axis) if pl is not None else None for i, pl in enumerate(in_places)]
    for v, places in zip(op.inputs, need, strict=True):
        if places is not None and (forced or not nested) and shards_one_dim_twice(places):
            raise ShardingError(
                f"`{print_op(op)}`: every strategy giving its results their placements needs %{v.name} "
                f"as [{format_placements(places)}], one dim sharded along two mesh axes (supported only "
                "where the op's values nest one already)"
            )
    return need


# marks ``_REQUIRED`` keys of ``legalize_placed`` (which name an op by its signature id)
_PLACED: Final = object()


def legalize_placed(
    got: Placed, mesh: Mesh, pending: Collection[int], fb: FunctionBuilder
) -> list[tuple[Value, tuple[Placement, ...] | None]]:
    """``legalize`` of the DTensor program ``propagate`` would build from ``got`` (``place``'s
    result on ``mesh``), emitted into ``fb`` with untyped values and without building that
    program: parameters, then the body with its ``Redistribute`` ops, op for op and name for
    name as ``legalize`` emits them. Returns each result of the function (a value of ``fb``)
    with its placements (None: not a distributed tensor)."""
    plan = got.plan
    fn = plan.fn
    placed = got.placed
    ids = got.ids
    dev0 = mesh.devices[0]
    axes = mesh.axes
    new = _Fresh()
    for p in fn.params:
        new[p] = fb.param(p.name)
    fresh = new.__getitem__
    moved: dict[tuple[Value, tuple[Placement, ...]], Value] = {}
    derived: set[Value] = set()  # computed from constants alone: plain tensors once typed
    like = next((p for p in fn.params if placed.get(p) is not None), None)

    def redistribute(v: Value, to: tuple[Placement, ...]) -> Value:
        key = (v, to)
        got = moved.get(key)
        if got is None:
            tag, attrs = _redistribute_attrs(to)
            if v in derived:  # a plain tensor every device makes: replicated on the mesh of the
                if like is None:  # function's first DTensor
                    raise ShardingError(f"%{v.name} is plain and @{fn.name} has no DTensor to give its mesh")
                ins: tuple[Value, ...] = (new[v], new[like])
                (got,) = fb.emit("Redistribute", ins, attrs, [f"{v.name}_{tag}"])
                moved[key] = got
                return got
            (got,) = fb.emit("Redistribute", (new[v],), attrs, [f"{v.name}_{tag}"])
            moved[key] = got
        return got

    ops = iter(enumerate(plan.ops))
    for instr in fn.body:
        if not isinstance(instr, Op):
            fb.append(copy_instr(instr, fresh))
            continue
        k, op = next(ops)
        if all(v in derived for v in op.inputs):
            derived.update(op.outputs)
        if plan.sharded[k]:
            if plan.sharded[k] < 0:
                raise ShardingError(f"`{print_op(op)}`: every value of a sharded op needs a DTensor type")
            # placements by id (``distir.parallel.sharding.choices._pt_id``): equal ids, equal placements
            key = (
                _PLACED,
                plan.sig[k],
                axes,
                dev0,
                tuple(map(ids.get, op.inputs)),
                tuple(map(ids.__getitem__, op.outputs)),
                got.nest,
            )
            moves = _REQUIRED.get(key)
            if moves is None:
                moves = _moves(op, plan.ins[k], plan.outs[k], placed, mesh, got.nest)
                if len(_REQUIRED) >= _REQUIRED_MAX:
                    _REQUIRED.clear()
                _REQUIRED[key] = moves
            if any(moves):
                ins = tuple(
                    fresh(v) if to is None else redistribute(v, to)
                    for v, to in zip(op.inputs, moves, strict=True)
                )
            else:
                ins = tuple(map(fresh, op.inputs))
            fb.append(Op(op.name, ins, tuple(map(fresh, op.outputs)), op.attrs))
            continue
        fb.append(copy_instr(op, fresh))
    outs: list[tuple[Value, tuple[Placement, ...] | None]] = []
    for i, v in enumerate(fn.outputs):
        lst = placed.get(v)
        pl = tuple(lst) if lst is not None else None
        if i not in pending and pl is not None and any(isinstance(p, Partial) for p in pl):
            to = tuple(Replicate() if isinstance(p, Partial) else p for p in pl)
            outs.append((redistribute(v, to), to))
        elif v in derived and pl is not None:  # a DTensor for the function's caller
            outs.append((redistribute(v, pl), pl))
        else:
            outs.append((fresh(v), pl))
    return outs


def _dtensor_of(op: Op) -> Value | None:
    """An input of ``op`` that is a DTensor (a plain input is replicated on its mesh)."""
    return next((v for v in op.inputs if isinstance(v.type, DTensorType)), None)


# target placements -> (name tag, ``Redistribute`` attributes): a few targets, met in every layer
_TO: dict[tuple[Placement, ...], tuple[str, Attrs]] = {}


def _redistribute_attrs(to: tuple[Placement, ...]) -> tuple[str, Attrs]:
    """``_tag(to)`` and the attributes of ``Redistribute(..., to=...)`` (one shared object)."""
    got = _TO.get(to)
    if got is None:
        if len(_TO) >= 1 << 12:
            _TO.clear()
        got = _TO[to] = (_tag(to), Attrs({"to": format_placements(to)}))
    return got


class _Fresh(dict[Value, Value]):
    """Old values to new untyped ones, made on first use."""

    def __missing__(self, v: Value) -> Value:
        nv = self[v] = Value(v.name)
        return nv


def _moves(
    op: Op,
    ins: Sequence[Type],
    outs: Sequence[Type],
    placed: Mapping[Value, Sequence[Placement]],
    mesh: Mesh,
    nest: bool,
) -> list[tuple[Placement, ...] | None]:
    """Per input of ``op`` (global types ``ins``, results ``outs``, placed as ``placed`` says
    on ``mesh``), the placements ``_required_core`` asks for when they differ from the input's,
    else None."""
    in_places = tuple(tuple(lst) if (lst := placed.get(v)) is not None else None for v in op.inputs)
    out_places = tuple(tuple(placed[v]) for v in op.outputs)
    dev0 = mesh.devices[0]
    # the global view (tensors on the mesh's first device): most already are, and equal types
    # are as good as new ones
    glob = [t if type(t) is TensorType and t.device == dev0 else global_view(t, mesh) for t in ins]
    gouts = [t if type(t) is TensorType and t.device == dev0 else global_view(t, mesh) for t in outs]
    need = _required_core(op, glob, in_places, gouts, out_places, mesh, nest)
    return [n if n is not None and n != pl else None for n, pl in zip(need, in_places, strict=True)]


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

    def redistribute(v: Value, to: tuple[Placement, ...], like: Value | None = None) -> Value:
        t = v.type
        if not isinstance(t, DTensorType) and (like is None or not isinstance(like.type, DTensorType)):
            raise ShardingError(f"%{v.name} is not a DTensor and no DTensor beside it gives its mesh")
        src = redistribute_source(t, like.type if like is not None else None)  # type: ignore[arg-type]
        if src.placements == to and src is t:
            return vmap(v)
        key = (v, to)
        if key not in moved:
            (moved[key],) = fb.op(
                "Redistribute",
                vmap(v),
                *((vmap(like),) if src is not t and like is not None else ()),
                names=[f"{v.name}_{_tag(to)}"],
                types=[src.with_placements(to)],
                to=format_placements(to),
            )
        return moved[key]

    # as propagation: a program whose values nest a dim allows nesting everywhere
    nest = any(
        isinstance(t := v.type, DTensorType) and shards_one_dim_twice(t.placements)
        for v in (*fn.params, *(o for i in fn.body if isinstance(i, Op) for o in i.outputs))
    )
    for instr in fn.body:
        if isinstance(instr, Op) and REGISTRY[instr.name].kind is OpKind.LOCAL:
            need = _required(instr, nest)
            if any(n is not None for n in need):
                ins = tuple(
                    redistribute(v, n, _dtensor_of(instr)) if n is not None else vmap(v)
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
            to = tuple(Replicate() if isinstance(p, Partial) else p for p in t.placements)
            outs.append(redistribute(v, to))
        else:
            outs.append(vmap(v))
    return module.replace(fb.ret(*outs))


__all__ = ["legalize", "legalize_placed"]
