"""Fit the GEMM curve's shape constants to published per-shape GEMM timings, and print the curve
against the data (issue 16: compute efficiency from data, not constants).

    PYTHONPATH=src .venv/bin/python bench/fit_gemm.py [--table]

Data: ``bench/data/gemm_h100_bf16_xla.csv``, XLA's default matmul performance table for H100 SXM
(``sm_90``, bf16): 375 batched products, b ∈ {1, 2, 4} and M, N, K ∈ {256, …, 4096}, each the
median CUPTI kernel time of ten runs of the dot XLA compiles (source and method in the file's
header). No A100 table of this kind was found; the A100 takes the same shape constants (they
describe cuBLAS's tiling, not one GPU) and its own published best point.

Model: what distir charges for one GEMM kernel on the H100 preset (``distir.sim.cost``):
``launch + max(FLOPs / (peak × c × shape_factor(shape; REUSE_HALF, K_OVERHEAD)), bytes /
(bandwidth × memory_efficiency))`` with the preset's launch time (5 µs), bf16 peak, HBM bandwidth
and the cost model's default memory efficiency. The fit chooses ``REUSE_HALF``, ``K_OVERHEAD``
(a grid) and the ceiling ``c`` (a 1-D search per grid point) minimising the mean squared log
error of the time over all 375 points; it prints the fit, its residuals by size, the residuals of
the constants before the fit, and the ceiling the published best point (MAMF, the preset's
anchor) implies under the fitted constants, which is what distir uses. ``--table`` prints every
b = 1 point: measured and charged TFLOP/s.

Prints figures; asserts nothing (``tests/hardware/test_gemm.py`` checks the curve against the data).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
from dataclasses import fields
from pathlib import Path
from typing import NamedTuple

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

from distir.hardware import gemm  # noqa: E402
from distir.hardware.gemm import GemmShape, gemm_efficiency, shape_factor  # noqa: E402
from distir.hardware.presets import H100_SXM_80GB  # noqa: E402
from distir.hardware.specs import GemmProfile  # noqa: E402
from distir.ir.types import DType  # noqa: E402
from distir.sim.cost import RooflineCostModel  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "gemm_h100_bf16_xla.csv"
REUSE_GRID = (4.0, 8.0, 12.0, 16.0, 20.0, 24.0, 28.0, 32.0, 40.0, 48.0, 64.0, 96.0, 128.0)
K_GRID = (0.0, 32.0, 64.0, 96.0, 128.0, 160.0, 192.0, 224.0, 256.0, 320.0, 384.0, 512.0)
CEILINGS = np.arange(0.70, 1.0005, 0.0025)


class Point(NamedTuple):
    shape: GemmShape
    tflops: float

    @property
    def flops(self) -> float:
        s = self.shape
        return 2.0 * s.batch * s.m * s.n * s.k

    @property
    def seconds(self) -> float:
        return self.flops / (self.tflops * 1e12)


def load(path: Path = DATA) -> list[Point]:
    """The data file's points (``#`` lines are its header)."""
    with path.open() as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return [
            Point(GemmShape(int(r["b"]), int(r["m"]), int(r["n"]), int(r["k"])), float(r["tflops"]))
            for r in rows
        ]


class Device(NamedTuple):
    peak: float
    bandwidth: float
    launch: float
    profile: GemmProfile


def h100(profile: GemmProfile | None = None) -> Device:
    """The H100 preset as the cost model sees it (``profile``: another GEMM profile on it)."""
    d = H100_SXM_80GB
    assert d.gemm is not None
    mem_eff = {f.name: f.default for f in fields(RooflineCostModel)}["memory_efficiency"]
    assert isinstance(mem_eff, float)
    return Device(
        d.peak_flops(DType.bf16), d.memory_bandwidth * mem_eff, d.launch_overhead_s, profile or d.gemm
    )


BEFORE = GemmProfile(132, 792.1 / 989, (6144, 17920, 2816), "MAMF table v1 (the preset before the fit)")
"""The H100 profile before this fit: the MAMF point of mamf-finder v1, no cap."""


def _nbytes(p: Point) -> float:
    s = p.shape
    return 2.0 * s.batch * (s.m * s.k + s.k * s.n + s.m * s.n)


def charged(
    pts: list[Point], dev: Device, reuse_half: float, k_overhead: float, top: float | None = None
) -> np.ndarray:
    """distir's time for each point's kernel (``distir.sim.cost``: launch + roofline) with the
    curve's constants ``reuse_half``, ``k_overhead``; ``top``: a free ceiling, uncapped, instead
    of the profile's (through its published point, capped there when it is the sweep's best)."""
    if top is None:
        eff = np.array([gemm_efficiency(dev.profile, p.shape, False, reuse_half, k_overhead) for p in pts])
    else:
        eff = top * np.array([shape_factor(p.shape, dev.profile.sms, reuse_half, k_overhead) for p in pts])
    flops = np.array([p.flops for p in pts])
    nbytes = np.array([_nbytes(p) for p in pts])
    return dev.launch + np.maximum(flops / (dev.peak * eff), nbytes / dev.bandwidth)


