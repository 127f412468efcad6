"""Sharding propagation: from placements annotated on a few values to a placement for every value.

Input: a sequential program (all on one device), a mesh and annotations — placements for some
values, by name (typically weights and inputs). Each mesh axis is handled on its own. Every op
offers strategies through its registry sharding rule; propagation iterates to a fixed point,
forward and backward: an op with some values placed and a strategy consistent with all of them
places its other values from that strategy (operands → results, results → operands, some
operands → the rest, as Automap describes). Values still unknown at the fixed point are
replicated. Finally each op, in program order, takes the strategy its inputs' placements ask
for; when no strategy takes them as they are (rules conflict), it takes the strategy that needs
the least communication to redistribute its inputs, and the conflict is reported. Axes are
independent except for one thing: one dim of a value sharded along two mesh axes (a layout
materialization does not support). The fixed point never fills a placement that would make one
(a parameter keeps what the fixed point gives it, so no later choice could undo it); the final
choice takes a strategy that makes one only when every other does too, and then reports the value
(``ShardingError``).

The result is a DTensor program: the same ops, every tensor value typed ``DTensor[...]`` with
its producer's placements. Where an op's strategy needs other placements for an input,
``distir.parallel.legalize`` inserts the redistribution.

``propagate`` is ``Plan`` (what the function alone fixes: types, options, pins) then ``place``
(the fixed point and the final choice, one op at a time, memoized on everything an op's choice
depends on). ``distir.parallel.layers.shard_function`` keeps plans and builds the legalized
function straight from ``place``'s placements, without the DTensor program. ``Plan`` and the
tables it shares with legalization live in ``distir.parallel.propagate_plan`` (re-exported here).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import (
    DTensorType,
    Mesh,
    Partial,
    Placement,
    Replicate,
    Shard,
    format_placements,
)
from distir.ir.function import Function, Module
from distir.ir.ops import Call, Op
from distir.ir.rewrite import ValueMap, copy_instr, inline_calls
from distir.ir.types import TensorType, Type
from distir.ir.values import Value
from distir.ops.sharding import Strategy
from distir.parallel.propagate_plan import Plan as Plan
from distir.parallel.propagate_plan import op_strategies as op_strategies
from distir.parallel.propagate_plan import parsed_placements as parsed_placements


class ShardingError(ValueError):
    pass


_R = Replicate()
_INF = float("inf")


@dataclass(frozen=True, slots=True)
class Conflict:
    """An op whose inputs arrive in placements none of its strategies takes (one mesh axis).
    ``op`` is printed only when the conflict is (the profiler shards thousands of layers and
    reads no conflict)."""

    instr: Op
    axis: str
    have: tuple[Placement, ...]
    chosen: Strategy

    @property
    def op(self) -> str:
        from distir.ir.printer import print_op

        return print_op(self.instr)

    def __str__(self) -> str:
        return (
            f"`{self.op}` on mesh axis {self.axis}: inputs are ({', '.join(map(str, self.have))}); "
            f"chose {self.chosen} (cheapest redistribution)"
        )


@dataclass
class Propagation:
    module: Module  # the DTensor program (before legalization)
    strategies: dict[Op, tuple[Strategy, ...]] = field(default_factory=dict)  # per op, per axis
    conflicts: list[Conflict] = field(default_factory=list)


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


def _annotation(value: str, a: str | Sequence[Placement], mesh: Mesh) -> tuple[Placement, ...]:
    places = parsed_placements(a) if isinstance(a, str) else tuple(a)
    if len(places) != len(mesh.axes):
        raise ShardingError(
            f"annotation of %{value} gives {len(places)} placements for a mesh of {len(mesh.axes)} axes"
        )
    if shards_one_dim_twice(places):
        raise ShardingError(
            f"annotation of %{value} [{format_placements(places)}]: two mesh axes shard the same dim; "
            "not supported yet"
        )
    return places


def propagate(
    module: Module,
    mesh: Mesh,
    annotations: Mapping[str, str | Sequence[Placement]],
    *,
    params: Mapping[int, str | Sequence[Placement]] | None = None,
    results: Mapping[int, str | Sequence[Placement]] | None = None,
    replicate_results: bool = True,
    pinned: Collection[int] = (),
) -> Propagation:
    """Place every tensor value of the entry (calls are inlined first). See the module docstring.

    ``annotations`` name values; ``params`` / ``results`` annotate the entry's parameters and
    results by position (for generated code whose names are only hints). With
    ``replicate_results=False``, results nobody annotated keep whatever placement their producer
    gives them (a transform that composes functions chooses the placements at the boundaries).

    ``pinned`` lists entry parameters (by position, annotated ones) that are used where they
    lie: an op takes the strategy that moves a pinned value (collective bytes > 0) only when every
    other one would too — before counting bytes. Tensor parallelism pins the weights: gathering a
    weight can move fewer bytes than gathering the activation it multiplies (a microbatch of more
    tokens than the weight has rows), but then the layer is no longer tensor-parallel."""
    fn = module.entry
    if any(isinstance(i, Call) for i in fn.body):
        fn = inline_calls(module)
    plan = Plan(fn)
    got = place(plan, mesh, annotations, params, results, replicate_results, pinned)
    result = Propagation(Module((fn,)), got.strategies, got.conflicts)
    result.module = _typed(fn, plan.types, got.placed, mesh)
    return result


@dataclass
class Placed:
    """``place``'s result: every placed value's placements (one per mesh axis), and per op the
    strategy it takes on each axis and its conflicts."""

    plan: Plan
    placed: dict[Value, list[Placement]]
    strategies: dict[Op, tuple[Strategy, ...]]
    conflicts: list[Conflict]
    ids: dict[Value, int]  # per placed value, the id of its placements (``_pt_id``)


def place(
    plan: Plan,
    mesh: Mesh,
    annotations: Mapping[str, str | Sequence[Placement]],
    params: Mapping[int, str | Sequence[Placement]] | None = None,
    results: Mapping[int, str | Sequence[Placement]] | None = None,
    replicate_results: bool = True,
    pinned: Collection[int] = (),
) -> Placed:
    """``propagate`` on a plan of the flat entry, without building the DTensor program."""
    fn = plan.fn
    types = plan.types
    if annotations:
        by_name = plan.by_name()
        for name in annotations:
            if name not in by_name:
                raise ShardingError(f"annotation names %{name}, which the program does not define")
    positional: dict[Value, str | Sequence[Placement]] = {}
    for where, seq, by_pos in (("parameter", fn.params, params), ("result", fn.outputs, results)):
        for i, a in (by_pos or {}).items():
            if not 0 <= i < len(seq):
                raise ShardingError(f"@{fn.name} has no {where} {i}")
            positional[seq[i]] = a
    ops = plan.ops
    n_axes = len(mesh.axes)
    placed: dict[Value, list[Placement | None]] = {v: [None] * n_axes for v in plan.tensors}
    given: list[tuple[Value, str | Sequence[Placement]]] = [
        (plan.by_name()[n], a) for n, a in annotations.items()
    ]
    given.extend(positional.items())
    for v, a in given:
        name = v.name
        if v not in placed:
            raise ShardingError(f"%{name} is not a tensor, so it cannot be sharded")
        for ax, p in enumerate(_annotation(name, a, mesh)):
            if isinstance(p, Shard) and p.dim >= len(types[v].shape):  # type: ignore[union-attr]
                raise ShardingError(f"%{name}: {p} is out of range for shape {types[v].shape}")  # type: ignore[union-attr]
            placed[v][ax] = p
    entry_params = plan.params
    for i in pinned:
        if not 0 <= i < len(fn.params) or fn.params[i] not in positional:
            raise ShardingError(f"@{fn.name}: pinned parameter {i} is not an annotated parameter")
    # annotated values are constraints; results of the program are replicated unless annotated
    fixed = {v for v, _ in given}
    for v in fn.outputs if replicate_results else ():
        if v not in fixed and v in placed and v not in entry_params:
            placed[v] = [Replicate()] * n_axes
            fixed.add(v)
    fixed_at = {v: [p or Replicate() for p in placed[v]] for v in fixed if v in placed}
    sizes = tuple(n for _, n in mesh.axes)
    options = [plan.options(n) for n in sizes]  # per axis, per op
    fills = [plan.fill(n) for n in sizes]

    # per op: the placement lists of its values (None: not a tensor, i.e. always replicated)
    lists_of = [[placed.get(v) for v in vals] for vals in plan.vals]
    # fixed point: fill unknown placements from strategies consistent with the known ones. An op
    # whose values are all placed on every axis stays so: later sweeps skip it.
    open_ops = list(range(len(ops)))
    done = [[False] * n_axes for _ in ops]  # per op and axis: every value placed (it stays so)
    # per op and axis: the known placements when no strategy was consistent with them. While
    # they stay so, none is: the other axes only gain placements, which only rejects more.
    stuck: list[list[list[Placement | None] | None]] = [[None] * n_axes for _ in ops]
    changed = True
    while changed:
        changed = False
        for order in (open_ops, open_ops[::-1]):
            for j in order:
                lists = lists_of[j]
                is_param = plan.is_param[j]
                done_j = done[j]
                stuck_j = stuck[j]
                for ax in range(n_axes):
                    if done_j[ax]:
                        continue
                    known: list[Placement | None] = []
                    n_none = 0
                    for lst in lists:
                        if lst is None:
                            known.append(_R)
                        else:
                            x = lst[ax]
                            if x is None:
                                n_none += 1
                            known.append(x)
                    if n_none == 0:
                        done_j[ax] = True
                        continue
                    if n_none == len(known) or known == stuck_j[ax]:
                        continue
                    for places in fills[ax][j]:
                        # consistent with every known placement (plain loops: this is the hot spot)
                        for kp, p in zip(known, places, strict=True):
                            if kp is not None and kp is not p and kp != p:
                                break
                        else:
                            for param, lst, kp, p in zip(is_param, lists, known, places, strict=True):
                                if kp is None and (
                                    # a parameter is never guessed to be a pending sum; annotate it
                                    # if meant
                                    (param and isinstance(p, Partial))
                                    # nor is a dim sharded along two mesh axes: no op's choice can
                                    # undo that for a parameter (``lst[ax]`` is None, so ``in``
                                    # sees the other axes)
                                    or (isinstance(p, Shard) and p in lst)  # type: ignore[operator]
                                ):
                                    break
                            else:
                                for lst, kp, p in zip(lists, known, places, strict=True):
                                    if kp is None and lst is not None:
                                        lst[ax] = p
                                        changed = True
                                break
                    else:
                        stuck_j[ax] = known
        open_ops = [j for j in open_ops if not all(done[j])]
    for ps in placed.values():
        for ax in range(len(ps)):
            if ps[ax] is None:
                ps[ax] = Replicate()
    # final choice per op, in program order: the producer's placements are what consumers get.
    # Placement lists are named by interned ids (``_pt_id``): here those the fixed point gave, and
    # once an op has chosen, its results' final ones (consumers come later)
    ids = {v: _pt_id(tuple(ps)) for v, ps in placed.items()}  # type: ignore[arg-type]
    pin_flags = plan.pin_flags(tuple(pinned))
    strategies: dict[Op, tuple[Strategy, ...]] = {}
    conflicts: list[Conflict] = []
    for k, op in enumerate(ops):
        # everything the op's choice depends on (``_choose_op``): its signature (options, types),
        # the axis sizes, its inputs' final placements and its results' from the fixed point,
        # which results are annotated, which inputs pinned
        outs = op.outputs
        ckey = (
            plan.sig[k],
            sizes,
            tuple([ids.get(v) for v in op.inputs]),
            tuple([ids.get(v) for v in outs]),
            tuple([v in fixed_at for v in outs]) if fixed_at else None,
            pin_flags[k],
        )
        got = _CHOICES.get(ckey)
        if got is None:
            got = _choose_op(op, plan, k, options, sizes, placed, fixed_at, pin_flags[k])
            if len(_CHOICES) >= _CHOICES_MAX:
                _CHOICES.clear()
            _CHOICES[ckey] = got
        chosen, finals, moved = got
        for v, (fin, fid) in zip(outs, finals, strict=True):
            if fid is not None:
                placed[v] = list(fin)  # type: ignore[arg-type]
                ids[v] = fid
        for ax, have in moved:
            conflicts.append(Conflict(op, mesh.axes[ax][0], have, chosen[ax]))
        strategies[op] = chosen
    return Placed(plan, placed, strategies, conflicts, ids)  # type: ignore[arg-type]


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
) -> _OpChoice:
    """Op ``k`` of ``plan`` chooses a strategy per mesh axis (of sizes ``sizes``), in axis order,
    each by ``_choose`` given what the axes before took; ``placed`` holds its inputs' final
    placements and its results' from the fixed point (``fixed``: the annotated ones). Reads
    ``placed``, never writes it. Raises ShardingError when a result would shard one dim along
    two mesh axes. A pure function of the op's signature (``plan.sig[k]``), the sizes, those
    placements, which results are annotated and ``pins`` (per input: pinned)."""
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
            in_other: tuple[tuple[Placement | None, ...], ...]
            out_other: tuple[tuple[Placement | None, ...], ...]
            if n_axes == 2:  # the (dp, tp) meshes of the layers: one other axis
                b = 1 - ax
                if b < ax:
                    in_other = tuple([(w,) for w in chosen[b].ins])
                else:
                    in_other = tuple([(lst[b],) if lst is not None else (_R,) for lst in in_lists])
                out_other = tuple([(lst[b],) if lst is not None else () for lst in out_lists])
            else:
                others = [b for b in range(n_axes) if b != ax]
                in_other = tuple(
                    tuple(chosen[b].ins[i] if b < ax else lst[b] if lst is not None else _R for b in others)
                    for i, lst in enumerate(in_lists)
                )
                out_other = tuple(
                    tuple(lst[b] for b in others) if lst is not None else () for lst in out_lists
                )
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
        if n_axes > 1 and shards_one_dim_twice(lst):
            raise ShardingError(
                f"%{v.name}: every strategy of {op.name} shards one dim along two mesh axes "
                f"([{format_placements(tuple(p or _R for p in lst))}]), which is not supported"
            )
        fin = tuple(p or _R for p in lst)
        finals.append((fin, _pt_id(fin)))
    return tuple(chosen), tuple(finals), tuple(moved)


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
    """Whether two mesh axes shard the same dim (a layout materialization does not support)."""
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
    ``have`` (``propagate``'s final choice): layouts materialization cannot handle (a dim sharded
    along two mesh axes, given what the other axes hold: ``in_other``, ``out_other``) last; then
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


def _typed(
    fn: Function, types: Mapping[Value, Type], placed: Mapping[Value, Sequence[Placement | None]], mesh: Mesh
) -> Module:
    """The entry with every tensor value typed as a DTensor with its placements."""

    made: dict[tuple[TensorType, tuple[Placement, ...]], DTensorType] = {}  # types are immutable

    def dtype_of(v: Value) -> Type | None:
        t = types.get(v)
        if isinstance(t, TensorType) and v in placed:
            places = tuple(p or _R for p in placed[v])
            got = made.get((t, places))
            if got is None:
                got = made[(t, places)] = DTensorType(t.dtype, t.shape, mesh, places)
            return got
        return t

    vmap = ValueMap(lambda v: Value(v.name, dtype_of(v)))
    fb = FunctionBuilder(fn.name)
    for p in fn.params:
        vmap.bind(p, fb.param(p.name, dtype_of(p)))
    for instr in fn.body:
        fb.append(copy_instr(instr, vmap))
    return Module((fb.ret(*(vmap(v) for v in fn.outputs)),))
