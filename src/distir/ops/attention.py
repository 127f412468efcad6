"""Fused attention and rotary position embedding: Attention, AttentionGrad, AttentionMerge, Rope.

``out, lse = Attention(q, k, v; causal, scale, dropout)`` is scaled-dot-product self-attention
as FlashAttention-2 computes it, in its BSHD layout (no transposes around it):

- ``q`` is (B, S, h, d), ``k`` and ``v`` are (B, S, h_kv, d) with ``h_kv`` dividing ``h``
  (grouped-query attention: query head ``i`` reads kv head ``i // (h / h_kv)``);
- ``out`` (B, S, h, d) = softmax(scale · q kᵀ [+ causal mask]) v, per head; ``scale`` defaults
  to 1/sqrt(d); ``causal`` hides key j from query i when j > i;
- ``lse`` (B, h, S) is the log-sum-exp of each query's scaled scores, in f32 (f64 for f64
  inputs): the one statistic the backward needs to rebuild the probabilities. No S×S tensor is
  ever a value of the program, so memory is O(B·S·h·d).

``dq, dk, dv = AttentionGrad(dout, q, k, v, out, lse; ...)`` is its backward (FlashAttention-2's:
it recomputes the scores blockwise from q, k and ``lse``).

FLOPs as FlashAttention-2 counts them (Dao, "FlashAttention-2", 2023, §4.1): the forward is
two matmuls of 2·B·h·S²·d each, 4·B·h·S²·d, halved when causal; the backward 2.5 times that
(five matmuls, one of them the recomputed scores). Bytes read and written are the operands' and
results' (the default): O(B·S·h·d).

``alibi`` (default none) lists one slope per query head: ALiBi (Press et al., "Train Short,
Test Long", ICLR 2022; BLOOM's positions) adds slope_h·(j − i) to query i's scaled score of key j
(by the global positions kpos − qpos when given): with ``causal``, FlashAttention-2's
``alibi_slopes`` bias (−slope·|i − j|, which is the same on the keys a query sees); the FLOPs and
bytes are unchanged. Split on the heads, each piece keeps its heads' slopes
(``localize``); a ring (``ring`` > 1) does not take it.

``window`` (default 0: none), with ``causal``, is a sliding window: query i sees keys
i − window < j ≤ i (Mistral's and Gemma's local attention, Hugging Face's
``sliding_window_overlay``; FlashAttention-2's ``window_size=(window − 1, 0)``, since flash-attn
2.3, which skips the key blocks outside the band). Its FLOPs are the causal count times the
share of the causal pairs the window keeps (``window_share``); the kernel runs at the causal
kernel's speed at that sequence length (no published curve of the windowed kernel). Not with
positions or a ring.

``softcap`` (default 0: none) caps the scaled scores as softcap·tanh(score / softcap) before the
masks (Gemma 2's ``attn_logit_softcapping``; FlashAttention-2's ``softcap``, since flash-attn
2.6); the backward multiplies the scores' gradient by 1 − tanh². Its tanh per score is not
counted in the FLOPs (FlashAttention-2's count is the matmuls'). Not with ALiBi or a ring.

``dropout`` (the probability of dropping an attention probability, default 0) is accepted by
the type rule and costs nothing extra here (FlashAttention generates its mask on the fly from a
seed); the numpy references refuse a nonzero dropout (``AttentionDropoutError``): they cannot
reproduce the kernel's random stream, so a program with dropout can be simulated but not run.

``out, lse = AttentionMerge(out1, lse1, out2, lse2)`` merges two partial attentions of the same
queries over disjoint key sets (ring attention's step; FlashAttention's online softmax across
blocks): ``lse = log(exp(lse1) + exp(lse2))``, ``out = exp(lse1 − lse)·out1 + exp(lse2 −
lse)·out2`` per query and head, in f32 (f64 for f64) like the lse. It has no gradient rule: the
ring backward runs AttentionGrad per block with the *merged* out and lse (FlashAttention-2's
backward only needs those), so nothing differentiates through the merge. Its sharding is
pointwise per query: batch, sequence or heads (out on dims 0/1/2, lse on 0/2/1).

``Rope(x; theta, inverse)`` is rotary position embedding (Su et al., "RoFormer", 2021) as Meta's
Llama applies it to q and k: x is (B, S, heads, d) with d even, and each consecutive pair
``(x[2i], x[2i+1])`` at position ``s`` (dim 1) is rotated by the angle ``s · theta^(-2i/d)``.
``inverse`` rotates by the opposite angle: the inverse, and the transpose, so it is also the
gradient. Two options describe the other common forms: ``halves`` pairs ``(x[i], x[i + d/2])``
instead (GPT-NeoX's and Hugging Face's ``rotate_half``), and ``freqs`` lists the d/2 inverse
frequencies explicitly in place of ``theta^(-2i/d)`` (scaled schedules: Llama 3's, NTK).
``offset`` (default 0) is the global position of x's first row: a chunk of a longer sequence
(context parallelism's, ``distir.parallel.context``) is rotated as it is in the whole.

**Positions** (context parallelism inside ``distribute``, ``distir.parallel.context_model``):
``Rope(x, pos)`` takes each row's global position from the int tensor ``pos`` (B, S) instead of
``offset + s``; ``Attention(q, k, v, qpos, kpos)`` and ``AttentionGrad(…, lse, qpos, kpos)`` take
the global positions of the queries (B, S_q) and keys (B, S_k), the keys may then be a longer
sequence than the queries, and ``causal`` hides key j from query i when kpos[j] > qpos[i]. So a
rank holding any set of query positions (the load-balanced chunks i and 2c−1−i) computes its
queries' attention over all keys as the whole sequence does. With positions, the sequence can be
split: q, qpos, out (dim 1) and lse (dim 2) sharded with k, v, kpos whole gives each shard its
queries' rows (the ring's all-gathered K/V); in the backward, dK and dV are then pending sums
(each shard's queries' contributions), which a reduce-scatter returns to the keys' owners.
FLOPs with positions: 4·B·h·S_q·S_k·d, halved when causal (exact on average for the balanced
layout: each rank does 1/c of the causal triangle).

**Ring** (``ring`` = c > 1, with positions): a promise that the sequence is in the
load-balanced order over c ranks (``ring_order``: 2c chunks, rank r holding chunks r and
2c−1−r; the references check it) and a request: split along the sequence over a mesh axis of
c devices, with q, k, v, the positions, out (and dout, dq, dk, dv) all ``Shard(1)`` and lse
``Shard(2)``, the op runs as ring attention — not as itself on the pieces: materialization
lowers it to the explicit ring of ``distir.parallel.context`` (blocks of one query chunk
against one key chunk, fully masked blocks skipped, K/V and dK/dV sent to the next rank, the
partial results merged by ``AttentionMerge``; ``distir.parallel.sharding.ring``) and the
simulator times that ring (``distir.sim.ring``). Its global meaning is the op's.

Sharding (``distir.ops.sharding``-style rules, defined here): both attention ops split the batch
(every tensor on its dim 0), or the heads (q, k, v, out on dim 2, lse on dim 1) when every
shard keeps whole GQA groups (the pieces of h are the pieces of h_kv times h / h_kv: the local
query head i still reads local kv head i // group); the sequence and head dims stay whole.
AttentionGrad is linear in dout, so a pending sum on it (the rest replicated) passes to all
three gradients. With positions, the queries' rows (above); with ``ring`` = n also the ring
(everything along the sequence, dK and dV returned split). Rope is pointwise over the batch and
the heads (and linear: a pending sum passes through); the positions (dim 1) and the pairs
(dim 3) stay whole, since a piece does not know its global position.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from distir.hardware.attention import FlashShape
from distir.ir.dtensor import Placement, Shard, split_sizes
from distir.ir.ops import Op
from distir.ir.types import DType, TensorType, Type
from distir.ir.values import Attrs, Value
from distir.ops import sharding as sh
from distir.ops._rules import float_attr, float_input, int_attr, out_numel_flops, same_dtype
from distir.ops._special import F64, f64
from distir.ops._torch import like, upcast
from distir.ops.gradrules import GradCtx, NotDifferentiableError, first
from distir.ops.registry import AttrSpec, CostClass, LocalPiece, OpDef, TypeCtx, register

if TYPE_CHECKING:
    from distir.backend.context import TorchContext

FAMILY = "attention"
COST_CLASS = CostClass.ATTENTION  # how the family's ops are costed

ATTENTION_ATTRS = {
    "causal": AttrSpec("bool", False),
    "scale": AttrSpec("float", None),  # None: 1/sqrt(d)
    "dropout": AttrSpec("float", 0.0),
    # > 1: the sequence is in the load-balanced order over that many ranks and, split along
    # the sequence over a mesh axis of that size, runs as ring attention (module docstring: ring)
    "ring": AttrSpec("int", 1),
    # ALiBi (Press et al., "Train Short, Test Long", 2022): one slope per query head, the score
    # of query i and key j raised by slope·(j − i) (by the global positions when given)
    "alibi": AttrSpec("floats", None),
    # > 0, with causal: a sliding window, query i seeing keys i − window < j ≤ i (module docstring)
    "window": AttrSpec("int", 0),
    # > 0: the scaled scores capped as softcap·tanh(score / softcap) (module docstring)
    "softcap": AttrSpec("float", 0.0),
}

BACKWARD_FACTOR = 2.5  # FlashAttention-2: backward FLOPs = 2.5 x forward


class AttentionDropoutError(ValueError):
    """A numpy reference was asked for attention with dropout, which it cannot reproduce."""


def lse_dtype(dtype: DType) -> DType:
    """The log-sum-exp's dtype: f32, or f64 for f64 inputs (never narrower than f32)."""
    return DType.f64 if dtype == DType.f64 else DType.f32


