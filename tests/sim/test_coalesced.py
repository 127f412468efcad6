"""Coalesced collectives (``Redistribute(..., coalesced=true)``): the later parts of one collective
call over a flat buffer — a gradient bucket, a layer's parameter gather — pay their bytes but not
the call's latency, which the first part pays once.

Oracles: the alpha-beta formula of a ring all-reduce written out by hand (2(n−1)/n·M/B +
2(n−1)α at the preset's published NCCL all-reduce bandwidth), and, for ``distribute``, the
bucket sizes themselves: one bucket per reducing backward has every gradient after its first
flagged, a bucket per layer has one unflagged gradient per layer.
"""

from __future__ import annotations

import math

import pytest

import distir
from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.hardware.cluster import cluster_from_toml, parse_cluster
from distir.ir import parse_module
from distir.ir.types import DType
from distir.parallel.distribute import distribute
from distir.parallel.sharding.materialize import materialize
from distir.parallel.strategy import parse_strategy
from distir.sim.collectives import allreduce_time
from distir.sim.simulate import simulate

# one node: NVLink3 at NCCL's published 230 GB/s bus bandwidth, 3 µs, without the preset's
# measured all-reduce curve by size (the alpha-beta oracle below; the curve: the last test)
A100 = cluster_from_toml(
    '[types.n]\npreset = "dgx-a100"\n[types.n.busbw_curves.allreduce]\npoints = []\n[[nodes]]\ntype = "n"\n'
)
NVLINK_BW, NVLINK_LAT = 230e9, 3e-6
MESH = "mesh(dp=2; d0, d1)"
BIG, SMALL = 4 * 1024 * 1024, 4 * 256  # f32 (1024, 1024) and (256,)


def _two_reductions(second: str) -> str:
    a, b = f"DTensor[f32, (1024, 1024), {MESH}, [P(sum)]]", f"DTensor[f32, (256,), {MESH}, [P(sum)]]"
    return f"""func @f(%a: {a}, %b: {b}) {{
  %ar = Redistribute(%a, to="R")
  %br = Redistribute(%b, to="R"{second})
  return %ar, %br
}}"""


def _allreduce(nbytes: float, n: int = 2) -> float:
    """A ring all-reduce inside one node, by hand: 2(n−1)/n·M/B + 2(n−1)α."""
    return 2 * (n - 1) / n * nbytes / NVLINK_BW + 2 * (n - 1) * NVLINK_LAT


@pytest.mark.parametrize("planner", ["fast", "reference"])
def test_a_coalesced_part_pays_its_bytes_not_the_latency(planner: str) -> None:
    plain = simulate(distir.check(parse_module(_two_reductions(""))), A100, planner=planner)
    joined = simulate(distir.check(parse_module(_two_reductions(", coalesced=true"))), A100, planner=planner)
    assert math.isclose(plain.step_time_s, _allreduce(BIG) + _allreduce(SMALL), rel_tol=1e-9)
    # the second part: its bytes over the link, no latency of its own
    expected = _allreduce(BIG) + 2 * (2 - 1) / 2 * SMALL / NVLINK_BW
    assert math.isclose(joined.step_time_s, expected, rel_tol=1e-9)
    assert plain.step_time_s - joined.step_time_s == pytest.approx(2 * NVLINK_LAT, rel=1e-9)


@pytest.mark.parametrize("planner", ["fast", "reference"])
def test_a_coalesced_part_adds_its_bytes_at_the_peak_beside_a_measured_curve(planner: str) -> None:
    # the preset's all-reduce curve serves the call's first part at its size; the coalesced part
    # adds its bytes at the published peak (distir.sim.cost.charged)
    preset = parse_cluster("dgx-a100")
    joined = simulate(
        distir.check(parse_module(_two_reductions(", coalesced=true"))), preset, planner=planner
    )
    head = allreduce_time(preset, BIG, [0, 1])
    assert head > _allreduce(BIG)  # 4 MiB: below the curve's peak
    assert joined.step_time_s == pytest.approx(head + SMALL / NVLINK_BW, rel=1e-9)


def test_the_flag_changes_neither_the_value_nor_the_memory() -> None:
    plain = simulate(distir.check(parse_module(_two_reductions(""))), A100)
    joined = simulate(distir.check(parse_module(_two_reductions(", coalesced=true"))), A100)
    assert plain.peak_memory == joined.peak_memory
    mod = distir.check(parse_module(_two_reductions(", coalesced=true")))
    assert list(mod.entry.ops())[1].attrs["coalesced"] is True


GPT = "gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64"


def _reductions(bucket_mb: float, zero: int) -> tuple[int, int, int]:
    """(reductions, of them coalesced, layer calls) in the last backward chunk of a 2-way
    data-parallel GPT."""
    s = parse_strategy(f"d2.t1.p1.k2.1f1b.z{zero}")
    model = build_model(GPT, batch=4, dtype=DType.f32)
    prog = distribute(model, s, Optimizer("adam"), comm_streams=True, bucket_mb=bucket_mb)
    fn = next(f for f in prog.functions if f.name.endswith("_red"))
    reds = [op for op in fn.ops() if op.name == "Redistribute"]
    return len(reds), sum(bool(op.attrs.get("coalesced")) for op in reds), len(list(fn.calls()))


@pytest.mark.parametrize("zero", [0, 2])
def test_one_bucket_is_one_call(zero: int) -> None:
    n, flagged, _layers = _reductions(1e6, zero)  # every gradient in one bucket: one call
    assert n > 1 and flagged == n - 1


@pytest.mark.parametrize("zero", [0, 2])
def test_a_bucket_per_layer_is_a_call_each(zero: int) -> None:
    """A bucket smaller than any gradient is flushed after every layer's backward (a layer's
    gradients join the bucket together): one call per layer with weights (at least the two
    blocks; the loss has none), each layer's later gradients coalesced into it."""
    n, flagged, layers = _reductions(1e-9, zero)
    assert 2 <= n - flagged < layers and flagged > 0


def test_a_layers_parameter_gathers_are_one_call() -> None:
    """ZeRO-3 with communication streams: each layer's weights are gathered in one call (FSDP's
    flat parameter): one gather per layer call pays the latency, at least one per block (two
    blocks of several weights each), never more than one per layer call."""
    s = parse_strategy("d2.t1.p1.k1.1f1b.z3")
    model = build_model(GPT, batch=2, dtype=DType.f32)
    prog = distribute(model, s, Optimizer("adam"), comm_streams=True)
    fwd = next(f for f in prog.functions if f.name == "c0_fwd")
    gathers = [op for op in fwd.ops() if op.name == "Redistribute"]
    first = [op for op in gathers if not op.attrs.get("coalesced")]
    calls = list(fwd.calls())
    assert 2 <= len(first) <= len(calls)
    assert len(gathers) > len(first)


def test_the_materialized_program_pays_the_same() -> None:
    """Materialization lowers a coalesced Redistribute to coalesced collectives: the per-device
    program costs what the DTensor program costs."""
    mod = distir.check(parse_module(_two_reductions(", coalesced=true")))
    mat = distir.check(materialize(mod))
    flags = [op.attrs.get("coalesced") for op in mat.entry.ops() if op.name == "AllReduce"]
    assert flags == [None, True]
    assert simulate(mat, A100).step_time_s == pytest.approx(simulate(mod, A100).step_time_s, rel=1e-12)
