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
for the shape; the best is what a well-tuned library approaches). ``REUSE_HALF`` and
``K_OVERHEAD`` are estimates (not from a table); everything else is from the guide.

Calibration: the efficiency is ``ceiling × factor(shape)``, with ``ceiling`` chosen so that the
curve passes through the profile's anchor, a published benchmark point (``GemmProfile.anchor``,
``fraction``, ``source``). So a large, well-shaped GEMM gets the published efficiency, and small
or skinny ones fall below it. The ceiling never exceeds 1.

Memory-bound products (a GEMV, a skinny product) are not this function's business: the cost
model takes the larger of the compute time (FLOPs over peak × this efficiency) and the memory
time (bytes over bandwidth), the roofline.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from distir.hardware.specs import GemmProfile

TILES: tuple[tuple[int, int], ...] = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))
"""cuBLAS's typical tile shapes (Tm, Tn), from the guide's §2.3."""

REUSE_HALF = 16.0
"""Tile arithmetic intensity at which a tile reaches half its asymptotic rate (estimate)."""

K_OVERHEAD = 64.0
"""A tile's fixed prologue/epilogue, in equivalent K steps (estimate)."""


class GemmShape(NamedTuple):
    """``batch`` products of an (M×K) by a (K×N) matrix."""

    batch: int
    m: int
    n: int
    k: int


def _reuse(tm: int, tn: int) -> float:
    intensity = tm * tn / (tm + tn)
    return intensity / (intensity + REUSE_HALF)


_BEST_REUSE = max(_reuse(tm, tn) for tm, tn in TILES)


def tile_factor(shape: GemmShape, sms: int, tile: tuple[int, int]) -> float:
    """Useful fraction of the work on tile ``tile``: tile and wave quantization, data reuse."""
    tm, tn = tile
    rows, cols = math.ceil(shape.m / tm), math.ceil(shape.n / tn)
    useful = (shape.m * shape.n) / (rows * tm * cols * tn)
    tiles = rows * cols * shape.batch
    waves = math.ceil(tiles / sms)
    return useful * (tiles / (waves * sms)) * (_reuse(tm, tn) / _BEST_REUSE)


def shape_factor(shape: GemmShape, sms: int) -> float:
    """The best tile's factor times the K loop's: in (0, 1], 1 only in the limit."""
    best = max(tile_factor(shape, sms, t) for t in TILES)
    return best * shape.k / (shape.k + K_OVERHEAD)


def ceiling(profile: GemmProfile, fp32: bool = False) -> float:
    """The largest efficiency any shape reaches (the curve's asymptote): the anchor's published
    fraction over the anchor's shape factor, at most 1."""
    frac = profile.fp32_fraction if fp32 and profile.fp32_fraction is not None else profile.fraction
    m, n, k = profile.anchor
    return min(1.0, frac / shape_factor(GemmShape(1, m, n, k), profile.sms))


def gemm_efficiency(profile: GemmProfile, shape: GemmShape, fp32: bool = False) -> float:
    """Fraction of the dense peak a GEMM of ``shape`` reaches (``fp32``: on the CUDA cores,
    else on the tensor cores). An empty product (a zero dimension) returns the ceiling."""
    if min(shape) <= 0:
        return ceiling(profile, fp32)
    return ceiling(profile, fp32) * shape_factor(shape, profile.sms)
