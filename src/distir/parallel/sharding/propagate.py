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
independent except for one thing: one dim of a value sharded along two mesh axes (nested: the
first axis splits the dim, the next each of its pieces; ``local_shape_at``). Where the
annotations nest a dim (context with sequence parallelism), the fixed point fills such layouts
and the final choice makes them as cheaply as any other, by strategies that keep the sizes of
the dims they shard (``choices.keeps_dim_sizes``). Elsewhere the fixed point never fills a
placement that would make one (a parameter keeps what the fixed point gives it, so no later
choice could undo it), and the final choice takes a strategy that makes one only when every
other does too, and then reports the value (``ShardingError``): the ops' rules are written per
axis, and one that maps a dim through a reshape is exact only on the dim's outermost axis.

The result is a DTensor program: the same ops, every tensor value typed ``DTensor[...]`` with
its producer's placements. Where an op's strategy needs other placements for an input,
``distir.parallel.sharding.legalize`` inserts the redistribution.

``propagate`` is ``Plan`` (what the function alone fixes: types, options, pins) then ``place``
(the fixed point and the final choice, one op at a time, memoized on everything an op's choice
depends on). ``distir.parallel.sharding.shard_function.shard_function`` keeps plans and builds the legalized
function straight from ``place``'s placements, without the DTensor program. ``Plan`` and the
tables it shares with legalization live in ``distir.parallel.sharding.plan``, the final choice
per op and axis and its costs in ``distir.parallel.sharding.choices`` (both re-exported here).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import (
    DTensorType,
    Mesh,
    Partial,
    Placement,
    Replicate,
    Shard,
)
from distir.ir.function import Function, Module
from distir.ir.ops import Call, Op
from distir.ir.rewrite import ValueMap, copy_instr, inline_calls
from distir.ir.types import TensorType, Type
from distir.ir.values import Value
from distir.ops.sharding import Strategy
from distir.parallel.sharding.choices import _CHOICES, _CHOICES_MAX, _choose_op, _pt_id
from distir.parallel.sharding.choices import ShardingError as ShardingError
from distir.parallel.sharding.choices import redistribution_bytes as redistribution_bytes
from distir.parallel.sharding.choices import shards_one_dim_twice as shards_one_dim_twice
from distir.parallel.sharding.plan import Plan as Plan
from distir.parallel.sharding.plan import op_strategies as op_strategies
from distir.parallel.sharding.plan import parsed_placements as parsed_placements

_R = Replicate()


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


