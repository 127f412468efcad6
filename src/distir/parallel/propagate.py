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
independent except for one thing: a strategy that would shard one dim of a value along two mesh
axes (a layout materialization does not support) is taken only when no other is possible.

The result is a DTensor program: the same ops, every tensor value typed ``DTensor[...]`` with
its producer's placements. Where an op's strategy needs other placements for an input,
``distir.parallel.legalize`` inserts the redistribution.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from distir.interp.shapes import infer_types, type_of
from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import (
    DTensorType,
    Mesh,
    Partial,
    Placement,
    Replicate,
    Shard,
    format_placements,
    parse_placements,
)
from distir.ir.function import Function, Module
from distir.ir.ops import Call, Op
from distir.ir.rewrite import ValueMap, copy_instr, inline_calls
from distir.ir.types import TensorType, Type
from distir.ir.values import Attrs, Value
from distir.ops.registry import REGISTRY
from distir.ops.sharding import Strategy


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


def op_strategies(
    name: str, ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int
) -> tuple[Strategy, ...]:
    """``REGISTRY[name].strategies(ins, outs, attrs, n)``, memoized by the op's definition
    (``OpDef.strategy_options``): propagation and legalization ask the same questions again and
    again."""
    return REGISTRY[name].strategy_options(ins, outs, attrs, n)


