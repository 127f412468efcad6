"""A callee's summary carried from one mesh to another alike (``PlanDomain.call``).

A pipeline program calls each layer function on every stage's mesh, and the stages' chunk
functions are alike too: the same bodies, shapes and placements, only the meshes' devices
differ. Planning and summarizing each again per stage repeats the same work, so the planner
keeps, per *mesh-free key*, the summary of the first call it planned, and gives a call on
another mesh the same summary with its clocks (units) and memory figures renamed — exactly what
planning it there would give, when:

- the program has no plain (per-device) value (``Units.all_dtensor``) and the callee has no op
  with a ``device`` attribute and no declared type: every op is a local op on DTensors, a
  ``Redistribute``, a ``MeshSend`` or a call, and the types follow the mesh (a local op's result
  types depend on the mesh only through its axes — ``distir.ops.dtensor_inference.infer_distributed`` — and a
  ``Redistribute`` keeps its input's mesh);
- every argument and result is a DTensor on one mesh, the body runs on that mesh's units only
  and sends nothing to another mesh (no ``MeshSend``): a local op's record depends only on the
  mesh's axes and, per unit it covers, the unit's position in the mesh, device count and GPU
  class (``spmd.local_record``), as does a ``Redistribute``'s but for its collectives, whose
  times depend on the very GPUs of each group: each distinct collective of a body planned by the
  fast path is recorded again on the new mesh and must take the same time (any other body
  carries none);
- every call in the body can be carried likewise, onto the same mesh, and each collective in the
  summaries those calls took (kept with the summary, as planned: a key's latest entry may come
  from another mesh) takes the same time on the new mesh;
- the two meshes cover their units alike: per unit (in the mesh's order) the same position,
  device count and GPU class — part of the key — and the renaming keeps the order of the units
  the body runs on (so the delay matrices keep their rows) and maps memory figures one to one.

The key holds everything else the summary depends on: the body's *shape* (ops with their
attributes, callees, and which values each reads: functions alike whatever their values are
named), the mesh axes and the argument types without their devices. Contract (tested against
planning every call, ``relabel=False``): simulated results are bit-identical with and without
carrying.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from operator import attrgetter
from typing import Any

from distir.interp.shapes import Mixed
from distir.ir.dtensor import DTensorType, Mesh
from distir.ir.function import Function
from distir.ir.ops import Call, Op
from distir.ir.types import Type
from distir.ops.dist import REDISTRIBUTE
from distir.ops.dtensor_inference import mesh_free
from distir.ops.registry import REGISTRY
from distir.parallel.sharding.ring import RING_OPERANDS
from distir.sim.records import CallSummary, FnPlan
from distir.sim.spmd import record
from distir.sim.units import Units

_mesh = attrgetter("mesh")
# a summary and its results, as ``PlanDomain.call`` caches them
Found = tuple[CallSummary, tuple[Mixed, ...]]
# a call's mesh-free key: (the callee's body shape, mesh axes, unit signature, argument forms)
Key = tuple[Any, ...]


class Relabeler:
    """The summaries of one simulation's callees by mesh-free key (module docstring)."""

    def __init__(self, units: Units) -> None:
        self.units = units
        # key -> (summary, results, the mesh they were planned on, its units, the collectives
        # of the callee and of the calls in its body with their types and times there), or None
        # when the callee cannot be carried (then it is planned on every mesh)
        self._seen: dict[Key, _Seen | None] = {}
        # by id of a function (kept alive): the number of its body's shape, None if it has an
        # op with a ``device`` attribute or uses an undefined value
        self._shapes: dict[int, tuple[Function, int | None]] = {}
        self._shape_ids: dict[tuple[Any, ...], int] = {}
        # by id of a DTensor type (kept alive in ``_pinned``): the number of its mesh-free form
        self._forms: dict[int, int] = {}
        self._form_ids: dict[object, int] = {}
        self._pinned: list[Type] = []
        # the calls met while planning each callee: (key, the mesh of its arguments) or None,
        # with the summary the call took
        self._nested: list[list[tuple[tuple[Key, Mesh] | None, CallSummary]]] = []
        # by id of a summary (kept alive): every collective in it, its callee's and those of the
        # calls in its body, with the time it was planned with (``remember``, ``carried``)
        self._comm_of: dict[int, tuple[CallSummary, list[_Comm]]] = {}
        # (id of a type, id of a mesh) -> (both, kept alive; the type on that mesh): ``_on``
        self._moved: dict[tuple[int, int], tuple[DTensorType, Mesh, DTensorType]] = {}

    def key(self, callee: Function, types: Sequence[Any]) -> tuple[Key, Mesh] | None:
        """The mesh-free key of a call and the one mesh of its arguments, or None when the call
        cannot be carried (some argument is not a DTensor, the arguments span meshes, the body
        has an op with a ``device`` attribute or a declared type, or the program has plain
        values)."""
        # ``Units.assume``: a callee carried to another mesh adds no group to the units only if
        # no type met so far (in particular none in its body) is plain or unevenly sharded
        if not self.units.all_dtensor or self.units.uneven or not types:
            return None
        shape = self._shape(callee)
        if shape is None or set(map(type, types)) != {DTensorType}:
            return None
        ms = list(map(_mesh, types))
        meshes = dict(zip(map(id, ms), ms, strict=True))  # a chunk passes hundreds: at C speed
        mesh = next(iter(meshes.values()))
        if len(meshes) > 1 and any(m != mesh for m in meshes.values()):
            return None
        forms = list(map(self._forms.get, map(id, types)))
        if None in forms:
            for t in types:
                if id(t) not in self._forms:  # the type is kept alive: its id stays its own
                    self._forms[id(t)] = self._form_ids.setdefault(mesh_free(t), len(self._form_ids))
                    self._pinned.append(t)
            forms = list(map(self._forms.__getitem__, map(id, types)))
        classes = self.units.gpu_class_of
        sig = tuple((pos, count, classes(rep)) for _u, rep, pos, count in self.units.mesh_units(mesh))
        return (mesh.axes, sig, shape, *forms), mesh

    def _shape(self, fn: Function) -> int | None:
        """The number of ``fn``'s body shape: its ops (name, attributes) and calls (callee) with
        the positions of the values they read, and the positions it returns — functions of one
        shape plan alike on alike arguments, whatever their values are named. None for a body
        that cannot be carried: an op with a ``device`` attribute, or a declared type (its
        check depends on the mesh); or that uses an undefined value (planning reports it)."""
        got = self._shapes.get(id(fn))
        if got is None or got[0] is not fn:
            got = self._shapes[id(fn)] = (fn, self._number(fn) if _carriable(fn) else None)
        return got[1]

    def _number(self, fn: Function) -> int | None:
        index = dict(zip(fn.params, range(len(fn.params)), strict=True))
        shape: list[Any] = [len(fn.params)]
        try:
            for i in fn.body:
                ins = tuple(map(index.__getitem__, i.inputs))
                if type(i) is Op:
                    shape.append((i.name, i.attrs, ins, len(i.outputs)))
                else:
                    assert isinstance(i, Call)
                    shape.append((None, i.callee, ins, len(i.outputs)))
                at = len(index)
                index.update(zip(i.outputs, range(at, at + len(i.outputs)), strict=True))
            shape.append(tuple(map(index.__getitem__, fn.outputs)))
        except KeyError:
            return None
        return self._shape_ids.setdefault(tuple(shape), len(self._shape_ids))

    def begin(self) -> None:
        """Before planning a callee: collect the keys of the calls in its body."""
        self._nested.append([])

    def end(self) -> list[tuple[tuple[Key, Mesh] | None, CallSummary]]:
        return self._nested.pop()

    def called(self, alike: tuple[Key, Mesh] | None, summary: CallSummary) -> None:
        """A call (its key and mesh, None if it cannot be carried) in the body being planned,
        and the summary it took."""
        if self._nested:
            self._nested[-1].append((alike, summary))

    def remember(
        self,
        key: Key,
        mesh: Mesh,
        plan: FnPlan,
        found: Found,
        nested: list[tuple[tuple[Key, Mesh] | None, CallSummary]],
    ) -> None:
        """Keep a planned callee's summary for other meshes, if it can be carried: so can every
        call in its body, on the same mesh; it runs on the mesh's units only and sends nothing
        elsewhere, and its collectives are known (the fast path lists them; another body may
        have none)."""
        units = [u for u, *_ in self.units.mesh_units(mesh)]
        ok = (
            all(n is not None and (n[1] is mesh or n[1] == mesh) for n, _ in nested)
            and (
                all(op.name == REDISTRIBUTE.name or op.name in RING_OPERANDS for op, _, _ in plan.comm_ops)
                if plan.flat
                else not any(plan.comm)
            )
            and set(plan.slots) <= set(units)
            and all(type(t) is DTensorType and (t.mesh is mesh or t.mesh == mesh) for t in found[1])
        )
        if not ok:
            self._seen[key] = None
            return
        comm = [(op, ins, outs, self._seconds(op, ins, outs)) for op, ins, outs in plan.comm_ops]
        # the collectives of the calls in its body, as planned into this summary: those of the
        # very summaries the calls took (a key's entry in ``_seen`` is replaced when its callee is
        # planned again on another mesh, so it may hold other times)
        for s in {id(s): s for _, s in nested}.values():  # each summary once (by identity)
            inner = self._comm_of.get(id(s))
            if inner is None or inner[0] is not s:
                self._seen[key] = None
                return
            comm.extend(inner[1])
        comm = list(dict.fromkeys(comm))
        self._seen[key] = (found[0], found[1], mesh, units, comm)
        self._comm_of[id(found[0])] = (found[0], comm)

    def _seconds(self, op: Op, ins: Sequence[Type], outs: Sequence[Type]) -> float:
        """The time of a communicating op's record."""
        return record(self.units, op, REGISTRY[op.name], ins, outs).seconds

    def carried(self, callee: Function, key: Key, mesh: Mesh) -> Found | None:
        """The summary and results of a call of ``callee`` on ``mesh``, from the summary of a
        callee of its shape on an alike mesh, or None (not seen, cannot be carried, the units do
        not rename alike, a collective takes another time there, or a call in its body cannot be
        carried there)."""
        got = self._seen.get(key)
        renaming = self._renaming(key, mesh)
        if got is None or renaming is None:
            return None
        summary, outs, _mesh0, _units0, comm = got
        slots, figure = renaming
        moved = _renamed(summary, callee.name, slots, figure)
        self._comm_of[id(moved)] = (moved, comm)  # the same times, checked by ``_renaming``
        return moved, tuple(self._on(t, mesh) for t in outs)

    def _renaming(self, key: Key, mesh: Mesh) -> tuple[tuple[int, ...], dict[int, int]] | None:
        """The clocks and memory figures of the callee's summary renamed onto ``mesh``, if its
        summary there would be the renamed one (``carried``)."""
        got = self._seen.get(key)
        if got is None:
            return None
        summary, _outs, _mesh0, units0, comm = got
        units1 = [u for u, *_ in self.units.mesh_units(mesh)]
        unit_of = dict(zip(units0, units1, strict=True))  # same length: the key's signature
        slots = tuple(unit_of[s] for s in summary.slots)
        if any(a >= b for a, b in pairwise(slots)):  # the order of the clocks changes
            return None
        gpu_of = self.units.slot_gpu
        figure: dict[int, int] = {}
        for u0, u1 in zip(units0, units1, strict=True):
            if figure.setdefault(gpu_of[u0], gpu_of[u1]) != gpu_of[u1]:
                return None
        if len(set(figure.values())) != len(figure):
            return None
        # collectives over other GPUs, its own and those of the calls in its body: the same times?
        for op, ins, outs_c, seconds in comm:
            moved = [self._on(t, mesh) for t in ins], [self._on(t, mesh) for t in outs_c]
            if self._seconds(op, *moved) != seconds:
                return None
        return slots, figure

    def _on(self, t: Mixed, mesh: Mesh) -> DTensorType:
        """A type of the callee on the mesh it was planned on, on ``mesh`` instead (one object
        per type and mesh: the planner's memos meet it by identity)."""
        assert type(t) is DTensorType
        got = self._moved.get((id(t), id(mesh)))
        if got is None or got[0] is not t or got[1] is not mesh:
            moved = DTensorType(t.dtype, t.shape, mesh, t.placements)
            got = self._moved[(id(t), id(mesh))] = (t, mesh, moved)
        return got[2]


