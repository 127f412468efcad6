"""Matrix-product throughput by shape: the fraction of a GPU's dense peak a GEMM reaches.

A pure function of the GPU's ``GemmProfile`` and the product's shape: ``batch`` independent
(M×K)·(K×N) products (a strided-batched GEMM; batch 1 for a plain one).

The model follows NVIDIA's "Matrix Multiplication Background User's Guide" (DU-09799-001,
https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/): cuBLAS
divides the M×N output into tiles, one thread block each, every block stepping through K, and
picks a tile among ``TILES`` (the guide's §2.3 list). Per candidate tile (Tm, Tn):

- tile quantization (§3.1): a dimension that is not a multiple of the tile pads its last tile,
  so only ``M·N / (⌈M/Tm⌉Tm · ⌈N/Tn⌉Tn)`` of the work done is useful;
- wave quantization (§3.2): tiles run in waves of one per SM; a partial last wave leaves SMs
  idle: ``tiles / (⌈tiles/SMs⌉ · SMs)``;
- data reuse (§2.3: larger tiles are more efficient): a tile's arithmetic intensity
  ``I = Tm·Tn/(Tm+Tn)`` (FLOPs per element loaded, up to a constant), saturating as
  ``I / (I + REUSE_HALF)`` relative to the largest tile's;
- the K loop: a fixed prologue/epilogue per tile (filling the pipeline, writing C), as if
  ``K_OVERHEAD`` more steps of K ran: ``K / (K + K_OVERHEAD)``.

The tile kept is the one with the best product of these factors (cuBLAS's heuristic picks one
for the shape; the best is what a well-tuned library approaches). The form is the guide's;
``REUSE_HALF`` and ``K_OVERHEAD`` are fitted to measured kernel times: XLA's default matmul
performance table for H100 (``sm_90``, bf16; 375 batched products with M, N, K from 256 to 4096,
median CUPTI kernel times; ``bench/data/gemm_h100_bf16_xla.csv``), by least squares on the log of
the time the cost model charges (launch + roofline, the curve through the H100's published
point, capped there), ``bench/fit_gemm.py``, which prints the fit and its residuals. No such
table was found for other GPUs; they take the same constants (they describe cuBLAS's tiling).

Calibration: the efficiency is ``ceiling × factor(shape)``, with ``ceiling`` chosen so that the
curve passes through the profile's anchor, a published benchmark point (``GemmProfile.anchor``,
``fraction``, ``source``). So a large, well-shaped GEMM gets the published efficiency, and small
or skinny ones fall below it. The ceiling never exceeds 1. When the anchor is the best point of
a sweep over shapes (``GemmProfile.anchor_is_max``: the MAMF table's A100 and H100 rows), no
shape runs faster than it: the curve is capped at the published fraction (the factor form alone
would rise a few percent above it for K far beyond the anchor's, which the sweep did not see).

Memory-bound products (a GEMV, a skinny product) are not this function's business: the cost
model takes the larger of the compute time (FLOPs over peak × this efficiency) and the memory
time (bytes over bandwidth), the roofline.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

from distir.hardware.specs import GemmProfile

TILES: tuple[tuple[int, int], ...] = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))
"""cuBLAS's typical tile shapes (Tm, Tn), from the guide's §2.3."""

REUSE_HALF = 16.0
"""Tile arithmetic intensity at which a tile reaches half its asymptotic rate (fitted, with
``K_OVERHEAD``, to XLA's measured H100 bf16 table of 375 GEMMs: ``bench/fit_gemm.py``)."""

K_OVERHEAD = 128.0
"""A tile's fixed prologue/epilogue, in equivalent K steps (fitted with ``REUSE_HALF``)."""


class GemmShape(NamedTuple):
    """``batch`` products of an (M×K) by a (K×N) matrix."""

    batch: int
    m: int
    n: int
    k: int


def _reuse(tm: int, tn: int, reuse_half: float = REUSE_HALF) -> float:
    intensity = tm * tn / (tm + tn)
    return intensity / (intensity + reuse_half)


@functools.cache
def _best_reuse(reuse_half: float) -> float:
    return max(_reuse(tm, tn, reuse_half) for tm, tn in TILES)


def tile_factor(shape: GemmShape, sms: int, tile: tuple[int, int], reuse_half: float = REUSE_HALF) -> float:
    """Useful fraction of the work on tile ``tile``: tile and wave quantization, data reuse."""
    tm, tn = tile
    rows, cols = math.ceil(shape.m / tm), math.ceil(shape.n / tn)
    useful = (shape.m * shape.n) / (rows * tm * cols * tn)
    tiles = rows * cols * shape.batch
    waves = math.ceil(tiles / sms)
    reuse = _reuse(tm, tn, reuse_half) / _best_reuse(reuse_half)
    return useful * (tiles / (waves * sms)) * reuse


def shape_factor(
    shape: GemmShape, sms: int, reuse_half: float = REUSE_HALF, k_overhead: float = K_OVERHEAD
) -> float:
    """The best tile's factor times the K loop's: in (0, 1], 1 only in the limit. ``reuse_half``
    and ``k_overhead`` default to the module's fitted constants (a fit passes its own)."""
    best = max(tile_factor(shape, sms, t, reuse_half) for t in TILES)
    return best * shape.k / (shape.k + k_overhead)


def _fraction(profile: GemmProfile, fp32: bool) -> float:
    return profile.fp32_fraction if fp32 and profile.fp32_fraction is not None else profile.fraction


def ceiling(
    profile: GemmProfile, fp32: bool = False, reuse_half: float = REUSE_HALF, k_overhead: float = K_OVERHEAD
) -> float:
    """The curve's asymptote: the anchor's published fraction over the anchor's shape factor, at
    most 1 (a profile whose anchor is the best of a sweep caps the curve at that fraction)."""
    m, n, k = profile.anchor
    factor = shape_factor(GemmShape(1, m, n, k), profile.sms, reuse_half, k_overhead)
    return min(1.0, _fraction(profile, fp32) / factor)


def gemm_efficiency(
    profile: GemmProfile,
    shape: GemmShape,
    fp32: bool = False,
    reuse_half: float = REUSE_HALF,
    k_overhead: float = K_OVERHEAD,
) -> float:
    """Fraction of the dense peak a GEMM of ``shape`` reaches (``fp32``: on the CUDA cores,
    else on the tensor cores): the ceiling times the shape factor, at most the published
    fraction when the anchor is the best point of a sweep (``GemmProfile.anchor_is_max``). An
    empty product (a zero dimension) returns the curve's maximum."""
    top = ceiling(profile, fp32, reuse_half, k_overhead)
    cap = _fraction(profile, fp32) if profile.anchor_is_max else 1.0
    if min(shape) <= 0:
        return min(top, cap)
    return min(top * shape_factor(shape, profile.sms, reuse_half, k_overhead), cap)
