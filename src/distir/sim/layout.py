"""Laying out DTensor pieces quickly (for ``distir.sim.units`` and ``distir.sim.spmd``).

``mesh_info`` gives a mesh's coordinates and axis groups without ``Mesh.coords``'s per-device
search (memoized by the mesh's identity: hashing a mesh of 1024 devices is not free);
``uniform_shape`` and ``shape_groups`` say which devices hold equally shaped pieces;
``piece_bytes`` and ``local_piece`` give a device's piece; ``step_types`` the layouts a
``Redistribute`` passes through.
"""

from __future__ import annotations

import itertools
import math

from distir.ir.dtensor import DTensorType, Mesh, Placement, Shard, shares_of
from distir.ir.types import _ITEMSIZE, Device, ScalarType, TensorType, Type
from distir.parallel.sharding.materialize import local_shape_at, redistribute_steps


class MeshInfo:
    """Per mesh: each device's coordinates (row-major, by position) and the device groups along
    each axis (as ``Mesh.groups``, without its per-device index search)."""

    __slots__ = ("_groups", "coords", "mesh")

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self.coords: list[tuple[int, ...]] = list(itertools.product(*(range(n) for n in mesh.shape)))
        self._groups: dict[int, list[tuple[int, ...]]] = {}

    def groups(self, axis: int) -> list[tuple[int, ...]]:
        """Positions (indices into ``mesh.devices``) of each group along ``axis``."""
        got = self._groups.get(axis)
        if got is None:
            by_rest: dict[tuple[int, ...], list[int]] = {}
            for i, c in enumerate(self.coords):
                by_rest.setdefault(c[:axis] + c[axis + 1 :], []).append(i)
            got = self._groups[axis] = [tuple(g) for g in by_rest.values()]
        return got


# by id: hashing a Mesh hashes every device (slow for 1024 of them); the entry keeps it alive
_MESHES: dict[int, MeshInfo] = {}


def mesh_info(mesh: Mesh) -> MeshInfo:
    info = _MESHES.get(id(mesh))
    if info is None or info.mesh is not mesh:
        if len(_MESHES) > 256:
            _MESHES.clear()
        info = _MESHES[id(mesh)] = MeshInfo(mesh)
    return info


# by id of the type (kept alive): ``uniform_shape``'s answer, asked many times per type
_UNIFORM: dict[int, tuple[DTensorType, tuple[int, ...] | None]] = {}


def uniform_shape(t: DTensorType) -> tuple[int, ...] | None:
    """The one local shape of ``t`` when every device's piece has it (even shards), else None
    (also along an axis with uneven shares). Memoized per type object (``even_shape``)."""
    hit = _UNIFORM.get(id(t))
    if hit is not None and hit[0] is t:
        return hit[1]
    if len(_UNIFORM) > 4096:
        _UNIFORM.clear()
    got = even_shape(t)
    _UNIFORM[id(t)] = (t, got)
    return got


def even_shape(t: DTensorType) -> tuple[int, ...] | None:
    """``uniform_shape`` computed (the reference its memo is tested against)."""
    shape = list(t.shape)
    for ax, p in enumerate(t.placements):
        if isinstance(p, Shard):
            n = t.mesh.shape[ax]
            if shape[p.dim] % n or shares_of(n) is not None:
                return None
            shape[p.dim] //= n
    return tuple(shape)


def shape_groups(t: DTensorType) -> list[list[int]]:
    """Positions of ``t``'s mesh devices grouped by the shape of their piece."""
    n = len(t.mesh.devices)
    if uniform_shape(t) is not None:
        return [list(range(n))]
    info = mesh_info(t.mesh)
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, c in enumerate(info.coords):
        groups.setdefault(local_shape_at(t, c), []).append(i)
    return list(groups.values())


def piece_bytes(t: DTensorType, position: int) -> float:
    """Bytes of the piece of ``t`` on its mesh's device at ``position``."""
    shape = uniform_shape(t)
    if shape is None:
        shape = local_shape_at(t, mesh_info(t.mesh).coords[position])
    return float(math.prod(shape) * _ITEMSIZE[t.dtype])


# by (id of the type, kept alive; device id; position): ``local_piece``'s answer for a DTensor —
# the planner asks for the same pieces op after op, and a type is cheaper found than made
_PIECES: dict[tuple[int, int, int], tuple[DTensorType, TensorType]] = {}


def local_piece(t: Type, device: Device, position: int) -> Type:
    """The type a device works on: its piece of a DTensor; a plain tensor or scalar (a constant of
    the logical program, made on every device) moved to it. A DTensor's piece is memoized
    (``_PIECES``)."""
    if isinstance(t, DTensorType):
        key = (id(t), device.id, position)
        hit = _PIECES.get(key)
        if hit is not None and hit[0] is t:
            return hit[1]
        shape = uniform_shape(t)
        if shape is None:
            shape = local_shape_at(t, mesh_info(t.mesh).coords[position])
        piece = TensorType(t.dtype, shape, device)
        if len(_PIECES) > 8192:
            _PIECES.clear()
        _PIECES[key] = (t, piece)
        return piece
    if isinstance(t, TensorType | ScalarType):
        return t.with_device(device)
    return t


def step_types(src: DTensorType, dst: DTensorType) -> list[tuple[int, Placement, DTensorType, DTensorType]]:
    """``redistribute_steps`` with the layouts around each step: (axis, from, before, after)."""
    out = []
    cur = src
    for ax, b in redistribute_steps(src.placements, dst.placements, src.mesh.shape):
        nxt = cur.with_placements((*cur.placements[:ax], b, *cur.placements[ax + 1 :]))
        out.append((ax, cur.placements[ax], cur, nxt))
        cur = nxt
    return out


__all__ = [
    "MeshInfo",
    "even_shape",
    "local_piece",
    "mesh_info",
    "piece_bytes",
    "shape_groups",
    "step_types",
    "uniform_shape",
]