class Fit(NamedTuple):
    reuse_half: float
    k_overhead: float
    ceiling: float
    rms: float


def fit(pts: list[Point], dev: Device, free: bool = False) -> Fit:
    """The grid point of least mean squared log error of the time, the curve through the
    profile's published point (``free``: with the ceiling fitted too, a 1-D search, uncapped)."""
    measured = np.log([p.seconds for p in pts])
    best = Fit(0.0, 0.0, 0.0, math.inf)
    for r in REUSE_GRID:
        for k in K_GRID:
            for c in CEILINGS if free else (None,):
                err = float(np.sqrt(np.mean((np.log(charged(pts, dev, r, k, c)) - measured) ** 2)))
                if err < best.rms:
                    top = c if c is not None else gemm.ceiling(dev.profile, False, r, k)
                    best = Fit(r, k, float(top), err)
    return best


def residuals(
    pts: list[Point], dev: Device, reuse_half: float, k_overhead: float, top: float | None = None
) -> np.ndarray:
    """log(charged / measured) per point: positive is a pessimistic (slower) charge."""
    res: np.ndarray = np.log(charged(pts, dev, reuse_half, k_overhead, top)) - np.log(
        [p.seconds for p in pts]
    )
    return res


def _summary(label: str, res: np.ndarray, pts: list[Point]) -> None:
    flops = np.array([p.flops for p in pts])
    print(
        f"{label}:\n    all {len(pts)}: rms {np.sqrt(np.mean(res**2)):.3f}, median {np.median(res):+.3f}, "
        f"max |{np.max(np.abs(res)):.3f}|"
    )
    for lo, hi in ((0, 2**30), (2**30, 2**33), (2**33, 2**36), (2**36, 2**40)):
        sel = (flops >= lo) & (flops < hi)
        if sel.any():
            r = res[sel]
            print(
                f"    {lo / 1e9:>6.1f}–{hi / 1e9:<7.1f} GFLOP ({sel.sum():3d} points): "
                f"median {np.median(r):+.3f}, "
                f"rms {np.sqrt(np.mean(r**2)):.3f}, min {r.min():+.3f}, max {r.max():+.3f}"
            )


def _table(pts: list[Point], dev: Device) -> None:
    print("\n  b     M     N     K   measured  distir  (TFLOP/s)  charged time vs measured")
    for p in pts:
        if p.shape.batch != 1:
            continue
        t = charged([p], dev, gemm.REUSE_HALF, gemm.K_OVERHEAD)[0]
        s = p.shape
        print(
            f"  {s.batch} {s.m:5d} {s.n:5d} {s.k:5d}   {p.tflops:7.1f}  {p.flops / t / 1e12:7.1f}"
            f"             {t / p.seconds - 1:+6.1%}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--table", action="store_true", help="print every b = 1 point")
    args = ap.parse_args()
    pts, dev = load(), h100()
    print(f"{len(pts)} H100 bf16 GEMM timings ({DATA.name}); charge = {dev.launch * 1e6:g} µs + roofline")
    old = h100(BEFORE)
    _summary(
        "before (REUSE_HALF 16, K_OVERHEAD 64, through MAMF v1 792.1 TFLOP/s, uncapped)",
        residuals(pts, old, 16.0, 64.0),
        pts,
    )
    free = fit(pts, dev, free=True)
    print(
        f"free fit (ceiling fitted, uncapped): REUSE_HALF {free.reuse_half:g}, "
        f"K_OVERHEAD {free.k_overhead:g}, "
        f"ceiling {free.ceiling:.4f} ({free.ceiling * dev.peak / 1e12:.0f} TFLOP/s), rms {free.rms:.3f}"
    )
    best = fit(pts, dev)
    print(
        f"fit through the preset's published point ({dev.profile.fraction * 989:.1f} TFLOP/s at "
        f"{'x'.join(map(str, dev.profile.anchor))}, capped there): REUSE_HALF {best.reuse_half:g}, "
        f"K_OVERHEAD {best.k_overhead:g} (ceiling {best.ceiling:.4f})"
    )
    r, k = gemm.REUSE_HALF, gemm.K_OVERHEAD
    _summary(f"distir (REUSE_HALF {r:g}, K_OVERHEAD {k:g}, the H100 preset)", residuals(pts, dev, r, k), pts)
    if args.table:
        _table(pts, dev)


if __name__ == "__main__":
    main()
