"""Programs over several meshes (one per pipeline stage): ``MeshSend`` (type rule, text format,
errors) and materialization of multi-mesh programs with calls — the per-device program computes
the sequential values, on the reference executor and as per-rank programs in lock-step."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import distir
from distir.interp.lockstep import check_deadlock_free, run_ranks
from distir.interp.loop import InterpretError
from distir.interp.project import project
from distir.interp.reference import random_inputs, run_reference
from distir.ir import Device, DTensorType, Mesh, Module, parse_module, print_module
from distir.ir.dtensor import Partial
from distir.ir.types import IRTypeError
from distir.ops import REGISTRY, OpTypeError
from distir.ops.dist import format_mesh_attr, largest_piece_bytes, parse_mesh_attr
from distir.parallel.sharding.materialize import local_shape, materialize, shard_value, unshard_value
from distir.parallel.sharding.propagate import ShardingError
from ir.structural import structurally_equal

from .gen import RedistCase, gather_pieces, mesh_of, partial_pieces, places_text, redist_cases

A = "mesh(dp=2, tp=2; d0, d1, d2, d3)"
B = "mesh(dp=2, tp=2; d4, d5, d6, d7)"


def _t(shape: str, mesh: str, places: str) -> str:
    return f"DTensor[f32, {shape}, {mesh}, [{places}]]"


TWO_STAGES = f"""func @layer(%x, %w1, %w2) {{
  %h = MatMul(%x, %w1)
  %a = Gelu(%h)
  %y = MatMul(%a, %w2)
  %r = Redistribute(%y, to="S(0), R")
  return %r
}}

func @main(%x: {_t("(8, 16)", A, "S(0), R")}, %w1a: {_t("(16, 32)", A, "R, S(1)")}, %w2a: {_t("(32, 16)", A, "R, S(0)")}, %w1b: {_t("(16, 32)", B, "R, S(1)")}, %w2b: {_t("(32, 16)", B, "R, S(0)")}) {{
  %h0 = @layer(%x, %w1a, %w2a)
  %h1 = MeshSend(%h0, mesh="dp=2, tp=2; d4, d5, d6, d7")
  %y = @layer(%h1, %w1b, %w2b)
  return %y
}}
"""


def run_all_ways(m: Module, seed: int = 0) -> float:
    """Max relative difference between the DTensor program's sequential outputs and its
    materialized program's, run globally and as per-rank programs (checked deadlock free)."""
    m = distir.check(m)
    mat = distir.check(materialize(m))
    args = random_inputs(m.entry, seed)
    want = run_reference(m, args)
    flat: list[np.ndarray] = []
    per_rank: dict[Device, list[np.ndarray]] = {}
    for a, p in zip(args, m.entry.params, strict=True):
        assert isinstance(p.type, DTensorType)
        pieces = shard_value(a, p.type)
        for d in p.type.mesh.devices:
            flat.append(pieces[d])
            per_rank.setdefault(d, []).append(pieces[d])
    got = run_reference(mat, flat)
    ranks = project(mat)
    check_deadlock_free(ranks)
    by_rank = run_ranks(ranks, per_rank)  # type: ignore[arg-type]
    taken = {d: 0 for d in by_rank}
    worst, k = 0.0, 0
    for w, v in zip(want, m.entry.outputs, strict=True):
        t = v.type
        assert isinstance(t, DTensorType)
        glob = {d: got[k + i] for i, d in enumerate(t.mesh.devices)}
        k += len(t.mesh.devices)
        ranked = {}
        for d in t.mesh.devices:
            ranked[d] = by_rank[d][taken[d]]
            taken[d] += 1
        scale = max(float(np.max(np.abs(w), initial=0.0)), 1e-6)
        for ps in (glob, ranked):
            worst = max(worst, float(np.max(np.abs(unshard_value(ps, t) - w), initial=0.0)) / scale)
    assert k == len(got)
    return worst


# -- MeshSend -------------------------------------------------------------------------------------
def test_meshsend_type_and_text_round_trip() -> None:
    m = distir.check(parse_module(TWO_STAGES))
    text = print_module(m)
    assert f'%h1: {_t("(8, 16)", B, "S(0), R")} = MeshSend(%h0, mesh="dp=2, tp=2; d4, d5, d6, d7")' in text
    again = parse_module(text)
    assert print_module(again) == text
    assert structurally_equal(m, again)