# -- type rules -------------------------------------------------------------------------------
def _check_qkv(ctx: TypeCtx, first_index: int, pos_at: int) -> tuple[TensorType, TensorType]:
    """q (B, S, h, d), k and v (B, S, h_kv, d) at inputs ``first_index``.. +2: one float dtype,
    h_kv dividing h; with positions (inputs ``pos_at``, ``pos_at`` + 1: ``_positions``) k's
    sequence may differ from q's. Returns (q, k)."""
    qi, ki, vi = first_index, first_index + 1, first_index + 2
    q = float_input(ctx, qi, "q")
    same_dtype(ctx, [qi, ki, vi])
    k, v = ctx.tensor(ki), ctx.tensor(vi)
    for i, t, name in ((qi, q, "q"), (ki, k, "k"), (vi, v, "v")):
        if t.rank != 4:
            ctx.fail(f"{ctx.op.name}: {name} must be (batch, seq, heads, head_dim)", i, "rank 4", t.rank)
    if v.shape != k.shape:
        ctx.fail(f"{ctx.op.name}: v of shape {v.shape} differs from k {k.shape}", vi, k.shape, v.shape)
    positioned = _positions(ctx, pos_at, q, k)
    want = (q.shape[0], k.shape[1] if positioned else q.shape[1], k.shape[2], q.shape[3])
    if k.shape != want:
        ctx.fail(
            f"{ctx.op.name}: k of shape {k.shape} does not fit q {q.shape} (want (B, S, h_kv, d) = "
            f"(batch, seq of q, kv heads, head_dim of q))",
            ki,
            want,
            k.shape,
        )
    h, hkv = q.shape[2], k.shape[2]
    if (hkv == 0 and h != 0) or (hkv and h % hkv):
        ctx.fail(f"{ctx.op.name}: kv heads {hkv} must divide query heads {h}", ki, f"a divisor of {h}", hkv)
    p = ctx.attr("dropout")
    if not 0.0 <= p < 1.0:
        ctx.fail(f"{ctx.op.name}: dropout={p} must be in [0, 1)", None, "[0, 1)", p)
    ring = ctx.attr("ring")
    if ring < 1 or (ring > 1 and not positioned):
        ctx.fail(f"{ctx.op.name}: ring={ring} needs ring >= 1, and positions when > 1", None, ">= 1", ring)
    window = ctx.attr("window")
    if window < 0 or (window > 0 and (not ctx.attr("causal") or positioned)):
        ctx.fail(
            f"{ctx.op.name}: window={window} needs window >= 0, and causal attention without positions "
            "when > 0",
            None,
            ">= 0",
            window,
        )
    cap = ctx.attr("softcap")
    if cap < 0 or (cap > 0 and (ring > 1 or ctx.attr("alibi") is not None)):
        ctx.fail(
            f"{ctx.op.name}: softcap={cap} needs softcap >= 0, and no ring or alibi when > 0",
            None,
            ">= 0",
            cap,
        )
    slopes = ctx.attr("alibi")
    if slopes is not None and (len(slopes) != h or ring > 1):
        ctx.fail(
            f"{ctx.op.name}: alibi lists {len(slopes)} slopes for {h} query heads (and is not run as a ring)",
            None,
            h,
            len(slopes),
        )
    return q, k


