"""Ring attention (``distir.parallel.context``): equal to the sequential Attention /
AttentionGrad on the reference executor, memory per GPU falling ~1/c, Sends overlapping the
attention blocks in the simulated step."""

from __future__ import annotations

import numpy as np
import pytest

import distir
from distir.frontends.zoo import build_model
from distir.hardware.cluster import Cluster
from distir.hardware.specs import DeviceSpec, LinkSpec, NodeSpec
from distir.interp.reference import run_reference
from distir.ir.builder import FunctionBuilder
from distir.ir.function import Module
from distir.ir.types import Device, DType, TensorType
from distir.ops.attention import attention_grad_reference, attention_reference
from distir.parallel.context import (
    RingShape,
    balanced_positions,
    block_kind,
    ring_attention,
    ring_blocks,
    ring_device_map,
    shard_sequence,
    torch_ring_call,
    torch_ring_time,
    unshard_sequence,
)
from distir.parallel.distribute import distribute
from distir.parallel.strategy import StrategyError, parse_strategy
from distir.sim.simulate import simulate


def test_balanced_layout_gives_each_rank_chunks_i_and_2c_minus_1_minus_i() -> None:
    assert list(balanced_positions(8, 2, 0)) == [0, 1, 6, 7]
    assert list(balanced_positions(8, 2, 1)) == [2, 3, 4, 5]
    x = np.arange(24).reshape(2, 12)
    parts = shard_sequence(x, 3, dim=1)
    assert [list(p[0]) for p in parts] == [[0, 1, 10, 11], [2, 3, 8, 9], [4, 5, 6, 7]]
    assert np.array_equal(unshard_sequence(parts, dim=1), x)
    with pytest.raises(StrategyError, match="2c = 4 equal chunks"):
        balanced_positions(6, 2, 0)


def test_block_kinds_cover_the_causal_mask_exactly_once() -> None:
    c = 3
    seq = 2 * c
    seen = np.zeros((seq, seq), dtype=int)  # chunk-level visibility, one position per chunk
    for a in range(seq):
        for b in range(seq):
            kind = block_kind(a, b, causal=True)
            seen[a, b] = kind is not None
            assert (kind == "diag") == (a == b)
    assert np.array_equal(seen, np.tril(np.ones((seq, seq), dtype=int)))
    assert block_kind(0, 5, causal=False) == "full"


def _run(shape: RingShape, c: int, seed: int = 0, streams: bool = False):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    b, s, h, hk, d = shape.batch, shape.seq, shape.heads, shape.kv_heads, shape.head_dim
    q, do = rng.standard_normal((b, s, h, d)), rng.standard_normal((b, s, h, d))
    k, v = rng.standard_normal((b, s, hk, d)), rng.standard_normal((b, s, hk, d))
    m = ring_attention(shape, c, comm_streams=streams)
    pieces = [shard_sequence(x, c, 1) for x in (q, k, v, do)]
    args = [half for r in range(c) for i in range(4) for half in np.split(pieces[i][r], 2, axis=1)]
    outs = run_reference(m, args)
    per = [outs[10 * r : 10 * r + 10] for r in range(c)]  # out, lse, dq, dk, dv: two chunks each
    got = {
        name: unshard_sequence([np.concatenate(p[2 * i : 2 * i + 2], axis=dim) for p in per], dim)
        for i, (name, dim) in enumerate((("out", 1), ("lse", 2), ("dq", 1), ("dk", 1), ("dv", 1)))
    }
    out, lse = attention_reference(q, k, v, causal=shape.causal)
    dq, dk, dv = attention_grad_reference(do, q, k, v, out, lse, causal=shape.causal, scale=d**-0.5)
    want = {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}
    return got, want


@pytest.mark.parametrize("c", [2, 3, 4])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("streams", [False, True])
def test_ring_attention_equals_attention_forward_and_backward(c: int, causal: bool, streams: bool) -> None:
    shape = RingShape(batch=2, seq=4 * c, heads=4, head_dim=3, kv_heads=2, causal=causal)
    got, want = _run(shape, c, streams=streams)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-10, atol=1e-12, err_msg=name)


def _cluster(gpus: int) -> Cluster:
    dev = DeviceSpec("x", 1e12, 1e12, 1e12, 1e12, 1e12, 1 << 40, 0.0)
    return Cluster("ring", (NodeSpec("n", dev, gpus, LinkSpec(2e11, 1e-6), LinkSpec(1e10, 1e-5)),))


