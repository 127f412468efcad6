"""Type inference of a local op on DTensors (``OpDef.infer_types`` when an input is a
``DTensorType``): the op's own rule on the global view gives the shapes, its sharding strategy
that takes exactly the inputs' placements the results' placements, mesh axis by mesh axis.

Answers are memoized apart from the mesh's devices (``_DIST``), so the same layer on every
pipeline stage's mesh is inferred once; ``mesh_free`` is what such a key keeps of a type, and
``global_view`` the logical type a shape rule sees (also used by legalization and the simulator's
relabelling). Raises ``OpTypeError`` as the op's rule does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from distir.ir.dtensor import DTensorType, Mesh, Placement, Replicate
from distir.ir.types import ScalarType, TensorType, Type
from distir.ir.values import Attrs
from distir.ops.errors import OpTypeError
from distir.ops.infer_memo import abstract_types

if TYPE_CHECKING:
    from distir.ops.registry import OpDef

_DIST_MAX = 1 << 14  # memoized answers (as the registry's per-op sharding memo)


# ``infer_distributed``'s answers: (op, attributes, mesh axes, the inputs without devices
# [, the mesh's first device]) -> (per result (dtype, shape, placements), per mesh (by id, the mesh
# kept alive) the result types). Bounded: cleared when full.
_DIST: dict[tuple[object, ...], tuple[tuple[Any, ...], dict[int, tuple[Mesh, tuple[DTensorType, ...]]]]] = {}


def mesh_free(t: Type) -> object:
    """What the global view of an input of a DTensor op keeps of it: every input goes to the
    mesh's first device, so a DTensor is its dtype, shape and placements, a plain tensor or
    scalar its dtype (and shape); anything else is kept whole."""
    if type(t) is DTensorType:
        return (t.dtype, t.shape, t.placements)
    if type(t) is TensorType:
        return (t.dtype, t.shape)
    if type(t) is ScalarType:
        return (t.dtype,)
    return t


def global_view(t: Type, mesh: Mesh) -> Type:
    """The logical (unsharded) tensor type on the mesh's first device, for shape rules."""
    if isinstance(t, DTensorType):
        return t.global_type()
    if isinstance(t, TensorType | ScalarType):
        return t.with_device(mesh.devices[0])
    return t


def infer_distributed(
    op: OpDef, types: Sequence[Type], attrs: Attrs, known: Sequence[np.ndarray | None]
) -> tuple[Type, ...]:
    """A local op on distributed tensors: shapes from the rule on the global view, result
    placements from the sharding strategy that takes exactly the inputs' placements. Plain
    tensors among the inputs count as replicated (constants of the logical program).

    Memoized apart from the mesh's devices (``_DIST``): the answer depends on the mesh only
    through its axes (the global view puts every input on the mesh's first device, which
    only a ``device`` attribute can tell, and then it is in the key) — the same layer on
    each pipeline stage's mesh is inferred once. Only answers are stored, never failures."""
    mesh: Mesh | None = None
    for t in types:
        if type(t) is DTensorType:
            if mesh is None:
                mesh = t.mesh
            elif t.mesh is not mesh and t.mesh != mesh:
                n = len({x.mesh for x in types if isinstance(x, DTensorType)})
                raise OpTypeError(f"{op.name} mixes tensors of different meshes", None, 1, n)
    assert mesh is not None  # the caller saw a DTensor
    key: tuple[object, ...] | None = None
    if all(k is None for k in known):  # known values (arrays) are not keys
        key = (op, attrs, mesh.axes, *map(mesh_free, types))
        if "device" in attrs:
            key = (*key, mesh.devices[0])
        got = _DIST.get(key)
        if got is not None:
            inst = got[1].get(id(mesh))
            if inst is None or inst[0] is not mesh:
                if len(got[1]) >= 64:
                    got[1].clear()
                made = tuple(DTensorType(dt, sh, mesh, pl) for dt, sh, pl in got[0])
                inst = got[1][id(mesh)] = (mesh, made)
            return inst[1]
    result = _infer_on_mesh(op, types, attrs, known, mesh)
    if key is not None:
        if len(_DIST) >= _DIST_MAX:
            _DIST.clear()
        _DIST[key] = (
            tuple((t.dtype, t.shape, t.placements) for t in result),
            {id(mesh): (mesh, result)},
        )
    return result


def _infer_on_mesh(
    op: OpDef, types: Sequence[Type], attrs: Attrs, known: Sequence[np.ndarray | None], mesh: Mesh
) -> tuple[DTensorType, ...]:
    """``infer_distributed`` itself, on the one ``mesh`` of the DTensor inputs."""
    glob = [global_view(t, mesh) for t in types]
    # the global view is the same for every TP degree and layout of one op: memoized
    outs = (
        abstract_types(op, attrs, glob)
        if all(k is None for k in known)
        else op.infer_types(glob, attrs, known)
    )
    per_axis: list[tuple[Placement, ...]] = []
    for a, (axis, n) in enumerate(mesh.axes):
        have = tuple(t.placements[a] if isinstance(t, DTensorType) else Replicate() for t in types)
        for s in op.strategy_options(glob, outs, attrs, n):
            if s.ins == have:
                per_axis.append(s.outs)
                break
        else:
            accepted = "; ".join(str(s) for s in op.strategies(glob, outs, attrs, n))
            raise OpTypeError(
                f"{op.name} cannot run on placements ({', '.join(map(str, have))}) along mesh axis "
                f"{axis}; it accepts {accepted} (redistribute first: distir.parallel.sharding.legalize)",
                None,
                accepted,
                ", ".join(map(str, have)),
            )
    result: list[DTensorType] = []
    for i, t in enumerate(outs):
        if not isinstance(t, TensorType):
            raise OpTypeError(f"{op.name} on distributed tensors must give tensors, not {t}")
        result.append(DTensorType(t.dtype, t.shape, mesh, tuple(pa[i] for pa in per_axis)))
    return tuple(result)
