"""Sharding propagation's final choice: the strategy each op takes on each mesh axis, given the
placements its inputs arrive in (``distir.parallel.sharding.propagate.place``), and what it costs.

``_choose`` ranks an op's strategies on one axis (a dim nested along two axes last, unless the
annotations nest one: ``_nesting``; then pinned parameters moved, bytes redistributed, input
moves, the fixed point's hint, the rule's preference); ``_free`` finds its answer without
counting when one strategy costs nothing; ``_choose_op`` chooses on every axis in turn, memoized
by ``place`` in ``_CHOICES`` under ids of placement lists (``_pt_id``). Every function here is
pure in its arguments.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Final, NamedTuple

from distir.ir.dtensor import Partial, Placement, Replicate, Shard, format_placements
from distir.ir.ops import Op
from distir.ir.types import TensorType
from distir.ir.values import Value
from distir.ops.sharding import Strategy
from distir.parallel.sharding.plan import Plan


class ShardingError(ValueError):
    pass


_R = Replicate()
_INF = float("inf")


def redistribution_bytes(t: TensorType, src: Placement, dst: Placement, n: int) -> float:
    """Bytes a device sends to move a tensor of global type ``t`` from ``src`` to ``dst`` along
    an axis of ``n`` devices (ring algorithms); 0 when nothing moves; infinite when impossible
    (a pending reduction is never created: ``Redistribute`` only reduces)."""
    if src == dst:
        return 0.0
    if isinstance(dst, Partial):
        return float("inf")
    if n == 1 or (isinstance(dst, Shard) and isinstance(src, Replicate)):
        return 0.0
    m = float(t.nbytes)
    if isinstance(src, Partial) and isinstance(dst, Replicate):
        return 2 * (n - 1) / n * m
    if isinstance(src, Partial | Shard):
        return (n - 1) / n * m
    return float("inf")  # pragma: no cover - every other pair is handled above


# An op's final choice (``_choose_op``): per axis the strategy it takes, per result its final
# placements and their id (None: not placed), and the axes where its inputs do not arrive as the
# strategy takes them, with the placements they arrive in.
_OpChoice = tuple[
    tuple[Strategy, ...],
    tuple[tuple[tuple[Placement, ...] | None, int | None], ...],
    tuple[tuple[int, tuple[Placement, ...]], ...],
]


def _choose_op(
    op: Op,
    plan: Plan,
    k: int,
    options: Sequence[Sequence[tuple[Strategy, ...]]],
    sizes: tuple[int, ...],
    placed: Mapping[Value, list[Placement | None]],
    fixed: Mapping[Value, list[Placement]],
    pins: tuple[bool, ...],
    nest: bool = False,
) -> _OpChoice:
    """Op ``k`` of ``plan`` chooses a strategy per mesh axis (of sizes ``sizes``), in axis order,
    each by ``_choose`` given what the axes before took; ``placed`` holds its inputs' final
    placements and its results' from the fixed point (``fixed``: the annotated ones). Reads
    ``placed``, never writes it. Raises ShardingError when a result would shard one dim along
    two mesh axes and nothing nests. A pure function of the op's signature (``plan.sig[k]``), the sizes, those
    placements, which results are annotated, ``pins`` (per input: pinned) and ``nest`` (the
    annotations nest a dim: nesting is then no worse than any other layout)."""
    types = plan.types
    n_axes = len(sizes)
    chosen: list[Strategy] = []
    in_lists = [placed.get(v) for v in op.inputs]
    # per result: its placements so far (axes before the current one: what the op chose)
    out_lists = [list(lst) if lst is not None else None for lst in (placed.get(v) for v in op.outputs)]
    # (output position, type, fixed placements) of the annotated tensor results
    targets: list[tuple[int, TensorType, list[Placement]]] = []
    for i, v in enumerate(op.outputs):
        tv = types[v]
        if v in fixed and isinstance(tv, TensorType):
            targets.append((i, tv, fixed[v]))
    moved: list[tuple[int, tuple[Placement, ...]]] = []
    # where the annotations nest a dim (context with sequence parallelism), an op keeps or makes
    # such layouts as cheaply as any other, by strategies that keep the sizes of the dims they
    # shard (``keeps_dim_sizes``); elsewhere a strategy that makes one is a last resort
    # (``_choose``), and an op's inputs nest only where an annotation does
    nested = nest or any(lst is not None and shards_one_dim_twice(lst) for lst in in_lists)
    forced = False  # a nesting strategy taken as the last resort
    for ax, n in enumerate(sizes):
        # every tensor is placed by now (no None left): a value without a list is not a tensor
        # (replicated)
        have: tuple[Placement, ...] = tuple([lst[ax] if lst is not None else _R for lst in in_lists])  # type: ignore[misc]
        hint: tuple[Placement, ...] = tuple([lst[ax] if lst is not None else _R for lst in out_lists])  # type: ignore[misc]
        opts = options[ax][k]
        if len(opts) == 1:
            pick = opts[0]
        else:
            # what the other axes hold (or, for inputs on earlier axes, take): a strategy that
            # shards a dim along this axis too clashes
            in_other, out_other = _others(ax, n_axes, chosen, in_lists, out_lists)
            if nested:
                opts, in_other, out_other, last = _nesting(op, plan, opts, in_other, out_other)
                forced = forced or last
            tgt = tuple((i, fx[ax]) for i, _, fx in targets)
            got = _free(opts, have, hint, in_other, out_other, plan.movable[k], tgt)
            if got is None:
                # (input position, type, pinned) of the tensor inputs: only they can move
                movable = [(i, tv, pins[i]) for i, tv in plan.movable[k]]
                got = _choose(opts, n, have, hint, in_other, out_other, movable, targets, tgt)
            pick = got
        if pick.ins != have:
            moved.append((ax, have))
        chosen.append(pick)
        for lst, p in zip(out_lists, pick.outs, strict=True):
            if lst is not None:
                lst[ax] = p
    finals: list[tuple[tuple[Placement, ...] | None, int | None]] = []
    for v, lst in zip(op.outputs, out_lists, strict=True):
        if lst is None:
            finals.append((None, None))
            continue
        # ``_choose`` takes such a strategy only when every other one clashes too
        if n_axes > 1 and (forced or not nested) and shards_one_dim_twice(lst):
            raise ShardingError(
                f"%{v.name}: every strategy of {op.name} shards one dim along two mesh axes "
                f"([{format_placements(tuple(p or _R for p in lst))}]), which is supported only where the "
                "annotations nest one, by strategies that keep the dim's size"
            )
        fin = tuple(p or _R for p in lst)
        finals.append((fin, _pt_id(fin)))
    return tuple(chosen), tuple(finals), tuple(moved)


_Others = tuple[tuple[Placement | None, ...], ...]


def _others(
    ax: int,
    n_axes: int,
    chosen: Sequence[Strategy],
    in_lists: Sequence[Sequence[Placement | None] | None],
    out_lists: Sequence[Sequence[Placement | None] | None],
) -> tuple[_Others, _Others]:
    """Per input and result of an op choosing on axis ``ax``, what the other axes hold: for
    inputs, what the axes before took (``chosen``) and what the later ones hold; for results,
    what the fixed point gave them (``_choose_op``)."""
    in_other: _Others
    if n_axes == 2:  # the (dp, tp) meshes of the layers: one other axis
        b = 1 - ax
        if b < ax:
            in_other = tuple([(w,) for w in chosen[b].ins])
        else:
            in_other = tuple([(lst[b],) if lst is not None else (_R,) for lst in in_lists])
        return in_other, tuple([(lst[b],) if lst is not None else () for lst in out_lists])
    others = [b for b in range(n_axes) if b != ax]
    in_other = tuple(
        tuple(chosen[b].ins[i] if b < ax else lst[b] if lst is not None else _R for b in others)
        for i, lst in enumerate(in_lists)
    )
    return in_other, tuple(tuple(lst[b] for b in others) if lst is not None else () for lst in out_lists)


def keeps_dim_sizes(st: Strategy, ins: Sequence[object], outs: Sequence[object]) -> bool:
    """Whether every dim ``st`` shards (of the tensors ``ins`` and ``outs``, global types) has one
    size: the strategy splits one extent the same way in every operand, so when an earlier axis
    has split that dim its pieces still correspond (elementwise ops, norms, a product's rows or
    contraction, attention's sequence). A ``Reshape`` merging or splitting the dim maps pieces by
    the global extent's boundaries, which an outer split moves."""
    size = -1
    for ps, ts in ((st.ins, ins), (st.outs, outs)):
        for p, t in zip(ps, ts, strict=True):
            if isinstance(p, Shard) and isinstance(t, TensorType):
                if size >= 0 and t.shape[p.dim] != size:
                    return False
                size = t.shape[p.dim]
    return True


class _Nesting(NamedTuple):
    """What an op chooses from on one axis where nesting is allowed (``_nesting``)."""

    options: tuple[Strategy, ...]
    in_other: _Others
    out_other: _Others
    forced: bool  # every option nests a dim it changes the size of: the last resort


def _nesting(
    op: Op, plan: Plan, opts: tuple[Strategy, ...], in_other: _Others, out_other: _Others
) -> _Nesting:
    """An op's options on one axis where nesting is allowed (``_choose_op``): those that keep
    their dims' sizes or nest nothing, then judged without clashes; when none is, all of them
    with their clashes (the last resort: the caller refuses a result it nests)."""
    ins = [plan.types.get(v) for v in op.inputs]
    outs = [plan.types.get(v) for v in op.outputs]
    ok = [st for st in opts if keeps_dim_sizes(st, ins, outs) or not _clashes(st, in_other, out_other)]
    if not ok:
        return _Nesting(opts, in_other, out_other, True)
    return _Nesting(tuple(ok), tuple(() for _ in in_other), tuple(() for _ in out_other), False)


def _clashes(st: Strategy, in_other: _Others, out_other: _Others) -> bool:
    """Whether ``st`` shards a dim along this axis that another axis shards too."""
    return any(isinstance(w, Shard) and w in o for w, o in zip(st.ins, in_other, strict=True)) or any(
        isinstance(q, Shard) and q in o for q, o in zip(st.outs, out_other, strict=True)
    )


# placement lists -> small ints, so that memo keys hash ints instead of placements (a dataclass
# hashes in Python). Ids are never reused: clearing the table when full only makes later keys of
# a list differ from earlier ones (a memo miss, never a wrong hit).
_PT_IDS: dict[tuple[Placement, ...], int] = {}
_PT_IDS_MAX: Final = 1 << 15
_next_pt = itertools.count()


def _pt_id(places: tuple[Placement, ...]) -> int:
    got = _PT_IDS.get(places)
    if got is None:
        if len(_PT_IDS) >= _PT_IDS_MAX:
            _PT_IDS.clear()
        got = _PT_IDS[places] = next(_next_pt)
    return got


def shards_one_dim_twice(places: Sequence[Placement | None]) -> bool:
    """Whether two mesh axes shard the same dim: nested, each axis splitting the pieces the axes
    before it left (``distir.parallel.sharding.materialize.local_shape_at``)."""
    dims = [p.dim for p in places if isinstance(p, Shard)]
    return len(dims) != len(set(dims))


# ``_choose_op`` answers (see there), keyed by everything they depend on: the op's signature (name,
# sharding rule, global types and attributes, which fix its options and the bytes of every move),
# the axis sizes, and the placements around it (by id). Layers meet the same typed ops again and
# again. Bounded: cleared when full.
_CHOICES: dict[tuple[object, ...], _OpChoice] = {}
_CHOICES_MAX: Final = 1 << 15


def _choose(
    options: Sequence[Strategy],
    n: int,
    have: tuple[Placement, ...],
    hint: tuple[Placement, ...],
    in_other: Sequence[Sequence[Placement | None]],
    out_other: Sequence[Sequence[Placement | None]],
    movable: Sequence[tuple[int, TensorType, bool]],
    targets: Sequence[tuple[int, TensorType, list[Placement]]],
    tgt: Sequence[tuple[int, Placement]],
) -> Strategy:
    """The strategy an op takes on one mesh axis of ``n`` devices when its inputs arrive in
    ``have`` (``propagate``'s final choice): layouts that shard a dim along two mesh axes, given
    what the other axes hold (``in_other``, ``out_other``; empty where nesting is allowed) last; then
    strategies that move a pinned parameter; then total bytes to redistribute inputs into the
    strategy and results into their annotated placements (``targets``, with this axis' placement
    in ``tgt``); then fewer input moves; then the one whose results are ``hint`` (what the fixed
    point gave them); then the rule's preference. Keys are distinct: the index comes last. A pure
    function of its arguments (``movable`` and ``targets`` through their types and pin flags)."""
    best: tuple[int, int, float, int, int, int, int, int] | None = None
    pick = options[0]
    for idx, st in enumerate(options):
        clash = 0
        for i, w in enumerate(st.ins):
            if isinstance(w, Shard) and w in in_other[i]:
                clash += 1
        for i, q in enumerate(st.outs):
            if isinstance(q, Shard) and q in out_other[i]:
                clash += 1
        if best is not None and clash > best[0]:
            continue  # its key is larger, whatever the rest
        total, moves, costly, moved_pins = 0.0, 0, 0, 0
        sins = st.ins
        for i, tv, is_pin in movable:
            h, w = have[i], sins[i]
            if h is not w and h != w:
                # on one device only creating a pending sum is impossible, the rest free
                nb = (
                    (_INF if isinstance(w, Partial) else 0.0) if n == 1 else redistribution_bytes(tv, h, w, n)
                )
                total += nb
                moves += 1
                if nb > 0:
                    costly += 1
                    if is_pin:
                        moved_pins += 1
        mismatch = 0
        for (i, tv, _), (_, want) in zip(targets, tgt, strict=True):
            q = st.outs[i]
            if q is not want and q != want:
                total += (
                    (_INF if isinstance(want, Partial) else 0.0)
                    if n == 1
                    else redistribution_bytes(tv, q, want, n)
                )
                mismatch += 1
        # at equal bytes and no collective on the inputs, produce an annotated result
        # directly: computing it replicated and slicing it after does the work n times
        key = (clash, moved_pins, total, costly, mismatch, moves, 0 if st.outs == hint else 1, idx)
        if best is None or key < best:
            best, pick = key, st
    return pick


def _free(
    options: Sequence[Strategy],
    have: tuple[Placement, ...],
    hint: tuple[Placement, ...],
    in_other: Sequence[Sequence[Placement | None]],
    out_other: Sequence[Sequence[Placement | None]],
    movable: Sequence[tuple[int, TensorType]],
    tgt: Sequence[tuple[int, Placement]],
) -> Strategy | None:
    """``_choose``'s answer when it costs nothing, found without counting: the first strategy
    that clashes nowhere, takes every tensor input as it arrives (no move, so no pinned move and
    no bytes), gives the annotated results their placements (``tgt``) and its results the fixed
    point's (``hint``). Its key in ``_choose`` is all zeros up to the index, the least possible,
    so it is ``_choose``'s pick; None when no strategy is free."""
    for st in options:
        outs = st.outs
        if outs != hint:
            continue
        sins = st.ins
        for i, _ in movable:
            h, w = have[i], sins[i]
            if h is not w and h != w:
                break
        else:
            for i, want in tgt:
                q = outs[i]
                if q is not want and q != want:
                    break
            else:
                for i, w in enumerate(sins):
                    if isinstance(w, Shard) and w in in_other[i]:
                        break
                else:
                    for i, q in enumerate(outs):
                        if isinstance(q, Shard) and q in out_other[i]:
                            break
                    else:
                        return st
    return None
