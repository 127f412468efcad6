"""``local_piece`` memoizes a DTensor's piece per (type object, device, position): the memo's
answer is the piece computed from the type's placements (``local_shape_at``), for even and
uneven shards, on every device of the mesh, asked once and again."""

from __future__ import annotations

import pytest

from distir.ir import Device, DTensorType, DType, TensorType
from distir.ir.dtensor import Mesh, parse_placements
from distir.parallel.sharding.materialize import local_shape_at
from distir.sim.layout import local_piece, mesh_info


@pytest.mark.parametrize(
    ("shape", "axes", "placements"),
    [
        ((8, 16), (("dp", 2), ("tp", 2)), "S(0), S(1)"),
        ((8, 50257), (("dp", 1), ("tp", 4)), "R, S(1)"),  # uneven: pieces of two sizes
        ((6, 10), (("tp", 4),), "S(1)"),
        ((3, 5), (("dp", 2), ("tp", 2)), "R, R"),
    ],
)
def test_memoized_pieces_are_the_pieces_of_the_placements(
    shape: tuple[int, ...], axes: tuple[tuple[str, int], ...], placements: str
) -> None:
    n = 1
    for _, k in axes:
        n *= k
    mesh = Mesh(axes, tuple(Device(10 + i) for i in range(n)))
    t = DTensorType(DType.f32, shape, mesh, parse_placements(placements))
    coords = mesh_info(mesh).coords
    for _ in range(2):  # computed, then from the memo
        for pos, dev in enumerate(mesh.devices):
            want = TensorType(DType.f32, local_shape_at(t, coords[pos]), dev)
            got = local_piece(t, dev, pos)
            assert got == want and hash(got) == hash(want)
    # an equal type object of its own gets equal pieces (the memo keys the object, kept alive)
    t2 = DTensorType(DType.f32, shape, mesh, parse_placements(placements))
    assert [local_piece(t2, d, i) for i, d in enumerate(mesh.devices)] == [
        local_piece(t, d, i) for i, d in enumerate(mesh.devices)
    ]