def _annotation(value: str, a: str | Sequence[Placement], mesh: Mesh) -> tuple[Placement, ...]:
    places = parsed_placements(a) if isinstance(a, str) else tuple(a)
    if len(places) != len(mesh.axes):
        raise ShardingError(
            f"annotation of %{value} gives {len(places)} placements for a mesh of {len(mesh.axes)} axes"
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
    nest: bool = False  # the annotations nest a dim (legalization then allows nesting as the choice did)


Annotation = str | Sequence[Placement]
# a value's placement per mesh axis while propagating (None: not known yet)
Lists = dict[Value, list[Placement | None]]


def place(
    plan: Plan,
    mesh: Mesh,
    annotations: Mapping[str, Annotation],
    params: Mapping[int, Annotation] | None = None,
    results: Mapping[int, Annotation] | None = None,
    replicate_results: bool = True,
    pinned: Collection[int] = (),
) -> Placed:
    """``propagate`` on a plan of the flat entry, without building the DTensor program: the
    annotations placed, the fixed point, what stays unknown replicated, the final choice."""
    placed, fixed = _annotated(plan, mesh, annotations, params, results, pinned)
    fn, n_axes = plan.fn, len(mesh.axes)
    # annotated values are constraints; results of the program are replicated unless annotated
    for v in fn.outputs if replicate_results else ():
        if v not in fixed and v in placed and v not in plan.params:
            placed[v] = [Replicate()] * n_axes
            fixed.add(v)
    fixed_at = {v: [p or Replicate() for p in placed[v]] for v in fixed if v in placed}
    sizes = tuple(n for _, n in mesh.axes)
    # annotations that nest a dim (context with sequence parallelism) allow nesting everywhere
    nest = any(shards_one_dim_twice(ps) for ps in fixed_at.values())
    _fixed_point(plan, placed, [plan.fill(n) for n in sizes], nest)
    for ps in placed.values():
        for ax in range(len(ps)):
            if ps[ax] is None:
                ps[ax] = Replicate()
    return _final_choice(plan, mesh, placed, fixed_at, tuple(pinned), nest)


def _annotated(
    plan: Plan,
    mesh: Mesh,
    annotations: Mapping[str, Annotation],
    params: Mapping[int, Annotation] | None,
    results: Mapping[int, Annotation] | None,
    pinned: Collection[int],
) -> tuple[Lists, set[Value]]:
    """Every tensor value's placements with only the annotated ones known (by name, or the
    entry's parameters and results by position), and the annotated values; each annotation
    and pin checked against the program."""
    fn, types = plan.fn, plan.types
    if annotations:
        by_name = plan.by_name()
        for name in annotations:
            if name not in by_name:
                raise ShardingError(f"annotation names %{name}, which the program does not define")
    positional: dict[Value, Annotation] = {}
    for where, seq, by_pos in (("parameter", fn.params, params), ("result", fn.outputs, results)):
        for i, a in (by_pos or {}).items():
            if not 0 <= i < len(seq):
                raise ShardingError(f"@{fn.name} has no {where} {i}")
            positional[seq[i]] = a
    n_axes = len(mesh.axes)
    placed: Lists = {v: [None] * n_axes for v in plan.tensors}
    given: list[tuple[Value, Annotation]] = [(plan.by_name()[n], a) for n, a in annotations.items()]
    given.extend(positional.items())
    for v, a in given:
        name = v.name
        if v not in placed:
            raise ShardingError(f"%{name} is not a tensor, so it cannot be sharded")
        for ax, p in enumerate(_annotation(name, a, mesh)):
            if isinstance(p, Shard) and p.dim >= len(types[v].shape):  # type: ignore[union-attr]
                raise ShardingError(f"%{name}: {p} is out of range for shape {types[v].shape}")  # type: ignore[union-attr]
            placed[v][ax] = p
    for i in pinned:
        if not 0 <= i < len(fn.params) or fn.params[i] not in positional:
            raise ShardingError(f"@{fn.name}: pinned parameter {i} is not an annotated parameter")
    return placed, {v for v, _ in given}


def _fixed_point(
    plan: Plan, placed: Lists, fills: Sequence[Sequence[Sequence[tuple[Placement, ...]]]], nest: bool
) -> None:
    """Fill unknown placements (in ``placed``, in place) from strategies consistent with the
    known ones, sweeping the ops forward and backward until nothing changes. An op whose values
    are all placed on every axis stays so: later sweeps skip it. ``nest``: a fill may shard a
    dim another axis shards too (nested)."""
    n_axes = len(fills)
    # per op: the placement lists of its values (None: not a tensor, i.e. always replicated)
    lists_of = [[placed.get(v) for v in vals] for vals in plan.vals]
    open_ops = list(range(len(plan.ops)))
    done = [[False] * n_axes for _ in plan.ops]  # per op and axis: every value placed (it stays so)
    # per op and axis: the known placements when no strategy was consistent with them. While
    # they stay so, none is: the other axes only gain placements, which only rejects more.
    stuck: list[list[list[Placement | None] | None]] = [[None] * n_axes for _ in plan.ops]
    changed = True
    while changed:
        changed = False
        for order in (open_ops, open_ops[::-1]):
            for j in order:
                lists = lists_of[j]
                done_j = done[j]
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
                    if n_none == len(known) or known == stuck[j][ax]:
                        continue
                    places = _consistent(fills[ax][j], known, lists, plan.is_param[j], nest)
                    if places is None:
                        stuck[j][ax] = known
                        continue
                    for lst, kp, p in zip(lists, known, places, strict=True):
                        if kp is None and lst is not None:
                            lst[ax] = p
                            changed = True
        open_ops = [j for j in open_ops if not all(done[j])]


def _consistent(
    options: Sequence[tuple[Placement, ...]],
    known: Sequence[Placement | None],
    lists: Sequence[list[Placement | None] | None],
    is_param: Sequence[bool],
    nest: bool = False,
) -> tuple[Placement, ...] | None:
    """The first of an op's placement options (on one axis) that agrees with every ``known``
    placement and fills no unknown one with what the fixed point never guesses (plain loops:
    this is the hot spot)."""
    for places in options:
        for kp, p in zip(known, places, strict=True):
            if kp is not None and kp is not p and kp != p:
                break
        else:
            for param, lst, kp, p in zip(is_param, lists, known, places, strict=True):
                if kp is None and (
                    # a parameter is never guessed to be a pending sum; annotate it if meant
                    (param and isinstance(p, Partial))
                    # nor, unless the annotations nest, a dim sharded along two mesh axes: no
                    # op's choice can undo that for a parameter (``lst[ax]`` is None, so ``in``
                    # sees the other axes)
                    or (not nest and isinstance(p, Shard) and p in lst)  # type: ignore[operator]
                ):
                    break
            else:
                return places
    return None


def _final_choice(
    plan: Plan,
    mesh: Mesh,
    placed: Lists,
    fixed_at: Mapping[Value, list[Placement]],
    pinned: tuple[int, ...],
    nest: bool,
) -> Placed:
    """Each op's strategy per axis, in program order: the producer's placements are what
    consumers get (``placed`` updated in place to the results' final ones), and the conflicts.
    Placement lists are named by interned ids (``_pt_id``): here those the fixed point gave, and
    once an op has chosen, its results' final ones (consumers come later)."""
    sizes = tuple(n for _, n in mesh.axes)
    options = [plan.options(n) for n in sizes]  # per axis, per op
    ids = {v: _pt_id(tuple(ps)) for v, ps in placed.items()}  # type: ignore[arg-type]
    pin_flags = plan.pin_flags(pinned)
    strategies: dict[Op, tuple[Strategy, ...]] = {}
    conflicts: list[Conflict] = []
    for k, op in enumerate(plan.ops):
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
            nest,
        )
        got = _CHOICES.get(ckey)
        if got is None:
            got = _choose_op(op, plan, k, options, sizes, placed, fixed_at, pin_flags[k], nest)
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
    return Placed(plan, placed, strategies, conflicts, ids, nest)  # type: ignore[arg-type]


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
