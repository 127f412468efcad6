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
from distir.ir.ops import Op
from distir.ir.rewrite import ValueMap, copy_instr, inline_calls
from distir.ir.types import TensorType, Type
from distir.ir.values import Value
from distir.ops.registry import REGISTRY
from distir.ops.sharding import Strategy


class ShardingError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Conflict:
    """An op whose inputs arrive in placements none of its strategies takes (one mesh axis)."""

    op: str
    axis: str
    have: tuple[Placement, ...]
    chosen: Strategy

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
    strat: dict[tuple[Op, int], list[Strategy]] = {}
    for op in ops:
        ins = [types[v] for v in op.inputs]
        outs = [types[v] for v in op.outputs]
        for ax, (_, n) in enumerate(mesh.axes):
            strat[(op, ax)] = REGISTRY[op.name].strategies(ins, outs, op.attrs, n)

    def current(v: Value, ax: int) -> Placement | None:
        got = placed.get(v)
        return got[ax] if got is not None else Replicate()

    # fixed point: fill unknown placements from strategies consistent with the known ones
    changed = True
    while changed:
        changed = False
        for order in (ops, list(reversed(ops))):
            for op in order:
                vals = (*op.inputs, *op.outputs)
                for ax in range(len(mesh.axes)):
                    known = [current(v, ax) for v in vals]
                    if all(k is not None for k in known) or all(k is None for k in known):
                        continue
                    for s in strat[(op, ax)]:
                        places = (*s.ins, *s.outs)
                        if all(k is None or k == p for k, p in zip(known, places, strict=True)) and not any(
                            k is None and v in entry_params and isinstance(p, Partial)
                            for v, k, p in zip(vals, known, places, strict=True)
                        ):  # a parameter is never guessed to be a pending sum; annotate it if meant
                            for v, k, p in zip(vals, known, places, strict=True):
                                if k is None and v in placed:
                                    placed[v][ax] = p
                                    changed = True
                            break
    for ps in placed.values():
        for ax in range(len(ps)):
            if ps[ax] is None:
                ps[ax] = Replicate()
    # final choice per op, in program order: the producer's placements are what consumers get
    result = Propagation(flat)
    for op in ops:
        chosen: list[Strategy] = []
        for ax, (axis, n) in enumerate(mesh.axes):
            have: tuple[Placement, ...] = tuple(current(v, ax) or Replicate() for v in op.inputs)
            hint: tuple[Placement, ...] = tuple(current(v, ax) or Replicate() for v in op.outputs)
            options = strat[(op, ax)]
            others = [b for b in range(len(mesh.axes)) if b != ax]

            def key(
                k: int,
                op: Op = op,
                ax: int = ax,
                n: int = n,
                have: tuple[Placement, ...] = have,
                hint: tuple[Placement, ...] = hint,
                options: list[Strategy] = options,
                others: list[int] = others,
                chosen: list[Strategy] = chosen,
            ) -> tuple[int, int, float, int, int, int, int, int]:
                """Layouts materialization cannot handle (a dim sharded along two mesh axes)
                last; then strategies that move a pinned parameter; then total bytes to
                redistribute inputs into the strategy and results
                into their annotated placements; then fewer input moves; then the rule's
                preference."""
                s = options[k]
                total, moves, costly, moved_pins = 0.0, 0, 0, 0
                clash = sum(
                    isinstance(w, Shard)
                    and any((chosen[b].ins[i] if b < ax else current(v, b)) == w for b in others)
                    for i, (v, w) in enumerate(zip(op.inputs, s.ins, strict=True))
                ) + sum(
                    isinstance(p, Shard) and v in placed and any(placed[v][b] == p for b in others)
                    for v, p in zip(op.outputs, s.outs, strict=True)
                )
                for v, h, w in zip(op.inputs, have, s.ins, strict=True):
                    t = types[v]
                    if isinstance(t, TensorType) and h != w:
                        nb = redistribution_bytes(t, h, w, n)
                        total += nb
                        moves += 1
                        costly += nb > 0
                        moved_pins += nb > 0 and v in pins
                mismatch = 0
                for v, p in zip(op.outputs, s.outs, strict=True):
                    t = types[v]
                    if v in fixed_at and isinstance(t, TensorType):
                        total += redistribution_bytes(t, p, fixed_at[v][ax], n)
                        mismatch += p != fixed_at[v][ax]
                # at equal bytes and no collective on the inputs, produce an annotated result
                # directly: computing it replicated and slicing it after does the work n times
                return (clash, moved_pins, total, costly, mismatch, moves, 0 if s.outs == hint else 1, k)

            pick = options[min(range(len(options)), key=key)]
            if pick.ins != have:
                from distir.ir.printer import print_op

                result.conflicts.append(Conflict(print_op(op), axis, have, pick))
            chosen.append(pick)
            for v, p in zip(op.outputs, pick.outs, strict=True):
                if v in placed:
                    placed[v][ax] = p
        result.strategies[op] = tuple(chosen)
    result.module = _typed(fn, types, placed, mesh)
    return result


def _typed(
    fn: Function, types: Mapping[Value, Type], placed: Mapping[Value, list[Placement | None]], mesh: Mesh
) -> Module:
    """The entry with every tensor value typed as a DTensor with its placements."""

    def dtype_of(v: Value) -> Type | None:
        t = types.get(v)
        if isinstance(t, TensorType) and v in placed:
            return DTensorType(t.dtype, t.shape, mesh, tuple(p or Replicate() for p in placed[v]))
        return t

    vmap = ValueMap(lambda v: Value(v.name, dtype_of(v)))
    fb = FunctionBuilder(fn.name)
    for p in fn.params:
        vmap.bind(p, fb.param(p.name, dtype_of(p)))
    for instr in fn.body:
        fb.append(copy_instr(instr, vmap))
    return Module((fb.ret(*(vmap(v) for v in fn.outputs)),))