@st.composite
def moves(draw: st.DrawFn) -> tuple[RedistCase, Mesh]:
    """A layout (any placements, shapes with uneven shards) and a destination mesh of the same
    shape on other devices (or the same devices in another order)."""
    case = draw(redist_cases())
    n = len(case.mesh.devices)
    ids = draw(
        st.one_of(
            st.just([n + i for i in range(n)]),
            st.permutations(range(n)).filter(lambda p: all(i != j for i, j in enumerate(p))),
        )
    )
    return case, Mesh(case.mesh.axes, tuple(Device(i) for i in ids))


def _moved_text(case: RedistCase, dst: Mesh) -> str:
    shape = f"({case.shape[0]},)" if len(case.shape) == 1 else "(" + ", ".join(map(str, case.shape)) + ")"
    src = f"DTensor[f32, {shape}, {case.mesh}, [{places_text(case.src)}]]"
    return f'func @f(%x: {src}) {{\n  %y = MeshSend(%x, mesh="{format_mesh_attr(dst)}")\n  return %y\n}}\n'


@settings(max_examples=80, deadline=None)
@given(moves(), st.integers(0, 2**32 - 1))
def test_meshsend_moves_every_piece(move: tuple[RedistCase, Mesh], seed: int) -> None:
    """Any layout moves to another mesh piece by piece (one Send per device, same coordinates),
    the text round-trips, and the value is unchanged, globally and per rank."""
    case, dst = move
    text = _moved_text(case, dst)
    m = distir.check(parse_module(text))
    assert print_module(parse_module(print_module(m))) == print_module(m)
    tin, tout = m.entry.params[0].type, m.entry.outputs[0].type
    assert isinstance(tin, DTensorType) and isinstance(tout, DTensorType)
    assert (tout.mesh, tout.placements, tout.shape) == (dst, tin.placements, tin.shape)
    mat = distir.check(materialize(m))
    sends = [op for op in mat.entry.ops()]
    assert [op.name for op in sends] == ["Send"] * len(dst.devices)
    assert [op.attrs["dst"] for op in sends] == list(dst.devices)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(case.shape).astype(np.float32)
    pieces = partial_pieces(x, tin, rng)
    got = run_reference(mat, [pieces[d] for d in tin.mesh.devices])
    moved = dict(zip(dst.devices, got, strict=True))
    for a, b in zip(tin.mesh.devices, dst.devices, strict=True):
        np.testing.assert_array_equal(moved[b], pieces[a])
        assert moved[b].shape == local_shape(tout, b)
    if not any(isinstance(p, Partial) for p in tin.placements):
        np.testing.assert_array_equal(gather_pieces(moved, tout), x)
    ranks = project(mat)
    check_deadlock_free(ranks)
    by_rank = run_ranks(ranks, {d: [pieces[d]] if d in tin.mesh.devices else [] for d in ranks})
    for b in dst.devices:
        np.testing.assert_array_equal(by_rank[b][-1], moved[b])


def test_meshsend_cost_is_the_largest_piece() -> None:
    m = distir.check(parse_module(_moved_text(_case((5, 7), (2, 3), "S(0), S(1)"), _shifted((2, 3)))))
    tin = m.entry.params[0].type
    assert isinstance(tin, DTensorType)
    ins, outs = [tin], [m.entry.outputs[0].type]
    desc = REGISTRY["MeshSend"].comm_cost(ins, outs, m.entry.body[0].attrs)  # type: ignore[misc, arg-type]
    # 5 rows over 2 are 3, 2; 7 columns over 3 are 3, 2, 2: the largest piece is 3 x 3 floats
    assert desc.nbytes == largest_piece_bytes(tin) == 3 * 3 * 4
    assert desc.devices == (*tin.mesh.devices, *_shifted((2, 3)).devices)
    assert max(math.prod(local_shape(tin, d)) * 4 for d in tin.mesh.devices) == desc.nbytes