# a collective with its types and its time
_Comm = tuple[Op, tuple[Type, ...], tuple[Type, ...], float]
_Seen = tuple[
    CallSummary,
    tuple[Mixed, ...],
    Mesh,
    list[int],
    list[_Comm],  # every collective of the callee and of the calls in its body, as planned
]


def _renamed(s: CallSummary, name: str, slots: tuple[int, ...], figure: dict[int, int]) -> CallSummary:
    """``s`` as the summary of callee ``name``, with its clocks renamed to ``slots`` (position by
    position) and its memory figures by ``figure``; the times, FLOPs, storage and last uses are
    the same numbers."""
    return CallSummary(
        name,
        slots,
        s.delay,
        s.first,
        s.busy,
        s.comm,
        s.flops,
        {figure[g]: b for g, b in s.peak_extra.items()},
        s.out_roots,
        tuple((tuple((figure[g], b) for g, b in pairs), last) for pairs, last in s.fresh),
        s.n_ops,
        {figure[g]: prof for g, prof in s.profile.items()},
        s.param_last,
        s.body,
        _clocks_renamed(s, slots),
    )


def _clocks_renamed(s: CallSummary, slots: tuple[int, ...]) -> dict[int, int] | None:
    """The renaming of ``s``'s body clocks onto ``slots`` (``CallSummary.body_clocks``)."""
    if s.body is None:
        return None
    to = dict(zip(s.slots, slots, strict=True))
    before = s.body_clocks if s.body_clocks is not None else {x: x for x in s.slots}
    return {p: to[q] for p, q in before.items()}


def _carriable(fn: Function) -> bool:
    """No op of ``fn`` has a ``device`` attribute and no value a declared type."""
    if any(p.type is not None for p in fn.params):
        return False
    for i in fn.body:
        if any(o.type is not None for o in i.outputs) or (type(i) is Op and "device" in i.attrs):
            return False
    return True
