"""The GEMM efficiency curve (distir.hardware.gemm): its shape, its calibration, and the time the
cost model charges for a GEMM against published per-shape kernel timings (XLA's H100 table)."""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

import distir
from distir.hardware.cluster import parse_cluster
from distir.hardware.gemm import (
    K_OVERHEAD,
    TILES,
    GemmShape,
    ceiling,
    gemm_efficiency,
    shape_factor,
    tile_factor,
)
from distir.hardware.presets import PRESETS
from distir.hardware.specs import GemmProfile, SpecError
from distir.ir.types import Device, DType, TensorType
from distir.ir.values import Attrs
from distir.sim.cost import RooflineCostModel

XLA_H100 = Path(__file__).resolve().parents[2] / "bench" / "data" / "gemm_h100_bf16_xla.csv"

PROFILES = {k: n.device.gemm for k, n in PRESETS.items() if n.device.gemm is not None}


@pytest.mark.parametrize("key", sorted(PROFILES))
def test_efficiency_is_monotone_in_size_and_bounded_by_the_ceiling(key: str) -> None:
    g = PROFILES[key]
    assert g is not None
    top = gemm_efficiency(g, GemmShape(1, 0, 0, 0))  # the curve's maximum
    assert top <= ceiling(g)
    last = 0.0
    for p in range(6, 15):  # square GEMMs of 64 .. 16384: tile multiples
        n = 1 << p
        eff = gemm_efficiency(g, GemmShape(1, n, n, n))
        assert 0 < eff <= top <= 1
        assert eff >= last, (n, eff, last)
        last = eff
    # the large ones approach the ceiling, the small ones run far below it
    assert gemm_efficiency(g, GemmShape(1, 16384, 16384, 16384)) > 0.95 * top
    assert gemm_efficiency(g, GemmShape(1, 128, 128, 128)) < 0.25 * top


@pytest.mark.parametrize("key", sorted(PROFILES))
def test_the_curve_passes_through_the_published_anchor(key: str) -> None:
    g = PROFILES[key]
    assert g is not None
    m, n, k = g.anchor
    assert gemm_efficiency(g, GemmShape(1, m, n, k)) == pytest.approx(g.fraction, rel=1e-12)
    if g.fp32_fraction is not None:
        assert gemm_efficiency(g, GemmShape(1, m, n, k), fp32=True) == pytest.approx(
            g.fp32_fraction, rel=1e-12
        )


def test_published_maxima_are_the_benchmarks_figures() -> None:
    """A100 271.2 and H100 794.5 TFLOP/s bf16 (MAMF table, mamf-finder v2), V100 83 of 125
    (Markidis et al.)."""
    a100, h100 = PRESETS["dgx-a100"].device, PRESETS["h100"].device
    assert a100.gemm is not None and h100.gemm is not None
    assert a100.gemm.fraction * 312e12 == pytest.approx(271.2e12)
    assert h100.gemm.fraction * 989e12 == pytest.approx(794.5e12)
    assert a100.gemm.anchor_is_max and h100.gemm.anchor_is_max
    v100 = PRESETS["dgx2-v100"].device.gemm
    assert v100 is not None and v100.fraction * 125 == pytest.approx(83)


def test_tile_quantization_is_visible_just_above_a_tile_multiple() -> None:
    """N = 8192 fills its tiles; N = 8193 pads a column of tiles that does almost no work: the
    efficiency drops, and the time (FLOPs over efficiency) grows by much more than 1/8192."""
    g = PROFILES["dgx-a100"]
    assert g is not None
    at = gemm_efficiency(g, GemmShape(1, 8192, 8192, 4096))
    above = gemm_efficiency(g, GemmShape(1, 8192, 8193, 4096))
    assert above < 0.97 * at
    t_at, t_above = 8192 / at, 8193 / above
    assert t_above / t_at > 1.03


def test_wave_quantization_one_tile_more_than_a_wave() -> None:
    """On 108 SMs, 108 tiles of 256x128 are one full wave; 109 take two waves."""
    sms = 108
    full = tile_factor(GemmShape(1, 256 * 12, 128 * 9, 4096), sms, (256, 128))  # 108 tiles
    over = tile_factor(GemmShape(1, 256 * 109, 128, 4096), sms, (256, 128))  # 109 tiles
    assert full == pytest.approx(1.0)
    assert over == pytest.approx(109 / 216)