def _positions(ctx: TypeCtx, at: int, q: TensorType, k: TensorType) -> bool:
    """Whether the op has positions (both qpos and kpos at inputs ``at``, ``at`` + 1): int
    tensors (B, S_q) and (B, S_k)."""
    n = len(ctx.types)
    if n == at:
        return False
    if n != at + 2:
        ctx.fail(f"{ctx.op.name}: give both qpos and kpos, or neither", at, "2 position inputs", n - at)
    for i, seq in ((at, q.shape[1]), (at + 1, k.shape[1])):
        t = ctx.tensor(i)
        if not t.dtype.is_int or t.shape != (q.shape[0], seq):
            ctx.fail(
                f"{ctx.op.name}: positions must be an int tensor (batch, seq) = {(q.shape[0], seq)}",
                i,
                (q.shape[0], seq),
                (t.dtype, t.shape),
            )
    return True


def _lse_type(ctx: TypeCtx, q: TensorType) -> TensorType:
    b, s, h, _ = q.shape
    return ctx.out(lse_dtype(q.dtype), (b, h, s))


def _attention_rule(ctx: TypeCtx) -> Sequence[Type]:
    q, _ = _check_qkv(ctx, 0, 3)
    return (ctx.out(q.dtype, q.shape), _lse_type(ctx, q))


def _attention_grad_rule(ctx: TypeCtx) -> Sequence[Type]:
    q, k = _check_qkv(ctx, 1, 6)
    float_input(ctx, 0, "gradient")
    same_dtype(ctx, [0, 1, 4])
    for i, name in ((0, "dout"), (4, "out")):
        t = ctx.tensor(i)
        if t.shape != q.shape:
            ctx.fail(
                f"AttentionGrad: {name} of shape {t.shape} must be shaped like q {q.shape}",
                i,
                q.shape,
                t.shape,
            )
    lse, want = ctx.tensor(5), _lse_type(ctx, q)
    if (lse.dtype, lse.shape) != (want.dtype, want.shape):
        ctx.fail(
            f"AttentionGrad: lse must be {want.dtype} {want.shape} (B, h, S), got {lse.dtype} {lse.shape}",
            5,
            (want.dtype, want.shape),
            (lse.dtype, lse.shape),
        )
    return (ctx.out(q.dtype, q.shape), ctx.out(k.dtype, k.shape), ctx.out(k.dtype, k.shape))


# -- numpy references -------------------------------------------------------------------------
def _scale(attrs: Attrs, d: int) -> float:
    s = attrs.get("scale")
    return 1.0 / math.sqrt(d) if s is None else float_attr(attrs, "scale", 0.0)


def _no_dropout(attrs: Attrs) -> None:
    if float_attr(attrs, "dropout", 0.0) > 0.0:
        raise AttentionDropoutError(
            "the numpy reference of attention cannot run dropout > 0 (FlashAttention draws its mask "
            "from the kernel's random stream); simulate such a program, or run it with dropout=0"
        )


def repeat_kv(x: F64, group: int) -> F64:
    """(B, S, h_kv, d) -> (B, S, h_kv·group, d), each kv head repeated ``group`` times in a row."""
    return np.repeat(x, group, axis=2)


