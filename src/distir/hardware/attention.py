"""Fused-attention throughput by shape: the fraction of a GPU's dense peak an attention kernel
reaches, from that kernel's published benchmark on that GPU.

A FlashAttention-style kernel's speed depends on the sequence length (short sequences leave
the tensor cores waiting on the softmax and on too few tiles), on the causal mask (blocks on
the diagonal do masked work, and the triangle balances worse over the SMs), and on the pass
(the backward recomputes the scores and accumulates dK/dV, so it runs slower than the forward).
Its FLOPs are counted as FlashAttention's benchmarks count them (``4·B·h·S²·d`` forward, halved
for causal; backward 2.5×), so the published TFLOP/s figures convert directly to a fraction of
the peak.

``AttentionProfile`` (in ``distir.hardware.specs``) holds a kernel's published points, TFLOP/s
by sequence length, for its forward and backward, causal and not. ``attention_efficiency``
interpolates them linearly in log₂(sequence length), holding the end values beyond the
measured range (a plateau at long sequences, the shortest measured speed below it). A curve
that was not published (a kernel's causal backward, often) is derived: the pass's non-causal
curve times the forward's causal/non-causal ratio at that length.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

from distir.hardware.specs import AttentionProfile, SeqPoints

# The fused-attention kernels the presets publish speeds of (``AttentionProfile.kernel``):
# FlashAttention-2 (flash-attn, PyTorch SDPA's flash backend), cuDNN's fused attention
# (Transformer Engine's FusedAttention, SDPA's cuDNN backend), and FlashAttention in Triton
# (flash-attn's flash_attn_triton.py, llm-foundry's ``attn_impl: triton``).
KERNELS: tuple[str, ...] = ("fa2", "cudnn", "fa-triton")


class FlashShape(NamedTuple):
    """One fused-attention call: ``batch`` sequences of ``seq`` queries over ``heads`` heads of
    ``head_dim``; ``causal`` masked; ``backward`` the gradient pass."""

    batch: int
    heads: int
    seq: int
    head_dim: int
    causal: bool
    backward: bool


def interpolate(points: SeqPoints, seq: int) -> float:
    """TFLOP/s at ``seq`` from published (sequence length, TFLOP/s) points: linear in
    log₂(seq) between points, the end values beyond them."""
    if seq <= points[0][0]:
        return points[0][1]
    if seq >= points[-1][0]:
        return points[-1][1]
    x = math.log2(seq)
    for (s0, t0), (s1, t1) in itertools.pairwise(points):
        if s0 <= seq <= s1:
            w = (x - math.log2(s0)) / (math.log2(s1) - math.log2(s0))
            return t0 + w * (t1 - t0)
    raise AssertionError("unreachable: points are sorted and seq lies within them")


def attention_tflops(profile: AttentionProfile, shape: FlashShape) -> float:
    """The kernel's TFLOP/s for ``shape`` (see the module docstring)."""
    seq = max(shape.seq, 1)
    if shape.backward:
        base = interpolate(profile.backward, seq)
        if not shape.causal:
            return base
        if profile.backward_causal is not None:
            return interpolate(profile.backward_causal, seq)
        return base * interpolate(profile.forward_causal, seq) / interpolate(profile.forward, seq)
    return interpolate(profile.forward_causal if shape.causal else profile.forward, seq)


def attention_efficiency(profile: AttentionProfile, shape: FlashShape) -> float:
    """Fraction of the dense 16-bit peak ``profile.peak_tflops`` the kernel reaches on
    ``shape``."""
    return min(1.0, attention_tflops(profile, shape) / profile.peak_tflops)
