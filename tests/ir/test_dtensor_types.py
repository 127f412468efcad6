"""DTensor types: validation, text round trip (property), meshes and placement parsing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distir.ir import Device, DTensorType, DType, IRTypeError, Mesh, Partial, Replicate, Shard, parse_type
from distir.ir.dtensor import format_placements, parse_placements, split_sizes


@st.composite
def dtensor_types(draw: st.DrawFn) -> DTensorType:
    rank = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=rank, max_size=rank)))
    sizes = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    names = draw(
        st.lists(
            st.from_regex(r"[a-z][a-z0-9_]{0,3}", fullmatch=True),
            min_size=len(sizes),
            max_size=len(sizes),
            unique=True,
        )
    )
    n = 1
    for s in sizes:
        n *= s
    ids = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n, unique=True))
    mesh = Mesh(tuple(zip(names, sizes, strict=True)), tuple(Device(i) for i in ids))
    choices: list[object] = [Replicate(), *(Partial(op) for op in ("sum", "max", "min", "mean"))]
    choices += [Shard(d) for d in range(rank)]
    places = tuple(draw(st.sampled_from(choices)) for _ in sizes)
    return DTensorType(draw(st.sampled_from(list(DType))), shape, mesh, places)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(dtensor_types())
def test_dtensor_text_round_trips(t: DTensorType) -> None:
    assert parse_type(str(t)) == t
    assert hash(parse_type(str(t))) == hash(t)
    assert parse_placements(format_placements(t.placements)) == t.placements


def test_mesh_coordinates_and_groups() -> None:
    m = Mesh((("dp", 2), ("tp", 3)), tuple(Device(i) for i in range(6)))
    assert m.coords(Device(4)) == (1, 1)
    assert m.groups(1) == [(Device(0), Device(1), Device(2)), (Device(3), Device(4), Device(5))]
    assert m.groups(0) == [(Device(0), Device(3)), (Device(1), Device(4)), (Device(2), Device(5))]
    assert Mesh.parse("dp=2, tp=3") == m
    assert Mesh.parse("x=2", "d4, d7").devices == (Device(4), Device(7))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Mesh((("x", 3),), (Device(0), Device(1))), "needs 3 devices"),
        (lambda: Mesh((("x", 2), ("x", 1)), (Device(0), Device(1))), "repeat"),
        (lambda: Shard(-1), "non-negative"),
        (lambda: Partial("avg"), "sum, max, min, mean"),
        (lambda: Mesh.parse("tp=x"), "like tp=4"),
        (lambda: parse_placements("S(1), Q"), "bad placement 'Q'"),
        (
            lambda: DTensorType(DType.f32, (4,), Mesh((("x", 2),), (Device(0), Device(1))), (Shard(1),)),
            "out of range",
        ),
    ],
)
def test_invalid_parts_are_rejected(make: object, message: str) -> None:
    with pytest.raises(IRTypeError, match=message):
        make()  # type: ignore[operator]


def test_split_sizes_larger_first() -> None:
    assert split_sizes(127, 2) == [64, 63]
    assert split_sizes(5, 3) == [2, 2, 1]
    assert split_sizes(1, 3) == [1, 0, 0]


def test_device_ranges_shorten_runs_of_three_or_more() -> None:
    from distir.ir.dtensor import device_ranges

    ds = [Device(i) for i in (0, 1, 2, 3, 8, 9, 11, 12, 13, 20)]
    assert device_ranges(ds) == "d0-d3, d8, d9, d11-d13, d20"
    assert device_ranges([]) == ""
    mesh = Mesh.parse("dp=2, tp=4", "d0,d1,d2,d3,d8,d9,d10,d11")
    assert mesh.text(short=True) == "mesh(dp=2, tp=4; d0-d3, d8-d11)"
    assert str(mesh) == "mesh(dp=2, tp=4; d0, d1, d2, d3, d8, d9, d10, d11)"  # the IR's form, parsed back
    t = DTensorType(DType.f32, (8, 4), mesh, (Shard(0), Replicate()))
    assert t.text(short=True) == "DTensor[f32, (8, 4), mesh(dp=2, tp=4; d0-d3, d8-d11), [S(0), R]]"
    assert str(t) == t.text() and "d0, d1" in str(t)
