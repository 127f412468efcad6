"""Ring attention on DTensors (``distir.sim.ring``): one attention op split along the sequence
over a ``cp`` axis as a ring is timed step by step, each step the longer of its blocks and its
transfer. Oracles: hand counts under fixed costs (every block, merge and add a known time,
every send a known time), in both regimes — compute-bound (the transfers hidden) and
transfer-bound (the blocks hidden) — and the flops of the whole sequence's attention; torch's
ring (``ring_form = "torch"``) likewise, eager and compiled."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

import distir
from distir.hardware.cluster import parse_cluster
from distir.ir import DType, FunctionBuilder, Module
from distir.ir.dtensor import DTensorType, Mesh, Shard
from distir.ir.types import Type
from distir.ir.values import Attrs
from distir.ops.attention import forward_flops
from distir.ops.registry import OpDef
from distir.sim.cost import FixedCostModel, RooflineCostModel
from distir.sim.simulate import simulate

H100 = parse_cluster("h100")
B, S, H, D = 1, 64, 2, 8
A, G, M, X = 10.0, 25.0, 1.0, 0.5  # seconds: an Attention block, its gradient, a merge, an add


def ring_program(c: int, backward: bool) -> Module:
    """Attention (or its gradient) over S positions in the balanced order, split over cp = c."""
    mesh = Mesh.parse(f"cp={c}")
    s1 = (Shard(1),)
    qt = DTensorType(DType.bf16, (B, S, H, D), mesh, s1)
    pt = DTensorType(DType.i64, (B, S), mesh, s1)
    lt = DTensorType(DType.f32, (B, H, S), mesh, (Shard(2),))
    fb = FunctionBuilder("f")
    q, k, v = (fb.param(n, qt) for n in "qkv")
    pos = fb.param("pos", pt)
    if not backward:
        outs = fb.op("Attention", q, k, v, pos, pos, names=["o", "lse"], causal=True, ring=c)
    else:
        dout, out = fb.param("dout", qt), fb.param("out", qt)
        lse = fb.param("lse", lt)
        outs = fb.op(
            "AttentionGrad", dout, q, k, v, out, lse, pos, pos, names=["dq", "dk", "dv"], causal=True, ring=c
        )
    return distir.check(Module((fb.ret(*outs),)))


def fixed(comm: float) -> FixedCostModel:
    return FixedCostModel(
        compute=0.0, comm=comm, by_op={"Attention": A, "AttentionGrad": G, "AttentionMerge": M, "Add": X}
    )


def forward_steps(c: int) -> list[float]:
    """Rank 0's blocks at each step, counted by hand from the layout (chunks 0 and 2c−1): step
    0, its own K/V: 2 diagonal blocks and chunk 2c−1 against chunk 0, and one merge (chunk
    2c−1's second block); each later step, the K/V of a rank j > 0 (chunks j, 2c−1−j): only
    chunk 2c−1 sees them, 2 full blocks, each merged."""
    return [3 * A + M] + [2 * (A + M)] * (c - 1)


def backward_steps(c: int) -> list[float]:
    """Likewise backward: step 0, 3 blocks, one dQ add (chunk 2c−1's second block) and one dK,
    dV add each (key chunk 0 gets 2 blocks); later, 2 blocks on one query chunk (2 dQ adds, as
    its accumulator exists), 2 key chunks hit once each (no in-step add) plus the arrived dK/dV
    added to each (4 adds)."""
    return [3 * G + X + 2 * X] + [2 * G + 2 * X + 4 * X] * (c - 1)


@pytest.mark.parametrize("c", [2, 4])
def test_a_compute_bound_ring_hides_its_transfers(c: int) -> None:
    t = 0.1  # a transfer, far below a step's blocks
    fwd = simulate(ring_program(c, False), H100, cost_model=fixed(t)).step_time_s
    assert math.isclose(fwd, sum(forward_steps(c)), rel_tol=1e-12)
    bwd = simulate(ring_program(c, True), H100, cost_model=fixed(t)).step_time_s
    assert math.isclose(bwd, sum(backward_steps(c)) + t, rel_tol=1e-12)  # + the last dK/dV hop


@pytest.mark.parametrize("c", [2, 4])
def test_a_transfer_bound_ring_hides_its_blocks(c: int) -> None:
    t = 1000.0  # a transfer, far above a step's blocks
    fwd = simulate(ring_program(c, False), H100, cost_model=fixed(t)).step_time_s
    assert math.isclose(fwd, (c - 1) * t + forward_steps(c)[-1], rel_tol=1e-12)
    bwd = simulate(ring_program(c, True), H100, cost_model=fixed(t)).step_time_s
    # K/V travel c−1 times and dK/dV c times; a middle step carries both, one after the other
    want = t + 2 * t * (c - 2) + max(backward_steps(c)[-1], t) + t
    assert math.isclose(bwd, want, rel_tol=1e-12)


@pytest.mark.parametrize("c", [2, 4])
def test_the_ring_counts_the_flops_of_the_causal_triangle(c: int) -> None:
    """Blocks above the diagonal are skipped and diagonal ones are causal: the ring's FLOPs are
    exactly FlashAttention's causal count of the whole sequence."""
    r = simulate(ring_program(c, False), H100)
    assert math.isclose(r.flops, forward_flops(B, S, H, D, True), rel_tol=1e-12)


C = 0.25  # seconds: a cast to or from fp32
K = 0.0625  # seconds: a torch.cat's pass over one tensor


@dataclass(frozen=True)
class TorchFixed(FixedCostModel):
    """Fixed costs under torch's ring; ``fuse``: compiled (collectives waited where issued)."""

    ring_form: str = "torch"
    fuse: bool = False


def torch_fixed(comm: float, fuse: bool) -> TorchFixed:
    by_op = {"Attention": A, "AttentionGrad": G, "AttentionMerge": M, "Add": X, "Cast": C, "Concat": K}
    return TorchFixed(compute=0.0, comm=comm, by_op=by_op, fuse=fuse)


def torch_steps(c: int, backward: bool, fuse: bool) -> list[float]:
    """Per step, the slowest rank's work in _templated_ring_attention (torch 2.6.0,
    torch/distributed/tensor/experimental/_attention.py) and its backward, one call a step.
    Forward: the out cast to fp32 at step 0, a merge from step 1 on, the cast back at the last;
    the K/V concatenated for the rotater (``torch.cat([key.flatten(), value.flatten()])``, two
    tensors) at step 0, eager at every step but the last (compiled, the unused ones are dead);
    ranks r < s merge into their second chunk (``partial``) and ``_partial_update`` concatenates
    the fp32 out and lse (two tensors). Backward: three fp32 adds (dQ, dK, dV) a step and three
    casts back at the last; the K/V concatenated as forward; eager, the dK/dV concatenated for the
    next rank every step (two tensors); from step 1 on ranks r ≥ s update the first chunk of dK
    and of dV (two ``_partial_update``s), ranks r < s the second of dQ (one)."""
    send = 2 * K
    dkv = 0.0 if fuse else 2 * K  # eager: torch.cat([grad_key.flatten(), grad_value.flatten()])
    if backward:
        steps = [G + 3 * X + send + dkv]
        for s in range(1, c):
            steps.append(G + 3 * X + (send if not fuse and s < c - 1 else 0.0) + dkv + 2 * K)
        steps[-1] += 3 * C
        return steps
    steps = [A + C + send]
    for s in range(1, c):
        steps.append(A + M + (send if not fuse and s < c - 1 else 0.0) + 2 * K)
    steps[-1] += C
    return steps


@pytest.mark.parametrize("c", [2, 4])
@pytest.mark.parametrize("fuse", [False, True])
def test_torch_ring_is_timed_as_torch_runs_it(c: int, fuse: bool) -> None:
    t = 0.1  # a collective: the all-gather of the K/V, a hop of the dK/dV
    fwd = simulate(ring_program(c, False), H100, cost_model=torch_fixed(t, fuse)).step_time_s
    bwd = simulate(ring_program(c, True), H100, cost_model=torch_fixed(t, fuse)).step_time_s
    f, b = torch_steps(c, False, fuse), torch_steps(c, True, fuse)
    if fuse:  # compiled: nothing overlaps
        assert math.isclose(fwd, t + sum(f), rel_tol=1e-12)
        assert math.isclose(bwd, t + sum(b) + c * t, rel_tol=1e-12)
    else:  # eager: the transfers hide behind the kernels, but the last dK/dV hop
        assert math.isclose(fwd, sum(f), rel_tol=1e-12)
        assert math.isclose(bwd, sum(b) + t, rel_tol=1e-12)


U = 1e-3  # seconds a byte a torch.cat writes


@dataclass(frozen=True)
class TorchBytes(TorchFixed):
    """``TorchFixed`` with each ``Concat`` costing ``U`` seconds a byte it writes."""

    def compute_time(
        self, opdef: OpDef, ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, gpu: int
    ) -> float:
        if opdef.name == "Concat":
            return U * sum(t.nbytes for t in outs)
        return super().compute_time(opdef, ins, outs, attrs, gpu)


@pytest.mark.parametrize("fuse", [False, True])
def test_torch_rings_copies_are_the_chunks_torch_cat_writes(fuse: bool) -> None:
    """The bytes of torch's ring's copies (``torch_steps``), c = 4: a rank's two chunks of 8
    positions, 2 heads of 8; the K/V for the rotater 2 × 512 B (bf16); a partial update's
    pass compiled over the unchanged chunk, 512 B of fp32 out (with its lse, 64 B) or of dQ, dK,
    dV, eager over both (1,024 B; the lse 128 B); eager, the fp32 dK/dV sent, 2 × 1,024 B."""
    c, t = 4, 0.1
    by_op = {"Attention": A, "AttentionGrad": G, "AttentionMerge": M, "Add": X, "Cast": C}
    cm = TorchBytes(compute=0.0, comm=t, by_op=by_op, fuse=fuse)
    kv = 1024 * U
    part, grad = (576 * U, 512 * U) if fuse else (1152 * U, 1024 * U)
    send = 0.0 if fuse else kv  # eager, the K/V concatenated at steps 1 … c − 2 as at step 0
    dkv = 0.0 if fuse else 2048 * U
    fwd = [A + C + kv, A + M + send + part, A + M + send + part, A + M + part + C]
    bwd = [G + 3 * X + kv + dkv, *[G + 3 * X + send + dkv + 2 * grad] * 2, G + 3 * X + dkv + 2 * grad + 3 * C]
    got_f = simulate(ring_program(c, False), H100, cost_model=cm).step_time_s
    got_b = simulate(ring_program(c, True), H100, cost_model=cm).step_time_s
    if fuse:
        assert math.isclose(got_f, t + sum(fwd), rel_tol=1e-12)
        assert math.isclose(got_b, t + sum(bwd) + c * t, rel_tol=1e-12)
    else:
        assert math.isclose(got_f, sum(fwd), rel_tol=1e-12)
        assert math.isclose(got_b, sum(bwd) + t, rel_tol=1e-12)


@pytest.mark.parametrize("c", [2, 4])
def test_torch_ring_counts_the_flops_of_the_causal_triangle(c: int) -> None:
    r = simulate(ring_program(c, False), H100, cost_model=RooflineCostModel(H100, ring_form="torch"))
    assert math.isclose(r.flops, forward_flops(B, S, H, D, True), rel_tol=1e-12)


@pytest.mark.parametrize("backward", [False, True])
def test_torch_ring_holds_the_gathered_kv_and_fp32_accumulators(backward: bool) -> None:
    """Beside the results, at the fullest step: forward, c × a rank's K/V (gathered), the running
    fp32 out, the merged one made beside it and the step's bf16 out; backward, the gathered K/V,
    the fp32 dQ, dK/dV, the dK/dV sent and received in fp32 and the step's bf16 dQ, dK, dV. The
    p2p ring holds 2 × K/V forward, 4 × backward. Oracle: the peaks' difference, counted by hand
    (plus the device's allocator fragmentation on it, its spec's ``runtime.fragmentation``)."""
    c = 4
    p2p = simulate(ring_program(c, backward), H100, cost_model=RooflineCostModel(H100))
    tor = simulate(ring_program(c, backward), H100, cost_model=RooflineCostModel(H100, ring_form="torch"))
    piece = B * (S // c) * H * D * 2  # a rank's q (and K, V) in bf16
    kv = 2 * piece
    if backward:
        torch_extra = c * kv + 2 * piece + 3 * 2 * kv + piece + kv
        p2p_extra = 4 * kv
    else:
        torch_extra = c * kv + 2 * 2 * piece + piece
        p2p_extra = 2 * kv
    want = (torch_extra - p2p_extra) * (1.0 + H100.device_spec(0).runtime.fragmentation)
    assert math.isclose(tor.peak_memory[0] - p2p.peak_memory[0], want, abs_tol=1e-3)


@pytest.mark.parametrize("backward", [False, True])
def test_the_allocator_replays_torch_rings_buffers_as_separate_blocks(
    backward: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caching allocator is asked for each of torch's ring's tensors on its own (the gathered
    K/V, each fp32 accumulator, the step's flash results), not one block of their sum."""
    from distir.sim import segments

    asked: list[int] = []
    malloc = segments.CachingAllocator.malloc

    def record(self: segments.CachingAllocator, stream: str, size: float) -> segments.Block:
        asked.append(int(size))
        return malloc(self, stream, size)

    monkeypatch.setattr(segments.CachingAllocator, "malloc", record)
    c = 4
    simulate(
        ring_program(c, backward), H100, cost_model=RooflineCostModel(H100, ring_form="torch"), allocator=True
    )
    piece = B * (S // c) * H * D * 2  # 512 B: a rank's q in bf16, one block
    kv = 2 * piece
    want = (
        [c * kv, 2 * piece, 2 * kv, 2 * kv, 2 * kv, piece, kv // 2, kv // 2]
        if backward
        else [c * kv, 2 * piece, 2 * piece, piece]
    )
    n = len(want)
    assert any(asked[i : i + n] == want for i in range(len(asked) - n + 1)), asked
