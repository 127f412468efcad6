"""The calibration fits recover known parameters from synthetic timings (known figures + noise).

The oracle: timings generated from closed-form formulas written here (the alpha-beta formulas of
each collective, the roofline) with chosen parameters and multiplicative noise; the fit must
return the chosen parameters within the noise's reach."""

from __future__ import annotations

import math

import numpy as np
import pytest

from distir.hardware.fit import (
    FitError,
    GemmSample,
    LinkSample,
    OpSample,
    fit_family,
    fit_gemm,
    fit_link,
)
from distir.hardware.gemm import GemmShape, shape_factor
from distir.hardware.specs import LinkSpec
from distir.sim import collectives as coll

B, ALPHA = 2.5e9, 30e-6
NOISE = 0.03


def _closed_form(name: str, n: int, m: float) -> float:
    """Each collective's alpha-beta time on one node of n ranks with link (B, ALPHA)."""
    if name == "allreduce":
        return 2 * (n - 1) / n * m / B + 2 * (n - 1) * ALPHA
    if name in ("allgather", "reducescatter"):
        return (n - 1) / n * m / B + (n - 1) * ALPHA
    if name == "broadcast":
        return m / B + (n - 1) * ALPHA
    assert name == "p2p"
    return m / B + ALPHA


def _send(cluster: coll.Cluster, nbytes: float, gpus: list[int]) -> float:
    return coll.send_time(cluster, nbytes, gpus[0], gpus[-1])


COSTS = {
    "allreduce": coll.allreduce_time,
    "allgather": coll.allgather_time,
    "reducescatter": coll.reducescatter_time,
    "broadcast": coll.broadcast_time,
    "p2p": _send,
}


@pytest.mark.parametrize("name", sorted(COSTS))
def test_fit_link_recovers_alpha_beta_of_each_collective(name: str) -> None:
    rng = np.random.default_rng(1)
    groups = (2,) if name == "p2p" else (2, 3, 4, 8)
    samples = [
        LinkSample(name, n, m, _closed_form(name, n, m) * (1 + NOISE * rng.standard_normal()))
        for n in groups
        for m in (2**10, 2**13, 2**16, 2**19, 2**22, 2**25)
    ]
    fit = fit_link(samples, COSTS[name])
    assert fit.link.bandwidth == pytest.approx(B, rel=0.1)
    assert fit.link.latency_s == pytest.approx(ALPHA, rel=0.1)
    assert fit.quality.median < 2 * NOISE and fit.quality.samples == len(samples)


def test_fit_link_clamps_a_negative_latency_to_zero() -> None:
    """Times proportional to size (no fixed cost): the latency is 0, never negative."""
    samples = [LinkSample("p2p", 2, m, m / B * (1 + 0.01 * (-1) ** i)) for i, m in enumerate((1e3, 1e5, 1e7))]
    fit = fit_link(samples, COSTS["p2p"])
    assert fit.link.latency_s >= 0
    assert fit.link.bandwidth == pytest.approx(B, rel=0.05)


def test_fit_link_refuses_times_that_do_not_grow() -> None:
    samples = [LinkSample("p2p", 2, m, 1e-4) for m in (1e3, 1e5, 1e7)]
    with pytest.raises(FitError, match="do not grow"):
        fit_link(samples, COSTS["p2p"])


PEAK = {"f32": 100e9, "bf16": 60e9}
BW = 50e9


def _roofline(flops: float, nbytes: float, dtype: str, ef: float, em: float, launch: float) -> float:
    return launch + max(flops / (PEAK[dtype] * ef), nbytes / (BW * em))


def test_fit_family_recovers_efficiencies_and_launch() -> None:
    rng = np.random.default_rng(2)
    ef, em, launch = 0.2, 0.6, 3e-6
    samples = []
    for dtype in ("f32", "bf16"):
        for nbytes in (4e3, 4e4, 4e5, 4e6, 4e7):
            for intensity in (0.05, 0.5, 5.0, 50.0):  # FLOPs per byte: memory- to compute-bound
                flops = intensity * nbytes
                t = _roofline(flops, nbytes, dtype, ef, em, launch) * (1 + NOISE * rng.standard_normal())
                samples.append(OpSample("X", "fam", dtype, flops, nbytes, t))
    fit = fit_family(samples, PEAK.__getitem__, BW)
    assert fit.flop == pytest.approx(ef, rel=0.1)
    assert fit.memory == pytest.approx(em, rel=0.1)
    assert fit.launch_s == pytest.approx(launch, rel=0.3)
    assert fit.flop_bounded and fit.memory_bounded
    assert fit.quality.median < 2 * NOISE


def test_fit_family_reports_an_unbounded_efficiency_as_one() -> None:
    """Every op memory-bound: the data say nothing of the FLOP rate beyond a lower bound."""
    em, launch = 0.5, 2e-6
    samples = [
        OpSample("X", "fam", "f32", 0.01 * b, b, _roofline(0.01 * b, b, "f32", 1.0, em, launch))
        for b in (1e4, 1e5, 1e6, 1e7)
    ]
    fit = fit_family(samples, PEAK.__getitem__, BW)
    assert fit.memory == pytest.approx(em, rel=0.05)
    assert fit.flop == 1.0 and not fit.flop_bounded and fit.memory_bounded


SHAPES = [
    GemmShape(1, m, n, k)
    for m, n, k in (
        (128, 128, 128),
        (256, 512, 256),
        (1024, 1024, 1024),
        (4096, 4096, 4096),
        (8192, 1024, 4096),
        (64, 8192, 8192),
        (3000, 5000, 700),
        (1536, 1536, 512),
    )
]


def test_fit_gemm_recovers_the_curve() -> None:
    """Timings from the curve of distir.hardware.gemm (108 SMs, known peaks) + noise."""
    rng = np.random.default_rng(3)
    sms, launch = 108, 5e-6
    peak = {"f32": 19.5e12, "bf16": 250e12}
    samples = []
    for dtype, p in peak.items():
        for s in SHAPES:
            flops = 2.0 * s.m * s.n * s.k
            t = launch + flops / (p * shape_factor(s, sms))
            samples.append(GemmSample(s, dtype, flops, t * (1 + NOISE * rng.standard_normal())))
    fit = fit_gemm(samples, launch, sms_candidates=(1, 16, 64, 108, 132))
    assert fit.sms == sms
    for dtype, p in peak.items():
        assert fit.peak[dtype] == pytest.approx(p, rel=0.05)
    assert fit.anchor == (4096, 4096, 4096)
    profile = fit.profile("test")
    assert profile.fraction == pytest.approx(shape_factor(GemmShape(1, 4096, 4096, 4096), sms))
    assert fit.quality.median < 2 * NOISE


def test_fits_refuse_no_samples() -> None:
    with pytest.raises(FitError):
        fit_gemm([], 0.0)
    with pytest.raises(FitError):
        fit_family([], PEAK.__getitem__, BW)
    with pytest.raises(FitError):
        fit_link([LinkSample("p2p", 2, 1e3, 1e-5)], COSTS["p2p"])


def test_link_spec_of_fit_is_usable() -> None:
    samples = [LinkSample("p2p", 2, m, _closed_form("p2p", 2, m)) for m in (1e3, 1e6)]
    link = fit_link(samples, COSTS["p2p"]).link
    assert isinstance(link, LinkSpec) and math.isclose(
        link.time(1e6), _closed_form("p2p", 2, 1e6), rel_tol=1e-6
    )