def _group_sum(x: F64, hkv: int) -> F64:
    """(B, S, h_kv·group, d) -> (B, S, h_kv, d): sum each kv head's group (repeat_kv's adjoint)."""
    b, s, h, d = x.shape
    return x.reshape(b, s, hkv, h // max(hkv, 1), d).sum(axis=3)  # type: ignore[no-any-return]


def alibi_bias(slopes: Sequence[float], sq: int, sk: int, pos: tuple[Any, Any] | None = None) -> F64:
    """ALiBi's (B or 1, h, S_q, S_k) bias: slope_h · (kpos − qpos) (0..S−1 without positions)."""
    if pos is None:
        dist = (np.arange(sk, dtype=np.float64)[None, :] - np.arange(sq, dtype=np.float64)[:, None])[None]
    else:
        qp, kp = (np.asarray(p, dtype=np.float64) for p in pos)
        dist = kp[:, None, :] - qp[:, :, None]
    return np.asarray(slopes, dtype=np.float64)[None, :, None, None] * dist[:, None]


def scores(
    q: F64,
    k: F64,
    scale: float,
    causal: bool,
    pos: tuple[Any, Any] | None = None,
    alibi: Sequence[float] | None = None,
    window: int = 0,
    softcap: float = 0.0,
) -> F64:
    """(B, h, S_q, S_k) scaled scores of q (B, S_q, h, d) against the repeated k, capped
    (``softcap`` > 0: softcap·tanh(s / softcap)), plus ALiBi's bias if given; -inf where masked
    (by the global positions ``pos`` = (qpos, kpos), if given; outside the sliding ``window`` too,
    if > 0)."""
    group = q.shape[2] // max(k.shape[2], 1)
    s = np.einsum("bihd,bjhd->bhij", q, repeat_kv(k, group)) * scale
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    if alibi is not None:
        s = s + alibi_bias(alibi, s.shape[2], s.shape[3], pos)
    if causal and pos is not None:
        qp, kp = np.asarray(pos[0]), np.asarray(pos[1])
        s = np.where(kp[:, None, None, :] > qp[:, None, :, None], -np.inf, s)
    elif causal:
        n = s.shape[-1]
        s = np.where(np.triu(np.ones((n, n), dtype=bool), k=1), -np.inf, s)
    if window > 0:
        n = s.shape[-1]
        s = np.where(np.tril(np.ones((n, n), dtype=bool), k=-window), -np.inf, s)
    return s  # type: ignore[no-any-return]


def attention_reference(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    scale: float | None = None,
    pos: tuple[Any, Any] | None = None,
    alibi: Sequence[float] | None = None,
    window: int = 0,
    softcap: float = 0.0,
) -> tuple[F64, F64]:
    """Exact softmax attention in float64: (out (B, S, h, d), lse (B, h, S))."""
    qd, kd, vd = f64(q), f64(k), f64(v)
    sc = 1.0 / math.sqrt(qd.shape[3]) if scale is None else scale
    s = scores(qd, kd, sc, causal, pos, alibi, window, softcap)
    m = np.max(s, axis=-1, keepdims=True, initial=-np.inf) if s.size else np.zeros((*s.shape[:-1], 1))
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    total = np.sum(e, axis=-1, keepdims=True)
    lse = (m + np.log(total))[..., 0]
    group = qd.shape[2] // max(kd.shape[2], 1)
    out = np.einsum("bhij,bjhd->bihd", e / total, repeat_kv(vd, group))
    return out, lse


def _attention_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    _no_dropout(attrs)
    _check_ring_positions(attrs, args[3:])
    q = np.asarray(args[0])
    out, lse = attention_reference(
        q,
        args[1],
        args[2],
        scale=_scale(attrs, q.shape[3]),
        pos=(args[3], args[4]) if len(args) > 3 else None,
        **_masking(attrs),
    )
    return (out.astype(q.dtype), lse.astype(lse_dtype(DType.from_numpy(q.dtype)).to_numpy()))


def _masking(attrs: Attrs) -> dict[str, Any]:
    """The references' keyword arguments of what shapes the scores: causal, ALiBi, the window, the cap."""
    return {
        "causal": bool(attrs.get("causal", False)),
        "alibi": _alibi(attrs),
        "window": int_attr(attrs, "window", 0),
        "softcap": float_attr(attrs, "softcap", 0.0),
    }


def _alibi(attrs: Attrs) -> tuple[float, ...] | None:
    slopes: Any = attrs.get("alibi")
    return None if slopes is None else tuple(float(x) for x in slopes)


def attention_grad_reference(
    dout: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    *,
    causal: bool,
    scale: float,
    pos: tuple[Any, Any] | None = None,
    alibi: Sequence[float] | None = None,
    window: int = 0,
    softcap: float = 0.0,
) -> tuple[F64, F64, F64]:
    """(dq, dk, dv) in float64, the probabilities rebuilt from ``lse`` (FlashAttention-2's
    backward, untiled; with ``softcap``, through the tanh: 1 − tanh² of the scaled score)."""
    do, qd, kd, vd, od = f64(dout), f64(q), f64(k), f64(v), f64(out)
    hkv = kd.shape[2]
    group = qd.shape[2] // max(hkv, 1)
    p = np.exp(
        scores(qd, kd, scale, causal, pos, alibi, window, softcap) - f64(lse)[..., None]
    )  # (B, h, S_q, S_k)
    dv = _group_sum(np.einsum("bhij,bihd->bjhd", p, do), hkv)
    dp = np.einsum("bihd,bjhd->bhij", do, repeat_kv(vd, group))
    delta = np.einsum("bihd,bihd->bhi", do, od)[..., None]  # rowsum(dout ⊙ out)
    ds = p * (dp - delta) * scale
    if softcap > 0:  # d(cap·tanh(s / cap)) / ds = 1 − tanh²
        ds = ds * (
            1.0 - np.tanh(np.einsum("bihd,bjhd->bhij", qd, repeat_kv(kd, group)) * scale / softcap) ** 2
        )
    dq = np.einsum("bhij,bjhd->bihd", ds, repeat_kv(kd, group))
    dk = _group_sum(np.einsum("bhij,bihd->bjhd", ds, qd), hkv)
    return dq, dk, dv


def _attention_grad_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    _no_dropout(attrs)
    _check_ring_positions(attrs, args[6:])
    dout, q, k = np.asarray(args[0]), np.asarray(args[1]), np.asarray(args[2])
    dq, dk, dv = attention_grad_reference(
        dout,
        q,
        k,
        args[3],
        args[4],
        args[5],
        scale=_scale(attrs, q.shape[3]),
        pos=(args[6], args[7]) if len(args) > 6 else None,
        **_masking(attrs),
    )
    return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(k.dtype))


# -- costs ------------------------------------------------------------------------------------
def forward_flops(batch: int, seq: int, heads: int, head_dim: int, causal: bool) -> float:
    """FlashAttention-2's forward count: 4·B·h·S²·d, halved when causal."""
    return 4.0 * batch * heads * seq * seq * head_dim * (0.5 if causal else 1.0)


def _q_shape(t: Type) -> tuple[int, ...]:
    assert isinstance(t, TensorType)
    return t.shape


def window_share(seq: int, window: int) -> float:
    """The share of the causal pairs a sliding ``window`` keeps: sum over queries i of min(i + 1,
    window), over S(S + 1)/2 (1 without a window or when it spans the sequence)."""
    if window <= 0 or window >= seq:
        return 1.0
    kept = window * (window + 1) / 2 + (seq - window) * window
    return kept / (seq * (seq + 1) / 2)


def _qk_flops(q: Type, k: Type, attrs: Attrs) -> float:
    """The forward's FLOPs for queries ``q`` over keys ``k``: ``forward_flops`` at S_q·S_k (the
    sliding window's share of the causal pairs, ``window_share``)."""
    b, sq, h, d = _q_shape(q)
    sk = _q_shape(k)[1]
    causal = forward_flops(b, sq, h, d, bool(attrs.get("causal", False))) * (sk / sq if sq else 0.0)
    return causal * window_share(sq, int_attr(attrs, "window", 0))