def _case(shape: tuple[int, ...], mesh: tuple[int, ...], src: str) -> RedistCase:
    from distir.ir.dtensor import parse_placements

    return RedistCase(shape, mesh_of(mesh), parse_placements(src), parse_placements(src))


def _shifted(shape: tuple[int, ...]) -> Mesh:
    n = math.prod(shape)
    return Mesh(mesh_of(shape).axes, tuple(Device(n + i) for i in range(n)))


@pytest.mark.parametrize(
    ("attr", "message"),
    [
        ("dp=2, tp=2; d4, d5, d6", r"attribute mesh=.*needs 4 devices, got 3"),
        ("dp=2, tp=2, d4, d5, d6, d7", r"attribute mesh=.* is not like .*\(axes; devices\)"),
        ("dp=2, tq=2; d4, d5, d6, d7", r"same shape .* from mesh\(dp=2, tp=2; d0.*\) to mesh\(dp=2, tq=2"),
        ("dp=4; d4, d5, d6, d7", r"same shape .* to mesh\(dp=4; d4, d5, d6, d7\)"),
        ("dp=2, tp=2; d4, d1, d6, d7", r"send d1's piece to itself"),
        ("dp=2, tp=2; d4, dx, d6, d7", r"attribute mesh=.*mesh device 'dx' is not like d3"),
    ],
)
def test_meshsend_errors_name_what_is_wrong(attr: str, message: str) -> None:
    text = f'func @f(%x: {_t("(8, 16)", A, "S(0), R")}) {{\n  %y = MeshSend(%x, mesh="{attr}")\n  return %y\n}}\n'
    with pytest.raises(InterpretError, match=message):
        distir.check(parse_module(text))


def test_meshsend_needs_a_dtensor() -> None:
    text = 'func @f(%x: Tensor[f32, (4,), d0]) {\n  %y = MeshSend(%x, mesh="x=1; d1")\n  return %y\n}\n'
    with pytest.raises(InterpretError, match="MeshSend needs a distributed tensor"):
        distir.check(parse_module(text))


def test_mesh_attr_round_trips() -> None:
    mesh = Mesh((("dp", 2), ("tp", 3)), tuple(Device(i) for i in (9, 3, 4, 5, 6, 10)))
    assert format_mesh_attr(mesh) == "dp=2, tp=3; d9, d3, d4, d5, d6, d10"
    assert parse_mesh_attr(format_mesh_attr(mesh)) == mesh
    with pytest.raises(IRTypeError, match="attribute where="):
        parse_mesh_attr("dp=2", "where")


# -- materialization over several meshes ----------------------------------------------------------
def test_two_stages_with_calls_compute_the_same_numbers() -> None:
    m = parse_module(TWO_STAGES)
    assert run_all_ways(m) < 1e-5
    mat = materialize(distir.check(m))
    names = [op.name for op in mat.entry.ops()]
    assert names.count("Send") == 4 and names.count("AllReduce") == 4  # 2 groups x 2 stages
    # parameters in parameter order, each in its mesh's device order; results likewise
    assert [p.name for p in mat.entry.params[:6]] == ["x.d0", "x.d1", "x.d2", "x.d3", "w1a.d0", "w1a.d1"]
    assert [p.name for p in mat.entry.params[-4:]] == ["w2b.d4", "w2b.d5", "w2b.d6", "w2b.d7"]
    assert [str(t) for t in (v.type.device for v in mat.entry.outputs)] == ["d4", "d5", "d6", "d7"]  # type: ignore[union-attr]
    # a Send goes from each device of stage 0 to the device at the same coordinates of stage 1
    sends = [op for op in mat.entry.ops() if op.name == "Send"]
    assert [(op.inputs[0].type.device.id, op.attrs["dst"].id) for op in sends] == [  # type: ignore[union-attr]
        (0, 4),
        (1, 5),
        (2, 6),
        (3, 7),
    ]


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from([(1, 2), (2, 1), (2, 2), (1, 3)]),
    st.integers(2, 9),
    st.integers(1, 3),
    st.integers(0, 2**32 - 1),
)
def test_pipelines_over_meshes_compute_the_same_numbers(
    mesh: tuple[int, int], rows: int, stages: int, seed: int
) -> None:
    """A stage function called on each stage's mesh, MeshSend between stages, results of every
    stage returned (uneven shards included)."""
    dp, tp = mesh
    n = dp * tp
    meshes = [
        f"mesh(dp={dp}, tp={tp}; {', '.join(f'd{s * n + i}' for i in range(n))})" for s in range(stages)
    ]
    params = [f"%x: {_t(f'({rows}, 6)', meshes[0], 'S(0), R')}"]
    for s, mm in enumerate(meshes):
        params += [f"%w1_{s}: {_t('(6, 10)', mm, 'R, S(1)')}", f"%w2_{s}: {_t('(10, 6)', mm, 'R, S(0)')}"]
    body = []
    cur = "%x"
    outs = []
    for s in range(stages):
        body.append(f"  %y{s} = @layer({cur}, %w1_{s}, %w2_{s})")
        outs.append(f"%y{s}")
        if s + 1 < stages:
            body.append(f'  %m{s} = MeshSend(%y{s}, mesh="{meshes[s + 1][5:-1]}")')
            cur = f"%m{s}"
    text = TWO_STAGES.split("func @main")[0] + (
        f"func @main({', '.join(params)}) {{\n" + "\n".join(body) + f"\n  return {', '.join(outs)}\n}}\n"
    )
    assert run_all_ways(parse_module(text), seed) < 1e-5


