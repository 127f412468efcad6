"""The TVM DistIR RFC's running example, stage by stage (golden text), with uneven shards."""

from __future__ import annotations

import distir
from distir.interp.project import project
from distir.ir import Device, Mesh, parse_module, print_module
from distir.parallel.sharding.legalize import legalize
from distir.parallel.sharding.materialize import materialize, shared_programs
from distir.parallel.sharding.propagate import propagate
from distir.parallel.sharding.sink_reductions import sink_reductions

from .helpers import compare

SRC = """func @foo(%x: Tensor[f32, (128, 128), d0], %A: Tensor[f32, (128, 127), d0], %B: Tensor[f32, (127, 128), d0], %C: Tensor[f32, (128, 1), d0]) {
  %lv0 = MatMul(%x, %A)
  %Y = Gelu(%lv0)
  %Z = MatMul(%Y, %B)
  %O = Mul(%Z, %C)
  return %O
}
"""
MESH = Mesh((("x", 2),), (Device(0), Device(1)))
M = "mesh(x=2; d0, d1)"

PROPAGATED = f"""func @foo(%x: DTensor[f32, (128, 128), {M}, [R]], %A: DTensor[f32, (128, 127), {M}, [S(1)]], %B: DTensor[f32, (127, 128), {M}, [S(0)]], %C: DTensor[f32, (128, 1), {M}, [R]]) {{
  %lv0: DTensor[f32, (128, 127), {M}, [S(1)]] = MatMul(%x, %A)
  %Y: DTensor[f32, (128, 127), {M}, [S(1)]] = Gelu(%lv0)
  %Z: DTensor[f32, (128, 128), {M}, [P(sum)]] = MatMul(%Y, %B)
  %O: DTensor[f32, (128, 128), {M}, [P(sum)]] = Mul(%Z, %C)
  return %O
}}
"""

# ours: Mul takes the pending sum (the cheapest choice), so the one reduction comes last
LEGALIZED = PROPAGATED.replace(
    "  return %O\n",
    f'  %O_R: DTensor[f32, (128, 128), {M}, [R]] = Redistribute(%O, to="R")\n  return %O_R\n',
)

# the RFC's LegalizeShardingPass output: the hidden reduction of the second matmul made explicit
RFC_LEGALIZED = f"""func @foo(%x: DTensor[f32, (128, 128), {M}, [R]], %A: DTensor[f32, (128, 127), {M}, [S(1)]], %B: DTensor[f32, (127, 128), {M}, [S(0)]], %C: DTensor[f32, (128, 1), {M}, [R]]) {{
  %lv0: DTensor[f32, (128, 127), {M}, [S(1)]] = MatMul(%x, %A)
  %Y: DTensor[f32, (128, 127), {M}, [S(1)]] = Gelu(%lv0)
  %Z: DTensor[f32, (128, 128), {M}, [P(sum)]] = MatMul(%Y, %B)
  %Z_R: DTensor[f32, (128, 128), {M}, [R]] = Redistribute(%Z, to="R")
  %O: DTensor[f32, (128, 128), {M}, [R]] = Mul(%Z_R, %C)
  return %O
}}
"""

# the RFC's multiply/redistribute swap
SUNK = f"""func @foo(%x: DTensor[f32, (128, 128), {M}, [R]], %A: DTensor[f32, (128, 127), {M}, [S(1)]], %B: DTensor[f32, (127, 128), {M}, [S(0)]], %C: DTensor[f32, (128, 1), {M}, [R]]) {{
  %lv0: DTensor[f32, (128, 127), {M}, [S(1)]] = MatMul(%x, %A)
  %Y: DTensor[f32, (128, 127), {M}, [S(1)]] = Gelu(%lv0)
  %Z: DTensor[f32, (128, 128), {M}, [P(sum)]] = MatMul(%Y, %B)
  %O_p: DTensor[f32, (128, 128), {M}, [P(sum)]] = Mul(%Z, %C)
  %O: DTensor[f32, (128, 128), {M}, [R]] = Redistribute(%O_p, to="R")
  return %O
}}
"""

MATERIALIZED = """func @foo(%x.d0: Tensor[f32, (128, 128), d0], %x.d1: Tensor[f32, (128, 128), d1], %A.d0: Tensor[f32, (128, 64), d0], %A.d1: Tensor[f32, (128, 63), d1], %B.d0: Tensor[f32, (64, 128), d0], %B.d1: Tensor[f32, (63, 128), d1], %C.d0: Tensor[f32, (128, 1), d0], %C.d1: Tensor[f32, (128, 1), d1]) {
  %lv0.d0: Tensor[f32, (128, 64), d0] = MatMul(%x.d0, %A.d0)
  %lv0.d1: Tensor[f32, (128, 63), d1] = MatMul(%x.d1, %A.d1)
  %Y.d0: Tensor[f32, (128, 64), d0] = Gelu(%lv0.d0)
  %Y.d1: Tensor[f32, (128, 63), d1] = Gelu(%lv0.d1)
  %Z.d0: Tensor[f32, (128, 128), d0] = MatMul(%Y.d0, %B.d0)
  %Z.d1: Tensor[f32, (128, 128), d1] = MatMul(%Y.d1, %B.d1)
  %O.d0: Tensor[f32, (128, 128), d0] = Mul(%Z.d0, %C.d0)
  %O.d1: Tensor[f32, (128, 128), d1] = Mul(%Z.d1, %C.d1)
  %O_R.d0: Tensor[f32, (128, 128), d0], %O_R.d1: Tensor[f32, (128, 128), d1] = AllReduce(%O.d0, %O.d1, op="sum")
  return %O_R.d0, %O_R.d1
}
"""


def test_propagation_golden() -> None:
    p = propagate(distir.check(parse_module(SRC)), MESH, {"A": "S(1)"})
    assert print_module(p.module) == PROPAGATED
    assert p.conflicts == []  # every op takes its inputs as they come


def test_legalization_golden_exactly_one_allreduce() -> None:
    legal = distir.check(legalize(parse_module(PROPAGATED)))
    assert print_module(legal) == LEGALIZED
    assert print_module(parse_module(LEGALIZED)) == LEGALIZED  # the DTensor text round-trips


def test_sink_reductions_golden() -> None:
    """The RFC's form (reduce, then multiply) becomes the swapped form."""
    sunk = distir.check(sink_reductions(distir.check(parse_module(RFC_LEGALIZED))))
    assert print_module(sunk) == SUNK
    # Gelu cannot take a pending sum: nothing moves
    text = RFC_LEGALIZED.replace("Mul(%Z_R, %C)", "Gelu(%Z_R)")
    assert print_module(sink_reductions(distir.check(parse_module(text)))) == text


def test_materialization_golden_uneven_shards() -> None:
    mat = distir.check(materialize(parse_module(LEGALIZED)))
    assert print_module(mat) == MATERIALIZED
    ops = [i.name for i in mat.entry.ops()]
    assert ops.count("AllReduce") == 1 and not {"AllGather", "ReduceScatter", "AllToAll"} & set(ops)
    ranks = project(mat)
    groups = shared_programs(ranks)
    assert [devs for devs, _ in groups] == [(Device(0),), (Device(1),)]  # 64 vs 63 columns differ


def test_same_numbers_as_unsharded() -> None:
    assert compare(parse_module(SRC), MESH, {"A": "S(1)"}) < 1e-5