def _annotation(value: str, a: str | Sequence[Placement], mesh: Mesh) -> tuple[Placement, ...]:
    places = parse_placements(a) if isinstance(a, str) else tuple(a)
    if len(places) != len(mesh.axes):
        raise ShardingError(
            f"annotation of %{value} gives {len(places)} placements for a mesh of {len(mesh.axes)} axes"
        )
    dims = [p.dim for p in places if isinstance(p, Shard)]
    if len(dims) != len(set(dims)):
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
    flat = Module((fn,))
    _, env = infer_types(flat)
    types: dict[Value, Type] = {v: type_of(x) for v, x in env.items()}
    by_name: dict[str, Value] = {}
    for v in types:
        by_name.setdefault(v.name, v)
    for name in annotations:
        if name not in by_name:
            raise ShardingError(f"annotation names %{name}, which the program does not define")
    positional: dict[Value, str | Sequence[Placement]] = {}
    for where, seq, by_pos in (("parameter", fn.params, params), ("result", fn.outputs, results)):
        for i, a in (by_pos or {}).items():
            if not 0 <= i < len(seq):
                raise ShardingError(f"@{fn.name} has no {where} {i}")
            positional[seq[i]] = a
    ops = [i for i in fn.body if isinstance(i, Op)]
    # constants (ops without inputs) stay plain tensors of the logical program: replicated
    constants = {v for op in ops if not op.inputs for v in op.outputs}
    placed: dict[Value, list[Placement | None]] = {
        v: [None] * len(mesh.axes)
        for v, t in types.items()
        if isinstance(t, TensorType) and v not in constants
    }
    given: list[tuple[Value, str | Sequence[Placement]]] = [(by_name[n], a) for n, a in annotations.items()]
    given.extend(positional.items())
    for v, a in given:
        name = v.name
        if v not in placed:
            raise ShardingError(f"%{name} is not a tensor, so it cannot be sharded")
        for ax, p in enumerate(_annotation(name, a, mesh)):
            if isinstance(p, Shard) and p.dim >= len(types[v].shape):  # type: ignore[union-attr]
                raise ShardingError(f"%{name}: {p} is out of range for shape {types[v].shape}")  # type: ignore[union-attr]
            placed[v][ax] = p
    entry_params = set(fn.params)
    for i in pinned:
        if not 0 <= i < len(fn.params) or fn.params[i] not in positional:
            raise ShardingError(f"@{fn.name}: pinned parameter {i} is not an annotated parameter")
    pins = {fn.params[i] for i in pinned}
    for op in ops:  # values computed from pinned ones alone (a weight's transpose) are weights too
        if pins and op.inputs and all(v in pins or v in constants for v in op.inputs):
            pins.update(op.outputs)
    # annotated values are constraints; results of the program are replicated unless annotated
    fixed = {v for v, _ in given}
    for v in fn.outputs if replicate_results else ():
        if v not in fixed and v in placed and v not in entry_params:
            placed[v] = [Replicate()] * len(mesh.axes)
            fixed.add(v)
    fixed_at = {v: [p or Replicate() for p in placed[v]] for v in fixed if v in placed}
    strat: dict[tuple[Op, int], tuple[Strategy, ...]] = {}
    # per op: what fixes its options and move costs (name, global types, attributes), and which
    # inputs are pinned (``_choose``'s memo key)
    sig: dict[Op, tuple[object, ...]] = {}
    pin_flags: dict[Op, tuple[bool, ...]] = {}
    for op in ops:
        ins = [types[v] for v in op.inputs]
        outs = [types[v] for v in op.outputs]
        sig[op] = (op.name, REGISTRY[op.name].sharding, tuple(ins), tuple(outs), op.attrs)
        pin_flags[op] = tuple(v in pins for v in op.inputs)
        for ax, (_, n) in enumerate(mesh.axes):
            strat[(op, ax)] = op_strategies(op.name, ins, outs, op.attrs, n)

    n_axes = len(mesh.axes)
    # per op: its values, their placement lists (None: not a tensor, i.e. always replicated)
    # and which are entry parameters
    views = {
        op: (vals, [placed.get(v) for v in vals], [v in entry_params for v in vals])
        for op in ops
        for vals in ((*op.inputs, *op.outputs),)
    }
    # fixed point: fill unknown placements from strategies consistent with the known ones. An op
    # whose values are all placed on every axis stays so: later sweeps skip it.
    open_ops = list(ops)
    changed = True
    while changed:
        changed = False
        for order in (open_ops, open_ops[::-1]):
            for op in order:
                _, lists, is_param = views[op]
                for ax in range(n_axes):
                    known = [lst[ax] if lst is not None else _R for lst in lists]
                    n_none = known.count(None)
                    if n_none == 0 or n_none == len(known):
                        continue
                    for st in strat[(op, ax)]:
                        places = (*st.ins, *st.outs)
                        if all(k is None or k == p for k, p in zip(known, places, strict=True)) and not any(
                            k is None and param and isinstance(p, Partial)
                            for param, k, p in zip(is_param, known, places, strict=True)
                        ):  # a parameter is never guessed to be a pending sum; annotate it if meant
                            for lst, k, p in zip(lists, known, places, strict=True):
                                if k is None and lst is not None:
                                    lst[ax] = p
                                    changed = True
                            break
        open_ops = [op for op in open_ops if any(lst is not None and None in lst for lst in views[op][1])]
    for ps in placed.values():
        for ax in range(len(ps)):
            if ps[ax] is None:
                ps[ax] = Replicate()
    # final choice per op, in program order: the producer's placements are what consumers get
    result = Propagation(flat)
    for op in ops:
        chosen: list[Strategy] = []
        # (input position, type, pinned) of the tensor inputs: only they can move; (output
        # position, type, fixed placements) of the annotated tensor results
        movable: list[tuple[int, TensorType, bool]] = []
        for i, v in enumerate(op.inputs):
            tv = types[v]
            if isinstance(tv, TensorType):
                movable.append((i, tv, v in pins))
        in_lists = [placed.get(v) for v in op.inputs]
        out_lists = [placed.get(v) for v in op.outputs]
        targets: list[tuple[int, TensorType, list[Placement]]] = []
        for i, v in enumerate(op.outputs):
            tv = types[v]
            if v in fixed_at and isinstance(tv, TensorType):
                targets.append((i, tv, fixed_at[v]))
        for ax, (axis, n) in enumerate(mesh.axes):
            # every tensor is placed by now: a value without a list is not a tensor (replicated)
            have: tuple[Placement, ...] = tuple(lst[ax] or _R if lst is not None else _R for lst in in_lists)
            hint: tuple[Placement, ...] = tuple(lst[ax] or _R if lst is not None else _R for lst in out_lists)
            options = strat[(op, ax)]
            if len(options) == 1:
                pick = options[0]
            else:
                others = [b for b in range(n_axes) if b != ax]
                # what the other axes hold (or, for inputs on earlier axes, take): a strategy that
                # shards a dim along this axis too clashes
                in_other = tuple(
                    tuple(chosen[b].ins[i] if b < ax else lst[b] if lst is not None else _R for b in others)
                    for i, lst in enumerate(in_lists)
                )
                out_other = tuple(
                    tuple(lst[b] for b in others) if lst is not None else () for lst in out_lists
                )
                tgt = tuple((i, fx[ax]) for i, _, fx in targets)
                # everything the choice depends on besides the options' own key (``sig``)
                ckey = (sig[op], n, have, hint, in_other, out_other, pin_flags[op], tgt)
                got = _CHOICES.get(ckey)
                if got is None:
                    got = _choose(options, n, have, hint, in_other, out_other, movable, targets, tgt)
                    if len(_CHOICES) >= _CHOICES_MAX:
                        _CHOICES.clear()
                    _CHOICES[ckey] = got
                pick = got
            if pick.ins != have:
                result.conflicts.append(Conflict(op, axis, have, pick))
            chosen.append(pick)
            for v, p in zip(op.outputs, pick.outs, strict=True):
                if v in placed:
                    placed[v][ax] = p
        result.strategies[op] = tuple(chosen)
    result.module = _typed(fn, types, placed, mesh)
    return result


# ``_choose`` answers (see there), keyed by everything they depend on: the op's name, sharding
# rule, global types and attributes (which fix its options and the bytes of every move), the axis
# size, and the placements around it. Layers meet the same typed ops again and again. Bounded:
# cleared when full.
_CHOICES: dict[tuple[object, ...], Strategy] = {}
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


def _typed(
    fn: Function, types: Mapping[Value, Type], placed: Mapping[Value, list[Placement | None]], mesh: Mesh
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