def test_overlapping_meshes() -> None:
    """Stage 1's mesh reuses a device of stage 0 at other coordinates: d1 sends its piece to d2
    and receives d0's — still deadlock free, still the same numbers."""
    a = "mesh(x=2; d0, d1)"
    text = f"""func @f(%x: {_t("(4, 3)", a, "S(0)")}) {{
  %r = Relu(%x)
  %y = MeshSend(%r, mesh="x=2; d1, d2")
  %z = Neg(%y)
  return %z
}}
"""
    assert run_all_ways(parse_module(text)) == 0.0
    mat = materialize(distir.check(parse_module(text)))
    assert [(op.name, str(op.attrs.get("dst"))) for op in mat.entry.ops() if op.name == "Send"] == [
        ("Send", "d1"),
        ("Send", "d2"),
    ]


def test_constants_are_made_on_the_meshes_that_use_them() -> None:
    text = f"""func @f(%x: {_t("(4, 4)", A, "S(0), R")}) {{
  %y = MeshSend(%x, mesh="dp=2, tp=2; d4, d5, d6, d7")
  %c = Constant(value=0.5, dtype=f32, device=d0)
  %z = Mul(%y, %c)
  return %z
}}
"""
    assert run_all_ways(parse_module(text)) == 0.0
    mat = materialize(distir.check(parse_module(text)))
    consts = [op.attrs["device"].id for op in mat.entry.ops() if op.name == "Constant"]  # type: ignore[union-attr]
    assert consts == [4, 5, 6, 7]


def test_a_local_op_on_two_meshes_is_an_error() -> None:
    text = f"""func @f(%x: {_t("(4, 4)", A, "R, R")}, %w: {_t("(4, 4)", B, "R, R")}) {{
  %y: {_t("(4, 4)", A, "R, R")} = Add(%x, %w)
  return %y
}}
"""
    with pytest.raises(
        ShardingError, match=r"must run on one mesh; its DTensors are on: mesh\(dp=2.*d0.*mesh\("
    ):
        materialize(parse_module(text))
    with pytest.raises(InterpretError, match="mixes tensors of different meshes"):
        distir.check(parse_module(text))


def test_meshsend_cost_descriptor_is_p2p() -> None:
    from distir.ops.registry import CommPattern

    m = distir.check(parse_module(TWO_STAGES))
    op = next(i for i in m.entry.body if getattr(i, "name", "") == "MeshSend")
    ins, outs = [op.inputs[0].type], [op.outputs[0].type]
    desc = REGISTRY["MeshSend"].comm_cost(ins, outs, op.attrs)  # type: ignore[misc, arg-type]
    assert desc.pattern is CommPattern.P2P
    with pytest.raises(OpTypeError):
        REGISTRY["MeshSend"].infer_types([ins[0]], op.attrs.__class__({"mesh": "dp=2; d4, d5"}), [None])
