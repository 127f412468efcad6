"""The screen's figures of context parallelism (``Strategy.c``: ring attention over c GPUs).

Context parallelism splits every sequence over the c GPUs of a ring (``distir.parallel.context``:
2c chunks, rank i holding chunks i and 2c−1−i, so that causal attention costs every rank the
same). What that does to one layer call of a TP rank, per microbatch, from its profile at the
whole sequence (``distir.search.profile.LayerProfile``):

- **Compute and memory ÷ c.** Everything but attention is per token, so its FLOPs, bytes and
  activations divide by c; attention's FLOPs per rank are 1/c of the whole sequence's too (the
  balanced layout gives every rank the same share of the causal triangle). So forward,
  backward, saved, working and output bytes are the profile's ÷ c. Optimistic where fixed costs
  dominate: a rank launches as many kernels as the whole sequence (attention c times as many)
  and its TP collectives pay their latency in full, but ÷ c divides those too — negligible at
  the long sequences context parallelism is searched for (``distir.search.space.CP_MIN_SEQ``),
  not at short ones.
- **The ring.** Per attention op, the whole sequence's attention ÷ c (forward, backward, and
  the forward again in a backward that recomputes) is replaced by the ring's pass as the exact
  simulation times it (``ring_pass``; ``distir.sim.ring``): per step, the blocks a rank computes
  (``distir.parallel.context.ring_step_work``: 2 diagonal and 2c−1 full blocks of chunk length
  S/2c over the c steps) and the merges and Adds combining them, each priced by the screen's
  cost model (the ring's ``cost``, the model the layer profiles come from) on the ring's slowest
  GPU, and the transfers overlapping them (``ring_time``): a rank's K and V (``kv_bytes``: its 2
  chunks, its TP share of the kv heads) travel c − 1 steps forward; backward, K/V c − 1 steps
  and their gradients c, T the ring's time for ``kv_bytes`` over its slowest hop. (Without a
  cost model — a ``Ring`` built without one — the older estimate: the exposed part of the
  transfers against the attention at the GPU's peak rate, (c−1)·max(0, T − A_f/c) forward,
  (c−1)·max(0, 2T − A_b/c) + T backward.) Working memory adds the ring's buffers: the K/V
  received, the dK/dV travelling (4 × ``kv_bytes``).

``distribute`` builds the same ring (``distir.parallel.context_model``, ``cp_ring``), so the
screen and the exact simulation of a c > 1 plan agree closely (Llama-3 8B at 128K on 16 and 64
H100s, ``bench/bench_context_ring.py``: median |error| 0.5%, −3.1% … +3.0%; they differ in
the layers' other ops ÷ c and in how stages compose, as for any plan).

Attention ops are found in the layer functions (the registry's ``Attention``), with their types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from distir.autodiff.reverse import value_types
from distir.autodiff.train import layer_types
from distir.frontends.zoo.model import Model
from distir.ir.ops import Op
from distir.ir.types import Device, DType, TensorType
from distir.ir.values import Attrs
from distir.ops.attention import (
    ATTENTION,
    ATTENTION_GRAD,
    ATTENTION_MERGE,
    BACKWARD_FACTOR,
    forward_flops,
    heads_split_evenly,
    lse_dtype,
)
from distir.ops.elementwise import ADD
from distir.ops.registry import OpDef
from distir.parallel.context import ring_step_work, ring_time
from distir.search.profile import LayerProfile
from distir.sim.cost import CostModel


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """One attention op of a layer at the whole sequence: q (batch, seq, heads, head_dim), k and
    v (…, kv_heads, …), its dtype's bytes per element, causal or not."""

    batch: int
    seq: int
    heads: int
    kv_heads: int
    head_dim: int
    itemsize: int
    causal: bool
    dtype: DType = DType.bf16

    def per_rank(self, t: int, c: int) -> tuple[float, float]:
        """(forward FLOPs, K/V bytes) of one rank of a TP group of t and a ring of c: the heads
        split over t when whole GQA groups do (``Attention``'s sharding rule), the sequence over c."""
        split = t if heads_split_evenly(self.heads, self.kv_heads, t) else 1
        flops = forward_flops(self.batch, self.seq, self.heads // split, self.head_dim, self.causal) / c
        kv = 2.0 * self.batch * (self.seq / c) * (self.kv_heads / split) * self.head_dim * self.itemsize
        return flops, kv


def attention_shapes(model: Model) -> list[tuple[AttentionShape, ...]]:
    """Per layer call of ``model``, its attention ops (usually none or one)."""
    types = layer_types(model)
    out: list[tuple[AttentionShape, ...]] = []
    for call, ts in zip(model.layers, types, strict=True):
        fn = model.module[call.callee]
        ops = [i for i in fn.body if isinstance(i, Op) and i.name == ATTENTION.name]
        if not ops:
            out.append(())
            continue
        env = value_types(model.module, fn, ts)
        found = []
        for op in ops:
            q, k = env[op.inputs[0]], env[op.inputs[1]]
            assert isinstance(q, TensorType) and isinstance(k, TensorType)
            b, s, h, d = q.shape
            found.append(
                AttentionShape(
                    b, s, h, k.shape[2], d, q.dtype.itemsize, bool(op.attrs.get("causal")), q.dtype
                )
            )
        out.append(tuple(found))
    return out


@dataclass(frozen=True, slots=True)
class Ring:
    """A ring's link: latency and seconds per byte of its slowest hop; the GPU's peak FLOP/s.
    With ``cost`` (and ``gpu``, one of the ring's GPUs), attention is priced per block by that
    cost model (module docstring); compared and hashed by the GPU's kind (``kind``), not by the
    cost model or the GPU."""

    latency_s: float
    s_per_byte: float
    peak_flops: float
    kind: object = None
    gpu: int = field(default=0, compare=False, hash=False)
    cost: CostModel | None = field(default=None, compare=False, hash=False)

    def time(self, nbytes: float) -> float:
        return self.latency_s + nbytes * self.s_per_byte

    def attention_s(self, a: AttentionShape, t: int, sq: int, sk: int, causal: bool, backward: bool) -> float:
        """The cost model's time of one rank's attention call of ``sq`` queries over ``sk`` keys
        (heads split over t as in ``AttentionShape.per_rank``), forward or backward."""
        assert self.cost is not None
        qt, kt = _rank_types(a, t, sq), _rank_types(a, t, sk, kv=True)
        lt = TensorType(lse_dtype(a.dtype), (a.batch, qt.shape[2], sq), qt.device)
        attrs = Attrs({"causal": causal})
        if backward:
            ins, outs = [qt, qt, kt, kt, qt, lt], [qt, kt, kt]
            return float(self.cost.compute_time(ATTENTION_GRAD, ins, outs, attrs, self.gpu))
        return float(self.cost.compute_time(ATTENTION, [qt, kt, kt], [qt, lt], attrs, self.gpu))

    def elementwise_s(self, od: OpDef, t: TensorType) -> float:
        """The cost model's time of ``od`` (an Add or an AttentionMerge) on tensors like ``t``."""
        assert self.cost is not None
        if od is ATTENTION_MERGE:
            lt = TensorType(lse_dtype(t.dtype), (t.shape[0], t.shape[2], t.shape[1]), t.device)
            return float(self.cost.compute_time(od, [t, lt, t, lt], [t, lt], Attrs({}), self.gpu))
        return float(self.cost.compute_time(od, [t, t], [t], Attrs({}), self.gpu))


def _rank_types(a: AttentionShape, t: int, seq: int, kv: bool = False) -> TensorType:
    """A rank's q (or k, v) of ``seq`` positions: heads split over t when whole GQA groups do."""
    split = t if heads_split_evenly(a.heads, a.kv_heads, t) else 1
    heads = (a.kv_heads if kv else a.heads) // split
    return TensorType(a.dtype, (a.batch, seq, heads, a.head_dim), Device(0))


def ring_pass(a: AttentionShape, t: int, c: int, ring: Ring, backward: bool) -> float:
    """One rank's attention pass as the ring runs it (``distir.parallel.context.ring_time``),
    each step's blocks and combining ops priced by the ring's cost model, as the exact
    simulation does (``distir.sim.ring``)."""
    n = a.seq // (2 * c)
    chunk_q, chunk_k = _rank_types(a, t, n), _rank_types(a, t, n, kv=True)
    merge = ring.elementwise_s(ATTENTION_MERGE, chunk_q)
    add_q, add_k = ring.elementwise_s(ADD, chunk_q), ring.elementwise_s(ADD, chunk_k)
    steps = []
    for s in range(c):
        work = ring_step_work(c, 0, s, a.causal, backward)  # every rank alike (balanced layout)
        x = work.merges * merge + work.q_adds * add_q + work.kv_adds * add_k
        x += sum(ring.attention_s(a, t, n, n, diag, backward) for _x, _y, diag in work.blocks)
        steps.append(x)
    _, kv = a.per_rank(t, c)
    return ring_time(steps, ring.time(kv), backward)


def context_layer(
    p: LayerProfile, attn: Sequence[AttentionShape], t: int, c: int, ring: Ring, recomputed: bool = False
) -> LayerProfile:
    """The profile ``p`` (one layer at the whole sequence, TP degree t) under context parallelism
    over c ranks (module docstring); ``recomputed``: the backward recomputes the attention (any
    recomputation: attention is never among the saved products)."""
    fwd, bwd, work = p.fwd_s / c, p.bwd_s / c, p.work_bytes / c
    fwd_work, bwd_work, ibwd_work = p.fwd_work_bytes / c, p.bwd_work_bytes / c, p.ibwd_work_bytes / c
    zbwd_work = p.zbwd_work_bytes / c
    for a in attn:
        flops, kv = a.per_rank(t, c)
        t_kv = ring.time(kv)
        if ring.cost is not None:  # the ring step by step, in place of the whole attention ÷ c
            whole_f = ring.attention_s(a, t, a.seq, a.seq, a.causal, False) / c
            fwd += ring_pass(a, t, c, ring, False) - whole_f
            if p.bwd_s > 0:
                whole_b = ring.attention_s(a, t, a.seq, a.seq, a.causal, True) / c
                bwd += ring_pass(a, t, c, ring, True) - whole_b
                if recomputed:  # the backward runs the forward's attention again
                    bwd += ring_pass(a, t, c, ring, False) - whole_f
        else:
            a_f = flops / ring.peak_flops
            fwd += (c - 1) * max(0.0, t_kv - a_f / c)
            if p.bwd_s > 0:
                bwd += (c - 1) * max(0.0, 2 * t_kv - BACKWARD_FACTOR * a_f / c) + t_kv
        # the ring's buffers: K/V in flight (forward), with dK/dV beside them (backward)
        work += 4 * kv
        fwd_work += 2 * kv
        bwd_work += 4 * kv
        ibwd_work += 4 * kv
        zbwd_work += 4 * kv
    return LayerProfile(
        fwd_s=fwd,
        bwd_s=bwd,
        flops=p.flops / c,
        weight_bytes=p.weight_bytes,
        n_weights=p.n_weights,
        saved_bytes=p.saved_bytes / c,
        out_bytes=p.out_bytes / c,
        work_bytes=work,
        carried_bytes=p.carried_bytes / c,
        largest_weight_bytes=p.largest_weight_bytes,
        fwd_work_bytes=fwd_work,
        bwd_work_bytes=bwd_work,
        ibwd_work_bytes=ibwd_work,
        zbwd_work_bytes=zbwd_work,
        tp_pending_bytes=p.tp_pending_bytes,
    )


__all__ = ["AttentionShape", "Ring", "attention_shapes", "context_layer", "ring_pass"]