def _attention_flops(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    return _qk_flops(ins[0], ins[1], attrs)


def _attention_grad_flops(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    return BACKWARD_FACTOR * _qk_flops(ins[1], ins[2], attrs)


def _attention_flash(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> FlashShape:
    b, _, h, d = _q_shape(ins[0])
    return FlashShape(b, h, _q_shape(ins[1])[1], d, bool(attrs.get("causal", False)), backward=False)


def _attention_grad_flash(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> FlashShape:
    b, _, h, d = _q_shape(ins[1])
    return FlashShape(b, h, _q_shape(ins[2])[1], d, bool(attrs.get("causal", False)), backward=True)


# -- sharding ---------------------------------------------------------------------------------
def is_ring(attrs: Attrs, n: int) -> bool:
    """Whether an attention op with these attributes runs as a ring when its sequence is split
    over a mesh axis of ``n`` devices (the ``ring`` attribute names that many ranks)."""
    return n > 1 and int_attr(attrs, "ring", 1) == n


def ring_order(seq: int, c: int) -> np.ndarray:
    """The global positions of a sequence in the load-balanced order over c ranks: cut into 2c
    chunks, rank r's chunks r and 2c−1−r, rank after rank (``distir.parallel.context``)."""
    n = seq // (2 * c)
    return np.concatenate(
        [np.arange(g * n, (g + 1) * n) for r in range(c) for g in (r, 2 * c - 1 - r)]
    ).astype(np.int64)


def _check_ring_positions(attrs: Attrs, pos: Sequence[Any]) -> None:
    """The ``ring`` attribute's promise: queries and keys in the load-balanced order (the ring's
    lowering relies on it to know which blocks are masked)."""
    c = int_attr(attrs, "ring", 1)
    if c <= 1:
        return
    for p in pos:
        a = np.asarray(p)
        seq = a.shape[1]
        if seq % (2 * c) or not np.array_equal(a, np.broadcast_to(ring_order(seq, c), a.shape)):
            raise ValueError(
                f"attention with ring={c} needs its positions in the load-balanced order over {c} ranks"
            )


def heads_split_evenly(h: int, hkv: int, n: int) -> bool:
    """Whether splitting h query heads and h_kv kv heads over ``n`` keeps whole GQA groups on
    every shard (each shard's query heads are exactly its kv heads' groups)."""
    if h <= 1 or hkv < 1:
        return False
    group = h // hkv
    return split_sizes(h, n) == [group * x for x in split_sizes(hkv, n)]


def _attention_strategies(
    q: tuple[int, ...],
    hkv: int,
    n: int,
    tensor_ins: int,
    lse_at: int | None,
    n_outs: int,
    lse_out: int | None,
) -> list[sh.Strategy]:
    """Batch and heads strategies: every (B, S, h, d) tensor on dim 0 / 2, the lse on 0 / 1."""
    found: list[sh.Strategy] = []

    def place(count: int, lse: int | None, dim: int, lse_dim: int) -> tuple[Placement, ...]:
        return tuple(Shard(lse_dim if i == lse else dim) for i in range(count))

    if q[0] > 1:
        found.append(sh.Strategy(place(tensor_ins, lse_at, 0, 0), place(n_outs, lse_out, 0, 0)))
    if heads_split_evenly(q[2], hkv, n):
        found.append(sh.Strategy(place(tensor_ins, lse_at, 2, 1), place(n_outs, lse_out, 2, 1)))
    return found


def _with_positions(found: list[sh.Strategy], n_pos: int, heads: bool) -> list[sh.Strategy]:
    """The batch and heads strategies of an op with positions: the positions (B, S) split
    with the batch, whole with the heads."""
    out = []
    for st in found:
        batch = isinstance(st.ins[0], Shard) and st.ins[0].dim == 0
        pl: Placement = Shard(0) if batch else sh.R
        if batch or heads:
            out.append(sh.Strategy((*st.ins, *(pl,) * n_pos), st.outs))
    return out


def _attention_sharding(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[sh.Strategy]:
    q, k = _q_shape(ins[0]), _q_shape(ins[1])
    found = _attention_strategies(q, k[2], n, 3, None, 2, 1)
    if len(ins) == 3:
        return [sh.replicated(ins, outs), *found]
    found = _with_positions(found, 2, True)
    if q[1] > 1:  # the queries' rows (module docstring: positions)
        s1 = Shard(1)
        found.append(sh.Strategy((s1, sh.R, sh.R, s1, sh.R), (s1, Shard(2))))
        if is_ring(attrs, n):  # everything along the sequence: the ring (module docstring: ring)
            found.append(sh.Strategy((s1,) * 5, (s1, Shard(2))))
    return [sh.replicated(ins, outs), *found]


def _attention_grad_sharding(
    ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int
) -> list[sh.Strategy]:
    q, k = _q_shape(ins[1]), _q_shape(ins[2])
    found = _attention_strategies(q, k[2], n, 6, 5, 3, None)
    if len(ins) > 6:
        found = _with_positions(found, 2, True)
        if q[1] > 1:  # the queries' rows; dK, dV pending sums of the shards' contributions
            s1, r = Shard(1), sh.R
            found.append(sh.Strategy((s1, s1, r, r, s1, Shard(2), s1, r), (s1, sh.SUM, sh.SUM)))
            if is_ring(attrs, n):  # the ring: dK, dV travel back to their owners
                found.append(sh.Strategy((s1, s1, s1, s1, s1, Shard(2), s1, s1), (s1, s1, s1)))
    found.append(sh.linear_first(ins, outs))
    return [sh.replicated(ins, outs), *found]


def _alibi_localizer(q_at: int) -> Any:
    """The slopes of a piece's query heads (q input ``q_at`` sharded on its heads, dim 2)."""

    def localize(attrs: Attrs, ins: Sequence[LocalPiece | None], outs: Sequence[LocalPiece | None]) -> Attrs:
        slopes = _alibi(attrs)
        piece = ins[q_at]
        if slopes is None or piece is None:
            return attrs
        start, count = piece.offset[2], piece.shape[2]
        return Attrs({**dict(attrs.items()), "alibi": slopes[start : start + count]})

    return localize


ATTENTION = register(
    OpDef(
        name="Attention",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("q", "k", "v", "qpos?", "kpos?"),
        outputs=("out", "lse"),
        infer=_attention_rule,
        attrs=dict(ATTENTION_ATTRS),
        reference=_attention_ref,
        flops=_attention_flops,
        flash=_attention_flash,
        doc="Fused scaled-dot-product attention in the BSHD layout (GQA, causal): out and the "
        "f32 log-sum-exp per query (B, h, S); never an S×S value.",
        sharding=_attention_sharding,
        attention_core=True,
        localize=_alibi_localizer(0),
    )
)
ATTENTION_GRAD = register(
    OpDef(
        name="AttentionGrad",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("dout", "q", "k", "v", "out", "lse", "qpos?", "kpos?"),
        outputs=("dq", "dk", "dv"),
        infer=_attention_grad_rule,
        attrs=dict(ATTENTION_ATTRS),
        reference=_attention_grad_ref,
        flops=_attention_grad_flops,
        flash=_attention_grad_flash,
        doc="Gradients of Attention w.r.t. q, k and v (FlashAttention-2's backward: recomputes "
        "the scores from q, k and lse; 2.5x the forward FLOPs).",
        sharding=_attention_grad_sharding,
        localize=_alibi_localizer(1),
    )
)


# -- AttentionMerge ---------------------------------------------------------------------------
def _merge_rule(ctx: TypeCtx) -> Sequence[Type]:
    o1 = float_input(ctx, 0, "out1")
    same_dtype(ctx, [0, 2])
    same_dtype(ctx, [1, 3])
    if o1.rank != 4:
        ctx.fail("AttentionMerge: out1 must be (batch, seq, heads, head_dim)", 0, "rank 4", o1.rank)
    b, s_, h, _ = o1.shape
    for i, want in ((1, (b, h, s_)), (2, o1.shape), (3, (b, h, s_))):
        got = ctx.tensor(i).shape
        if got != want:
            ctx.fail(f"AttentionMerge: input {i} of shape {got} does not fit out1 {o1.shape}", i, want, got)
    lt = lse_dtype(o1.dtype)
    if ctx.tensor(1).dtype != lt:
        ctx.fail(
            f"AttentionMerge: the lse must be {lt.value} for {o1.dtype.value} outputs",
            1,
            lt,
            ctx.tensor(1).dtype,
        )
    return (ctx.out(o1.dtype, o1.shape), ctx.out(lt, (b, h, s_)))


def attention_merge_reference(o1: Any, lse1: Any, o2: Any, lse2: Any) -> tuple[F64, F64]:
    """The merged (out, lse) in float64 (module docstring); a query with no visible key in
    either part (both lse −inf) gets out 0, lse −inf."""
    l1, l2 = f64(lse1), f64(lse2)
    lse = np.logaddexp(l1, l2)
    safe = np.where(np.isfinite(lse), lse, 0.0)
    w1 = np.where(np.isfinite(l1), np.exp(l1 - safe), 0.0)
    w2 = np.where(np.isfinite(l2), np.exp(l2 - safe), 0.0)
    bshd = (0, 2, 1)  # (B, h, S) -> (B, S, h), then a trailing axis for d

    def weigh(w: F64, o: Any) -> F64:
        return np.transpose(w, bshd)[..., None] * f64(o)

    return weigh(w1, o1) + weigh(w2, o2), lse


def _merge_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    out, lse = attention_merge_reference(*args)
    return (out.astype(np.asarray(args[0]).dtype), lse.astype(np.asarray(args[1]).dtype))


def _merge_sharding(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[sh.Strategy]:
    o = _q_shape(ins[0])
    found = [sh.replicated(ins, outs)]
    for dim, lse_dim in ((0, 0), (1, 2), (2, 1)):
        if o[dim] > 1:
            pl = (Shard(dim), Shard(lse_dim))
            found.append(sh.Strategy(pl * 2, pl))
    return found


ATTENTION_MERGE = register(
    OpDef(
        name="AttentionMerge",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("out1", "lse1", "out2", "lse2"),
        outputs=("out", "lse"),
        infer=_merge_rule,
        reference=_merge_ref,
        flops=out_numel_flops(3.0),
        doc="Merge two partial attentions of the same queries over disjoint keys by their "
        "log-sum-exps (ring attention's online-softmax step).",
        sharding=_merge_sharding,
    )
)


# -- Rope -------------------------------------------------------------------------------------
def _rope_rule(ctx: TypeCtx) -> Sequence[Type]:
    x = float_input(ctx, 0, "X")
    if x.rank != 4 or x.shape[3] % 2:
        ctx.fail(
            "Rope needs X of shape (batch, seq, heads, head_dim) with an even head_dim",
            0,
            "(B, S, h, 2k)",
            x.shape,
        )
    if ctx.attr("theta") <= 0:
        ctx.fail(f"Rope theta={ctx.attr('theta')} must be positive", None, "> 0", ctx.attr("theta"))
    if ctx.attr("offset") < 0:
        ctx.fail(
            f"Rope offset={ctx.attr('offset')} must be a position (>= 0)", None, ">= 0", ctx.attr("offset")
        )
    if len(ctx.types) > 1:
        pos = ctx.tensor(1)
        if not pos.dtype.is_int or pos.shape != x.shape[:2]:
            ctx.fail(
                f"Rope: pos must be an int tensor (batch, seq) = {x.shape[:2]}",
                1,
                x.shape[:2],
                (pos.dtype, pos.shape),
            )
    freqs = ctx.attr("freqs")
    if freqs is not None and len(freqs) != x.shape[3] // 2:
        ctx.fail(
            f"Rope freqs lists {len(freqs)} frequencies for head_dim {x.shape[3]}",
            None,
            x.shape[3] // 2,
            len(freqs),
        )
    return (ctx.out(x.dtype, x.shape),)


def rope_angles(
    seq: int, head_dim: int, theta: float, freqs: Sequence[float] | None = None, offset: int = 0
) -> F64:
    """(S, d/2): position offset + s times theta^(-2i/d) (or times ``freqs[i]`` when given)."""
    if freqs is None:
        f = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    else:
        f = np.asarray(freqs, dtype=np.float64)
    return np.outer(np.arange(offset, offset + seq, dtype=np.float64), f)


def _offset(attrs: Attrs) -> int:
    return int_attr(attrs, "offset", 0)


def _rope_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[0])
    freqs: Any = attrs.get("freqs")
    theta = float_attr(attrs, "theta", 10000.0)
    if len(args) > 1:  # (B, S, d/2): each row's angles from its global position
        per = rope_angles(1, x.shape[3], theta, freqs, 1)[0]
        ang = np.asarray(args[1], dtype=np.float64)[..., None] * per
    else:
        ang = rope_angles(x.shape[1], x.shape[3], theta, freqs, _offset(attrs))[None]
    if attrs.get("inverse", False):
        ang = -ang
    cos, sin = np.cos(ang)[:, :, None, :], np.sin(ang)[:, :, None, :]
    xd = f64(x)
    h = x.shape[3] // 2
    first, second = (
        (xd[..., :h], xd[..., h:]) if attrs.get("halves", False) else (xd[..., 0::2], xd[..., 1::2])
    )
    y = np.empty_like(xd)
    a, b = (
        (np.s_[..., :h], np.s_[..., h:])
        if attrs.get("halves", False)
        else (np.s_[..., 0::2], np.s_[..., 1::2])
    )
    y[a] = first * cos - second * sin
    y[b] = first * sin + second * cos
    return (y.astype(x.dtype),)


def _rope_sharding(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[sh.Strategy]:
    """Pointwise over batch and heads; with positions also over the sequence (pos split alike)."""
    x = _q_shape(ins[0])
    found = [sh.replicated(ins, outs)]
    if len(ins) == 1:
        found += [sh.Strategy((Shard(d),), (Shard(d),)) for d in (0, 2) if x[d] > 1]
        found.append(sh.Strategy((sh.SUM,), (sh.SUM,)))
        return found
    for d in (0, 1, 2):
        if x[d] > 1:
            found.append(sh.Strategy((Shard(d), Shard(d) if d < 2 else sh.R), (Shard(d),)))
    found.append(sh.Strategy((sh.SUM, sh.R), (sh.SUM,)))
    return found


ROPE = register(
    OpDef(
        name="Rope",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("X", "pos?"),
        outputs=("Y",),
        infer=_rope_rule,
        attrs={
            "theta": AttrSpec("float", 10000.0),
            "inverse": AttrSpec("bool", False),
            "halves": AttrSpec("bool", False),
            "freqs": AttrSpec("floats", None),
            "offset": AttrSpec("int", 0),
        },
        reference=_rope_ref,
        flops=out_numel_flops(3.0),
        doc="Rotary position embedding of X (B, S, h, d): pairs (2i, 2i+1) (or (i, i+d/2) when halves) at "
        "position offset + s rotated by (offset + s)·theta^(-2i/d) (or ·freqs[i]; by the opposite angle when "
        "inverse).",
        sharding=_rope_sharding,
    )
)


# -- gradient rules (contract: distir.ops.gradrules) --------------------------------------------
def _attention_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    if douts[1] is not None:
        raise NotDifferentiableError(
            f"the log-sum-exp %{op.outputs[1].name} of Attention is a residual for its gradient; "
            "a gradient flowing into it is not supported"
        )
    q, k, v, *pos = (ctx.primal(x) for x in op.inputs)
    out, lse = (ctx.primal(x) for x in op.outputs)
    attrs: dict[str, Any] = dict(op.attrs.items())
    dq, dk, dv = ctx.op("AttentionGrad", first(douts), q, k, v, out, lse, *pos, **attrs)
    return (dq, dk, dv, *(None for _ in pos))


def _rope_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    attrs: dict[str, Any] = dict(op.attrs.items())
    attrs["inverse"] = not bool(op.attrs.get("inverse", False))
    pos = [ctx.primal(x) for x in op.inputs[1:]]
    return (*ctx.op("Rope", first(douts), *pos, **attrs), *(None for _ in pos))


ATTENTION.fill("grad", _attention_grad)
ROPE.fill("grad", _rope_grad)


# -- torch implementations (contract: distir.ops._torch) ----------------------------------------
# On CPU both attention ops run torch's fused FlashAttention-2 kernels for CPU (the forward
# returns the log-sum-exp; the backward rebuilds the probabilities from it, as the references
# do); on other devices the same formulas run unfused (an S×S temporary per head).
class _Heads(NamedTuple):
    """An attention op's operands in torch's (B, h, S, d) layout, kv heads repeated to h."""

    q: Any
    k: Any
    v: Any
    group: int
    causal: bool
    scale: float
    pos: tuple[Any, Any] | None = None  # (qpos, kpos): global positions (module docstring)
    alibi: tuple[float, ...] | None = None  # ALiBi's slopes, one per query head
    window: int = 0  # a sliding window (module docstring)
    softcap: float = 0.0  # the scores' cap (module docstring)


def _heads(q: Any, k: Any, v: Any, attrs: Attrs, pos: Sequence[Any] = ()) -> _Heads:
    _no_dropout(attrs)
    group = q.shape[2] // max(k.shape[2], 1)
    kh, vh = (t.repeat_interleave(group, dim=2) if group > 1 else t for t in (k, v))
    causal = bool(attrs.get("causal", False))
    return _Heads(
        q.transpose(1, 2),
        kh.transpose(1, 2),
        vh.transpose(1, 2),
        group,
        causal,
        _scale(attrs, q.shape[3]),
        (pos[0], pos[1]) if pos else None,
        _alibi(attrs),
        int_attr(attrs, "window", 0),
        float_attr(attrs, "softcap", 0.0),
    )


def _fused(ctx: TorchContext) -> bool:
    """torch's fused CPU kernels (for the mask by index only: not with positions)."""
    return bool(ctx.device.type == "cpu")


def _scores_torch(ctx: TorchContext, a: _Heads) -> Any:
    """(B, h, S_q, S_k) scaled scores (in f32 for 16-bit inputs), -inf where masked."""
    s = upcast(ctx, a.q) @ upcast(ctx, a.k).transpose(-1, -2) * a.scale
    if a.softcap > 0:
        s = a.softcap * ctx.torch.tanh(s / a.softcap)
    if a.alibi is not None:
        bias = alibi_bias(a.alibi, s.shape[2], s.shape[3], a.pos and tuple(p.cpu().numpy() for p in a.pos))
        s = s + ctx.torch.as_tensor(bias, dtype=s.dtype, device=s.device)
    if a.causal and a.pos is not None:
        qp, kp = a.pos
        s = s.masked_fill(kp[:, None, None, :] > qp[:, None, :, None], -math.inf)
    elif a.causal:
        n = s.shape[-1]
        s = s.masked_fill(ctx.torch.ones((n, n), dtype=ctx.torch.bool, device=s.device).triu(1), -math.inf)
    if a.window > 0:
        n = s.shape[-1]
        s = s.masked_fill(
            ctx.torch.ones((n, n), dtype=ctx.torch.bool, device=s.device).tril(-a.window), -math.inf
        )
    return s


def _attention_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    q = xs[0]
    a = _heads(q, xs[1], xs[2], attrs, xs[3:])
    lse_t = ctx.dtype(lse_dtype(DType.f64 if q.dtype == ctx.torch.float64 else DType.f32))
    if _fused(ctx) and a.pos is None and a.alibi is None and not a.window and not a.softcap:
        kernel = ctx.torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        out, lse = kernel(a.q, a.k, a.v, 0.0, a.causal, scale=a.scale)
    else:
        s = _scores_torch(ctx, a)
        lse = ctx.torch.logsumexp(s, -1)
        out = like(ctx.torch.exp(s - lse[..., None]) @ upcast(ctx, a.v), q)
    return (out.transpose(1, 2), lse.to(lse_t))


def _group_sum_torch(x: Any, group: int) -> Any:
    """(B, h, S, d) -> (B, S, h/group, d): each kv head's group summed (repeat's adjoint)."""
    b, h, s, d = x.shape
    y = x.transpose(1, 2)
    return y if group == 1 else y.reshape(b, s, h // group, group, d).sum(3)


def _attention_grad_unfused(ctx: TorchContext, a: _Heads, dout: Any, out: Any, lse: Any) -> tuple[Any, ...]:
    do, o = upcast(ctx, dout), upcast(ctx, out)
    p = ctx.torch.exp(_scores_torch(ctx, a) - lse.to(do.dtype)[..., None])
    dv = p.transpose(-1, -2) @ do
    delta = (do * o).sum(-1, keepdim=True)
    ds = p * (do @ upcast(ctx, a.v).transpose(-1, -2) - delta) * a.scale
    if a.softcap > 0:  # through the cap's tanh
        raw = upcast(ctx, a.q) @ upcast(ctx, a.k).transpose(-1, -2) * a.scale
        ds = ds * (1.0 - ctx.torch.tanh(raw / a.softcap) ** 2)
    return (
        like(ds @ upcast(ctx, a.k), dout),
        like(ds.transpose(-1, -2) @ upcast(ctx, a.q), dout),
        like(dv, dout),
    )


def _attention_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    dout, q, k, v, out, lse = xs[:6]
    a = _heads(q, k, v, attrs, xs[6:])
    dout_h, out_h = dout.transpose(1, 2), out.transpose(1, 2)
    if _fused(ctx) and a.pos is None and a.alibi is None and not a.window and not a.softcap:
        kernel = ctx.torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
        dq, dk, dv = kernel(dout_h, a.q, a.k, a.v, out_h, lse, 0.0, a.causal, scale=a.scale)
    else:
        dq, dk, dv = _attention_grad_unfused(ctx, a, dout_h, out_h, lse)
    return (dq.transpose(1, 2), _group_sum_torch(dk, a.group), _group_sum_torch(dv, a.group))


@functools.lru_cache(maxsize=64)
def _rope_table(
    seq: int, head_dim: int, theta: float, inverse: bool, freqs: tuple[float, ...] | None, offset: int
) -> tuple[F64, F64]:
    ang = rope_angles(seq, head_dim, theta, freqs, offset)
    return np.cos(-ang if inverse else ang), np.sin(-ang if inverse else ang)


def _rope_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """Llama's rotation (or ``rotate_half``'s with ``halves``): in f32 (f64 for f64), the angles
    from the reference's table."""
    x = xs[0]
    xf = upcast(ctx, x)
    freqs: Any = attrs.get("freqs")
    theta, inverse = float_attr(attrs, "theta", 10000.0), bool(attrs.get("inverse", False))
    fs = tuple(freqs) if freqs is not None else None
    if len(xs) > 1:  # each row's angles from its global position
        per = ctx.torch.from_numpy(rope_angles(1, x.shape[3], theta, fs, 1)[0]).to(x.device)
        ang = xs[1].to(per.dtype)[..., None] * per * (-1.0 if inverse else 1.0)
        cos, sin = (f(ang).to(xf.dtype)[:, :, None, :] for f in (ctx.torch.cos, ctx.torch.sin))
    else:
        table = _rope_table(x.shape[1], x.shape[3], theta, inverse, fs, _offset(attrs))
        cos, sin = (
            ctx.torch.from_numpy(t).to(device=x.device, dtype=xf.dtype)[None, :, None, :] for t in table
        )
    if attrs.get("halves", False):
        h = x.shape[3] // 2
        first, second = xf[..., :h], xf[..., h:]
        y = ctx.torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)
    else:
        even, odd = xf[..., 0::2], xf[..., 1::2]
        y = ctx.torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)
    return (like(y, x),)


def _merge_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    o1, l1, o2, l2 = xs
    t = ctx.torch
    lse = t.logaddexp(l1, l2)
    safe = t.where(t.isfinite(lse), lse, t.zeros_like(lse))
    w1 = t.where(t.isfinite(l1), t.exp(l1 - safe), t.zeros_like(l1))
    w2 = t.where(t.isfinite(l2), t.exp(l2 - safe), t.zeros_like(l2))
    out = w1.transpose(1, 2)[..., None] * upcast(ctx, o1) + w2.transpose(1, 2)[..., None] * upcast(ctx, o2)
    return (like(out, o1), lse)


ATTENTION.fill("torch", _attention_torch)
ATTENTION_GRAD.fill("torch", _attention_grad_torch)
ROPE.fill("torch", _rope_torch)
ATTENTION_MERGE.fill("torch", _merge_torch)

__all__ = [
    "BACKWARD_FACTOR",
    "AttentionDropoutError",
    "attention_grad_reference",
    "attention_merge_reference",
    "attention_reference",
    "forward_flops",
    "heads_split_evenly",
    "is_ring",
    "lse_dtype",
    "repeat_kv",
    "ring_order",
    "rope_angles",
    "scores",
    "window_share",
]