def _sequential(shape: RingShape) -> Module:
    """Attention and its gradient on one device: the c = 1 baseline."""
    fb = FunctionBuilder("sequential")
    q = TensorType(shape.dtype, (shape.batch, shape.seq, shape.heads, shape.head_dim), Device(0))
    k = TensorType(shape.dtype, (shape.batch, shape.seq, shape.kv_heads, shape.head_dim), Device(0))
    qv, kv, vv, dov = (fb.param(n, t) for n, t in (("q", q), ("k", k), ("v", k), ("dout", q)))
    o, lse = fb.op("Attention", qv, kv, vv, names=["o", "lse"], causal=shape.causal)
    g = fb.op("AttentionGrad", dov, qv, kv, vv, o, lse, names=["dq", "dk", "dv"], causal=shape.causal)
    return distir.check(Module((fb.ret(o, lse, *g),)))


def test_activation_memory_per_gpu_falls_about_1_over_c() -> None:
    """Each rank holds 1/c of q, k, v, dout and of the results, plus the ring's buffers (the K/V
    chunks received, the travelling dK/dV) — also 1/c of the whole: the peak falls ~1/c."""
    shape = RingShape(batch=1, seq=1024, heads=8, head_dim=64, kv_heads=8, dtype=DType.f32)
    peaks = {1: max(simulate(_sequential(shape), _cluster(1)).peak_memory.values())}
    for c in (2, 4, 8):
        r = simulate(ring_attention(shape, c), _cluster(c), ring_device_map(c, False))
        peaks[c] = max(r.peak_memory.values())
    assert peaks[2] < peaks[1]
    for c in (4, 8):
        assert 0.45 < peaks[c] / peaks[c // 2] < 0.6, peaks
    assert peaks[8] < peaks[1] / 4


def test_ring_sends_overlap_the_attention_blocks() -> None:
    c = 4
    shape = RingShape(batch=1, seq=4096, heads=8, head_dim=64, kv_heads=8, dtype=DType.f32)
    cl = _cluster(c)
    ov = simulate(ring_attention(shape, c, True), cl, ring_device_map(c, True), trace=True)
    blocking = simulate(ring_attention(shape, c, False), cl, ring_device_map(c, False))
    assert ov.step_time_s < blocking.step_time_s
    slices = ov.slices or []
    sends = [(s, e) for n, s, e, slot, _ in slices if n == "Send" and e > s]
    attn = [(s, e) for n, s, e, slot, _ in slices if n == "Attention"]
    assert sends and any(s < ae and as_ < e for s, e in sends for as_, ae in attn)


def test_distribute_refuses_what_context_parallelism_does_not_combine_with_by_name() -> None:
    """``distribute`` builds c > 1 (``tests/parallel/test_context_distribute.py``); what it does
    not combine with yet is refused naming it."""
    model = build_model("gpt:layers=1,hidden=8,heads=2,seq=8,vocab=16", batch=4)
    with pytest.raises(
        StrategyError, match=r"context parallelism \(c=2\) does not combine with uneven batch"
    ):
        distribute(model, parse_strategy("d2.t1.c2.p1.k1.b1-3"))


def _call_pairs(call: tuple[int, int, bool]) -> set[tuple[int, int]]:
    """The (query chunk, key chunk) pairs a torch call on the rank's concatenated chunks covers:
    q_chunks = 1 is the second query chunk, k_chunks = 1 the first key chunk; a causal call on
    both chunks leaves out the first query chunk against the second key chunk (later positions)."""
    qn, kn, causal = call
    qs = (0, 1) if qn == 2 else (1,)
    ks = (0, 1) if kn == 2 else (0,)
    return {(x, y) for x in qs for y in ks if not (causal and x < y)}


@pytest.mark.parametrize("c", [2, 3, 4, 8])
@pytest.mark.parametrize("causal", [True, False])
def test_torch_calls_cover_the_ring_blocks_exactly(c: int, causal: bool) -> None:
    """Torch's one call per step (``_templated_ring_attention``'s load-balanced branches) covers
    the same (query chunk, key chunk) blocks as the ring's blocks, every rank at every step."""
    for r in range(c):
        for s in range(c):
            want = {(x, y) for x, y, _d in ring_blocks(c, r, s, causal)}
            assert _call_pairs(torch_ring_call(c, r, s, causal)) == want, (c, r, s)


def test_torch_ring_time_overlaps_eager_and_waits_compiled() -> None:
    """Eager, the all-gather hides behind step 0 and each dK/dV hop behind the next step's
    kernel; compiled, every collective is waited where issued (hand counts)."""
    steps, g, h = [5.0, 4.0, 4.0], 3.0, 1.0
    assert torch_ring_time(steps, g, h, False, False) == 5.0 + 8.0
    assert torch_ring_time(steps, 9.0, h, False, False) == 9.0 + 8.0
    assert torch_ring_time(steps, g, h, True, False) == 5.0 + 8.0 + 1.0
    assert torch_ring_time(steps, g, 6.0, True, False) == 5.0 + 12.0 + 6.0
    assert torch_ring_time(steps, g, h, False, True) == 3.0 + 13.0
    assert torch_ring_time(steps, g, h, True, True) == 3.0 + 13.0 + 3 * 1.0
