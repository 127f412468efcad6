"""The screen's context-parallel figures (``distir.search.context_cost``): attention ops found in
the layers with their shapes, a layer's profile under a ring (closed forms), and a screened
context-parallel strategy against the same GPUs without it."""

from __future__ import annotations

import math

import pytest

from distir.frontends.zoo import build_model
from distir.frontends.zoo.registry import parse_model_string
from distir.hardware.cluster import parse_cluster
from distir.ir.types import DType
from distir.parallel.strategy import parse_strategy
from distir.search.context_cost import AttentionShape, Ring, attention_shapes, context_layer
from distir.search.profile import LayerProfile, Profiler
from distir.search.screen import Problem, Screen

LLAMA = "llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=128,vocab=128,seq=64"


def test_attention_shapes_are_the_blocks_attention_ops() -> None:
    m = build_model(LLAMA, batch=3)
    shapes = attention_shapes(m)
    assert len(shapes) == len(m.layers)
    found = [s for s in shapes if s]
    assert len(found) == 2  # one per block; embedding, head and loss have none
    (a,) = found[0]
    assert a == AttentionShape(batch=3, seq=64, heads=4, kv_heads=2, head_dim=16, itemsize=4, causal=True)


def _profile() -> LayerProfile:
    return LayerProfile(
        fwd_s=1.0,
        bwd_s=2.0,
        flops=9.0,
        weight_bytes=100.0,
        n_weights=3,
        saved_bytes=64.0,
        out_bytes=32.0,
        work_bytes=16.0,
        carried_bytes=8.0,
    )


ATTN = AttentionShape(batch=2, seq=4096, heads=8, kv_heads=2, head_dim=64, itemsize=2, causal=True)


def test_a_free_ring_divides_everything_but_the_weights_by_c() -> None:
    c = 4
    got = context_layer(_profile(), [ATTN], t=2, c=c, ring=Ring(0.0, 0.0, 1e15))
    kv = 2.0 * 2 * (4096 / c) * (2 / 2) * 64 * 2  # K and V of a rank: its tokens, its kv head
    assert (got.fwd_s, got.flops, got.saved_bytes, got.out_bytes) == (1.0 / c, 9.0 / c, 16.0, 8.0)
    assert got.carried_bytes == 2.0 and (got.weight_bytes, got.n_weights) == (100.0, 3)
    assert got.work_bytes == pytest.approx(16.0 / c + 4 * kv)
    assert got.bwd_s == pytest.approx(2.0 / c)  # the last dK/dV hop costs nothing on a free ring


def test_a_slow_ring_shows_what_attention_does_not_hide() -> None:
    c, t = 4, 1
    ring = Ring(latency_s=1e-5, s_per_byte=1e-8, peak_flops=1e12)
    got = context_layer(_profile(), [ATTN], t=t, c=c, ring=ring)
    kv = 2.0 * 2 * (4096 / c) * 2 * 64 * 2
    t_kv = 1e-5 + kv * 1e-8
    # FlashAttention-2's causal forward: 4·B·h·S²·d / 2, a rank's 1/c of it, a step's 1/c of that
    a_f = 4 * 2 * 8 * 4096**2 * 64 / 2 / c / 1e12
    fwd = 1.0 / c + (c - 1) * max(0.0, t_kv - a_f / c)
    bwd = 2.0 / c + (c - 1) * max(0.0, 2 * t_kv - 2.5 * a_f / c) + t_kv
    assert got.fwd_s == pytest.approx(fwd) and got.bwd_s == pytest.approx(bwd)
    assert got.fwd_s > 1.0 / c  # this ring is slower than the attention it overlaps


def test_a_context_parallel_strategy_keeps_a_cth_of_the_activations() -> None:
    """On one 8-GPU node: c = 4 (one replica) against d = 4 (four replicas, a quarter of the
    batch each: the same tokens per GPU) and against one replica alone. Without ZeRO all keep
    the whole weights; c = 4 keeps a quarter of each sequence, d = 4 a quarter of the samples, so
    their peaks are alike and below the lone replica's; c = 4 computes a quarter of the lone
    replica's microbatch, plus what the ring does not hide."""
    model = "llama:layers=2,hidden=256,heads=4,kv_heads=2,ffn=512,vocab=512,seq=8192"
    prof = Profiler(parse_model_string(model), parse_cluster("h100"), DType.bf16)
    screen = Screen(prof, Problem(4))
    cp = screen.estimate(parse_strategy("d1.t2.c4.p1.k1.1f1b"))
    dp = screen.estimate(parse_strategy("d4.t2.p1.k1.1f1b"))
    one = screen.estimate(parse_strategy("d1.t2.p1.k1.1f1b"))
    assert cp.fits and dp.fits and one.fits
    assert cp.peak_memory_bytes == pytest.approx(dp.peak_memory_bytes, rel=0.1)
    assert cp.peak_memory_bytes < one.peak_memory_bytes
    assert one.compute_s / 4 <= cp.compute_s < one.compute_s
    # the gradients are reduced over the 4 context ranks, as over 4 replicas
    assert math.isclose(cp.sync_s, dp.sync_s, rel_tol=1e-9)
