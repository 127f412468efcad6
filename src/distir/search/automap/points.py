"""Automap's problem: the flat program, its layers, and the decision points of the searched axis.

``Problem.build(module, mesh, axis, fixed)`` inlines the entry's calls (recording, per op, the
layer it came from: ``@callee[i]`` for the i-th call of ``callee`` in the entry, ``@entry`` for
the entry's own ops) and lists the **decision points**: the entry's parameters (weights,
optimizer state, inputs) whose placement along the searched mesh axis nobody fixed. With
grouping, repeated layers share one decision: a parameter passed to a layer function is grouped
by (function, parameter position) — every instance of ``@block`` decides its ``wq`` once — and
any other by its name scope with layer numbers erased (``m_wq_3`` and ``m_wq_7`` are ``m_wq_#``,
``layers.3.attn.q_proj.weight`` is ``layers.#.attn.q_proj.weight``), members of one group having
one type. Points are ordered by their bytes, largest first (the decisions an expert takes first);
values under ``MIN_SHARE`` of the largest point's bytes (biases, norm scales) are no decision
points — their placement moves at most that share of bytes — and are left to propagation.

Parameters that a step updates are paired with the result that replaces them (``Donation`` with
a result, or a result named ``<param>_new`` of the same type): the pair keeps one placement, so
the layout holds from step to step.

Every other mesh axis is fixed: placements the caller gives per parameter (``fixed``: a batch
split of the inputs), replicated otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import Mesh, Placement, Replicate, Shard
from distir.ir.function import Function, Module
from distir.ir.ops import Call, Instr
from distir.ir.rewrite import ValueMap, copy_instr
from distir.ir.types import TensorType
from distir.ir.values import Value
from distir.parallel.sharding.propagate import Plan, ShardingError

ENTRY = "@entry"
MIN_SHARE = 0.01  # decision points hold at least this share of the largest one's bytes
_LAYER_NO = re.compile(r"(?<=[._])\d+(?=$|[._])")


@dataclass(frozen=True, slots=True)
class DecisionPoint:
    """One decision of the search: the placement along the searched axis of ``params`` (entry
    parameter positions; several when grouped), all of global ``shape``; ``nbytes`` in total."""

    label: str
    params: tuple[int, ...]
    shape: tuple[int, ...]
    nbytes: int

    def options(self, n: int) -> tuple[Placement, ...]:
        """Replicate, or shard a dim that has at least ``n`` elements."""
        return (Replicate(), *(Shard(d) for d, s in enumerate(self.shape) if s >= n))


@dataclass(frozen=True)
class Problem:
    """What the search works on (module docstring)."""

    fn: Function  # the flat entry
    plan: Plan
    layers: tuple[str, ...]  # per op of ``fn`` (``plan.ops`` order), its layer
    mesh: Mesh
    axis: int  # the searched axis (index into ``mesh.axes``)
    fixed: Mapping[int, tuple[Placement | None, ...]]  # per parameter, per axis (None: searched)
    points: tuple[DecisionPoint, ...]
    pairs: Mapping[int, int]  # result position -> the parameter it replaces
    # internal values fixed by name (layer boundaries a transform imposes): placements per axis
    pins: Mapping[str, tuple[Placement, ...]]

    @property
    def whole_results(self) -> tuple[int, ...]:
        """The results that replace no parameter: whole along the searched axis (what the
        program returns is the program's, however it is sharded)."""
        return tuple(
            r
            for r, v in enumerate(self.fn.outputs)
            if r not in self.pairs and isinstance(self.plan.types.get(v), TensorType)
        )

    @property
    def size(self) -> int:
        """Devices along the searched axis."""
        return self.mesh.axes[self.axis][1]

    @staticmethod
    def build(
        module: Module,
        mesh: Mesh,
        axis: str,
        fixed: Mapping[str, Sequence[Placement | None]],
        group: bool = True,
        boundaries: Callable[[Flat], Mapping[str, tuple[Placement, ...]]] | None = None,
        decide: Collection[str] | None = None,
        repeat: float = 1.0,
    ) -> Problem:
        """The problem of searching ``axis`` of ``mesh`` for ``module``'s entry. ``fixed`` gives
        placements per parameter name, one per mesh axis; None on the searched axis leaves it to
        the search, a placement there fixes it (no decision). ``boundaries`` gives internal values
        of the flat program fixed on every axis (by their unique names). ``decide`` limits the
        decision points to these parameters (the others are left to propagation); ``repeat``
        scales the bytes of grouped points in the ordering (a program standing for a deeper one)."""
        names = [a for a, _ in mesh.axes]
        if axis not in names:
            raise ShardingError(f"--auto {axis}: the mesh has no axis {axis} (axes: {', '.join(names)})")
        ax = names.index(axis)
        flat = flatten(module)
        fn, layers = flat.fn, flat.layers
        by_name = {p.name: i for i, p in enumerate(fn.params)}
        full: dict[int, tuple[Placement | None, ...]] = {}
        for name, places in fixed.items():
            if name not in by_name:
                raise ShardingError(f"annotation names %{name}, which is not a parameter of @{fn.name}")
            if len(places) != len(names):
                raise ShardingError(
                    f"annotation of %{name} gives {len(places)} placements for {len(names)} axes"
                )
            full[by_name[name]] = tuple(places)
        for i, p in enumerate(fn.params):
            if isinstance(p.type, TensorType):
                full.setdefault(i, tuple(None if b == ax else Replicate() for b in range(len(names))))
        plan = Plan(fn)
        open_params = [
            i
            for i, pl in sorted(full.items())
            if pl[ax] is None and (decide is None or fn.params[i].name in decide)
        ]
        points = decision_points(module, fn, open_params, group, repeat)
        pins = dict(boundaries(flat)) if boundaries is not None else {}
        return Problem(fn, plan, layers, mesh, ax, full, points, result_pairs(fn), pins)


class Flat(NamedTuple):
    """The entry inlined: ``fn`` (every value named uniquely: a repeated name gets ``.2``,
    ``.3``, ...), per op its layer, per call of the entry the names of its results."""

    fn: Function
    layers: tuple[str, ...]
    call_results: tuple[tuple[str, ...], ...]


def flatten(module: Module) -> Flat:
    """The entry with every call inlined (module docstring)."""
    entry = module.entry
    fb = FunctionBuilder(entry.name)
    taken: dict[str, int] = {}

    def fresh(v: Value) -> Value:
        n = taken.get(v.name, 0) + 1
        taken[v.name] = n
        return Value(v.name if n == 1 else f"{v.name}.{n}", v.type)

    layers: list[str] = []
    call_results: list[tuple[str, ...]] = []

    def emit(body: tuple[Instr, ...], vmap: ValueMap, layer: str | None) -> None:
        for instr in body:
            if isinstance(instr, Call):
                callee = module[instr.callee]
                inner = ValueMap(fresh)
                for p, a in zip(callee.params, instr.inputs, strict=True):
                    inner.bind(p, vmap(a))
                here = layer
                if here is None:
                    k = seen.get(instr.callee, 0)
                    seen[instr.callee] = k + 1
                    here = f"@{instr.callee}[{k}]"
                emit(callee.body, inner, here)
                for out, r in zip(instr.outputs, callee.outputs, strict=True):
                    vmap.bind(out, inner(r))
                if layer is None:
                    call_results.append(tuple(inner(r).name for r in callee.outputs))
            else:
                fb.append(copy_instr(instr, vmap))
                layers.append(layer or ENTRY)

    seen: dict[str, int] = {}
    top = ValueMap(fresh)
    for p in entry.params:
        top.bind(p, fb.param(fresh(p).name, p.type))
    emit(entry.body, top, None)
    fn = replace(fb.ret(*(top(v) for v in entry.outputs)), donated=entry.donated)
    return Flat(fn, tuple(layers), tuple(call_results))


def scope(name: str) -> str:
    """A name with its layer numbers erased (``wq_3`` -> ``wq_#``)."""
    return _LAYER_NO.sub("#", name)


def group_key(module: Module, name: str, uses: Mapping[str, tuple[str, int]]) -> str:
    """The group of parameter ``name``: ``@callee:param`` when a layer function takes it (the
    first call that does), else its name scope with layer numbers erased."""
    use = uses.get(name)
    if use is not None:
        callee, pos = use
        return f"@{callee}:{module[callee].params[pos].name}"
    return scope(name)


def decision_points(
    module: Module, fn: Function, params: Sequence[int], group: bool, repeat: float = 1.0
) -> tuple[DecisionPoint, ...]:
    """The decision points of the tensor parameters ``params`` of flat ``fn`` (module
    docstring); ``module``'s entry gives the layer calls that group them."""
    uses: dict[str, tuple[str, int]] = {}
    for instr in module.entry.body:
        if isinstance(instr, Call):
            for pos, v in enumerate(instr.inputs):
                uses.setdefault(v.name, (instr.callee, pos))
    groups: dict[tuple[str, TensorType], list[int]] = {}
    for i in params:
        p = fn.params[i]
        t = p.type
        assert isinstance(t, TensorType)
        key = group_key(module, p.name, uses) if group else p.name
        groups.setdefault((key, t), []).append(i)
    # members of one group have one type: a group key met with two types splits by type
    labels: dict[str, int] = {}
    for key, _t in groups:
        labels[key] = labels.get(key, 0) + 1
    points = []
    for (key, t), members in groups.items():
        label = key if labels[key] == 1 else f"{key}{list(t.shape)}"
        if len(members) == 1:
            label = fn.params[members[0]].name
        points.append(DecisionPoint(label, tuple(members), t.shape, t.nbytes * len(members)))
    size = {id(p): p.nbytes * (repeat if len(p.params) > 1 else 1.0) for p in points}
    points.sort(key=lambda p: (-size[id(p)], p.params[0]))
    # values far smaller than the largest move at most their share of bytes, whatever their
    # placement: left to propagation (settled, or replicated when the rest is inferred)
    least = MIN_SHARE * max(size.values(), default=0.0)
    return tuple(p for p in points if size[id(p)] >= least)


def result_pairs(fn: Function) -> dict[int, int]:
    """Result position -> the parameter it replaces (module docstring)."""
    pairs = {d.result: d.param for d in fn.donated if d.result >= 0}
    by_name = {p.name: i for i, p in enumerate(fn.params)}
    for r, v in enumerate(fn.outputs):
        base = v.name.removesuffix("_new")
        i = by_name.get(base)
        if r not in pairs and v.name.endswith("_new") and i is not None:
            pt = fn.params[i].type
            if isinstance(pt, TensorType) and (v.type is None or v.type == pt):
                pairs[r] = i
    return pairs