def test_skinny_and_small_k_products_run_below_square_ones() -> None:
    g = PROFILES["h100"]
    assert g is not None
    square = gemm_efficiency(g, GemmShape(1, 4096, 4096, 4096))
    assert gemm_efficiency(g, GemmShape(1, 4096, 64, 4096)) < square  # narrow N: small tiles
    assert gemm_efficiency(g, GemmShape(1, 4096, 4096, 64)) < 0.6 * square  # K = 64: half overhead
    # a batch of small products fills the waves like one large one
    assert gemm_efficiency(g, GemmShape(64, 512, 512, 512)) > gemm_efficiency(g, GemmShape(1, 512, 512, 512))


def test_shape_factor_is_the_best_tile() -> None:
    s = GemmShape(2, 1000, 3000, 700)
    best = max(tile_factor(s, 80, t) for t in TILES)
    assert shape_factor(s, 80) == pytest.approx(best * 700 / (700 + K_OVERHEAD))
    assert math.isclose(
        gemm_efficiency(PROFILES["dgx2-v100"], GemmShape(1, 0, 5, 5)), ceiling(PROFILES["dgx2-v100"])
    )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "what"),
    [
        ({"sms": 0}, "sms"),
        ({"fraction": 1.5}, "fraction"),
        ({"fraction": 0.0}, "fraction"),
        ({"fp32_fraction": -1.0}, "fp32_fraction"),
        ({"anchor": (1, 2)}, "anchor"),
        ({"anchor_is_max": 1}, "anchor_is_max"),
    ],
)
def test_bad_profiles_are_spec_errors(kw: dict[str, object], what: str) -> None:
    base: dict[str, object] = {"sms": 80, "fraction": 0.7, "anchor": (8192, 8192, 8192), "source": "x"}
    with pytest.raises(SpecError, match=what):
        GemmProfile(**(base | kw))  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["dgx-a100", "h100"])
def test_no_shape_runs_faster_than_the_best_point_of_a_sweep(key: str) -> None:
    """The MAMF point is the best of a sweep over shapes: the curve reaches it at the anchor and
    never exceeds it; the same profile uncapped would rise above it for a K far beyond the
    anchor's (the factor form's extrapolation, which the cap exists for)."""
    g = PROFILES[key]
    assert g is not None and g.anchor_is_max
    sizes = [1024, 2048, 4096, 8192, 16384, 32768]
    effs = [gemm_efficiency(g, GemmShape(1, m, n, k)) for m in sizes for n in sizes for k in sizes]
    assert max(effs) == pytest.approx(g.fraction)
    assert gemm_efficiency(g, GemmShape(1, *g.anchor)) == pytest.approx(g.fraction, rel=1e-12)
    free = dataclasses.replace(g, anchor_is_max=False)
    assert gemm_efficiency(free, GemmShape(1, 8192, 8192, 32768)) > g.fraction


def _xla_h100() -> list[tuple[GemmShape, float]]:
    with XLA_H100.open() as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return [
            (GemmShape(int(r["b"]), int(r["m"]), int(r["n"]), int(r["k"])), float(r["tflops"])) for r in rows
        ]


def test_the_h100_charge_follows_xla_measured_gemm_table() -> None:
    """Oracle: XLA's default matmul performance table for H100 (375 bf16 batched products, M, N,
    K from 256 to 4096, median CUPTI kernel times; bench/data). The cost model's time for each
    product as a MatMul op (launch + roofline on the curve) is within a few percent of the
    measured time at the median, and within 6% for every product of 64 GFLOP or more."""
    cl = parse_cluster("h100:1")
    cost, mm = RooflineCostModel(cl), distir.REGISTRY["MatMul"]
    ratios, large = [], []
    for s, tflops in _xla_h100():
        batch = (s.batch,) if s.batch > 1 else ()
        a = TensorType(DType.bf16, (*batch, s.m, s.k), Device(0))
        b = TensorType(DType.bf16, (*batch, s.k, s.n), Device(0))
        out = TensorType(DType.bf16, (*batch, s.m, s.n), Device(0))
        flops = 2.0 * s.batch * s.m * s.n * s.k
        r = math.log(cost.compute_time(mm, [a, b], [out], Attrs({}), 0) / (flops / (tflops * 1e12)))
        ratios.append(r)
        if flops >= 64e9:
            large.append(r)
    assert len(ratios) == 375 and len(large) > 20
    assert abs(float(np.median(ratios))) < 0.03
    assert float(np.sqrt(np.mean(np.square(ratios)))) < 0.10
    assert max(abs(r) for r in large) < 0.06
