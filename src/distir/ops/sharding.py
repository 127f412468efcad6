"""Sharding rules: how an op can run on tensors distributed along one mesh axis.

A rule is a function ``(ins, outs, attrs, n) -> list[Strategy]`` of the op's *global* input and
result types, its attributes and the mesh axis size ``n``. A ``Strategy`` is one way to run the op
locally: the placement each input must have and the placement each result then has. Rules list
strategies most preferred first (no communication, then the rest); propagation picks among them
and legalization inserts redistributions where a value's placement differs from what the chosen
strategy needs. Mesh axes are independent: a rule speaks about one axis at a time.

Each op's rule is set in its family's file (``sharding=``); the factories here build the common
ones: pointwise ops with broadcasting, contractions, reductions, ops that need some axes whole,
transposes and reshapes; and for training, gradient ops (most are linear in the incoming
gradient dY, so a pending sum on dY passes through: ``linear_first``), losses (items sharded, their
sum pending) and their gradients, normalization and convolution / pooling gradients (rows or
batch sharded, parameter gradients pending sums).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from distir.ir.dtensor import Partial, Placement, Replicate, Shard, shares_of, split_sizes
from distir.ir.types import TensorType, Type
from distir.ir.values import Attrs

R = Replicate()
SUM = Partial("sum")


@dataclass(frozen=True, slots=True)
class Strategy:
    ins: tuple[Placement, ...]
    outs: tuple[Placement, ...]

    def __str__(self) -> str:
        return f"({', '.join(map(str, self.ins))}) -> ({', '.join(map(str, self.outs))})"


ShardingRule = Callable[[Sequence[Type], Sequence[Type], Attrs, int], list[Strategy]]


def _shape(t: Type) -> tuple[int, ...]:
    return t.shape if isinstance(t, TensorType) else ()


def replicated(ins: Sequence[Type], outs: Sequence[Type]) -> Strategy:
    return Strategy(tuple(R for _ in ins), tuple(R for _ in outs))


def pointwise(partial: str = "none") -> ShardingRule:
    """Elementwise ops with numpy broadcasting. Sharding an output dim shards every input that
    has that dim (size > 1); broadcast inputs stay replicated. ``partial`` says which pending
    reductions pass through: ``"linear"`` (every input partial: Add, Sub, Sum, Neg, Identity),
    ``"scale"`` (the first input partial, the others replicated: Mul, Div) or ``"none"``."""

    def rule(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[Strategy]:
        out = _shape(outs[0])
        found = [replicated(ins, outs)]
        for d in range(len(out)):
            places: list[Placement] = []
            for t in ins:
                s = _shape(t)
                k = d - (len(out) - len(s))
                places.append(Shard(k) if k >= 0 and s[k] == out[d] and out[d] > 1 else R)
            if any(isinstance(p, Shard) for p in places):
                found.append(Strategy(tuple(places), tuple(Shard(d) for _ in outs)))
        if partial == "linear":
            found.append(Strategy(tuple(SUM for _ in ins), tuple(SUM for _ in outs)))
        elif partial == "scale":
            found.append(Strategy((SUM, *(R for _ in ins[1:])), tuple(SUM for _ in outs)))
        return found

    return rule


def cast_rule() -> ShardingRule:
    """Cast: pointwise; a pending sum passes through a widening float cast (bf16/f16 to f32:
    every value is kept exactly, so the cast of a sum is the sum of the casts), as mixed-precision
    trainers cast each rank's gradient before they reduce it (DeepSpeed's BF16_Optimizer)."""
    base = pointwise()

    def rule(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[Strategy]:
        found = base(ins, outs, attrs, n)
        a, b = ins[0], outs[0]
        if isinstance(a, TensorType) and isinstance(b, TensorType):
            widening = a.dtype.is_float and b.dtype.is_float and b.dtype.itemsize > a.dtype.itemsize
            if widening:
                found.append(Strategy((SUM,), (SUM,)))
        return found

    return rule


def mul_rule() -> ShardingRule:
    """Mul: pointwise, and a pending sum may be on either side (the other replicated)."""
    base = pointwise("scale")

    def rule(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[Strategy]:
        return [*base(ins, outs, attrs, n), Strategy((R, SUM), (SUM,))]

    return rule


def matmul(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[Strategy]:
    """A[..., m, k] @ B[..., k, n]: shard m (rows of A), n (columns of B), a batch dim (both), or
    k (both: a pending sum); a pending sum on one side passes through with the other replicated.
    ``transA``/``transB`` (an operand stored with its last two dims swapped) swap which of its
    dims is m/k (k/n): the placements a Transpose before the plain product would have led to."""
    a, b, y = _shape(ins[0]), _shape(ins[1]), _shape(outs[0])
    if len(a) < 2 or len(b) < 2:
        return [replicated(ins, outs)]
    ta, tb = bool(attrs.get("transA", 0)), bool(attrs.get("transB", 0))
    a_m, a_k = (len(a) - 1, len(a) - 2) if ta else (len(a) - 2, len(a) - 1)
    b_k, b_n = (len(b) - 1, len(b) - 2) if tb else (len(b) - 2, len(b) - 1)
    found = [replicated(ins, outs)]
    found.append(Strategy((Shard(a_m), R), (Shard(len(y) - 2),)))
    found.append(Strategy((R, Shard(b_n)), (Shard(len(y) - 1),)))
    for d in range(len(y) - 2):  # batch dims, aligned from the right
        ka, kb = d - (len(y) - len(a)), d - (len(y) - len(b))
        pa = Shard(ka) if ka >= 0 and a[ka] == y[d] and y[d] > 1 else R
        pb = Shard(kb) if kb >= 0 and b[kb] == y[d] and y[d] > 1 else R
        if isinstance(pa, Shard) or isinstance(pb, Shard):
            found.append(Strategy((pa, pb), (Shard(d),)))
    found.append(Strategy((Shard(a_k), Shard(b_k)), (SUM,)))
    found.append(Strategy((SUM, R), (SUM,)))
    found.append(Strategy((R, SUM), (SUM,)))
    return found


def gemm(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[Strategy]:
    """Gemm(A, B, C?) with transposes: rows, columns, or the contraction (bias then replicated
    on one... not allowed: a sharded contraction with a bias would add it n times)."""
    ta, tb = bool(attrs.get("transA", 0)), bool(attrs.get("transB", 0))
    m_dim, ka = (1, 0) if ta else (0, 1)
    kb, n_dim = (1, 0) if tb else (0, 1)
    c = _shape(ins[2]) if len(ins) == 3 else None

    def bias(p: Placement, d: int) -> tuple[Placement, ...]:
        if c is None:
            return ()
        k = d - (2 - len(c))
        y = _shape(outs[0])
        return (Shard(k) if isinstance(p, Shard) and k >= 0 and c[k] == y[d] and y[d] > 1 else R,)

    found = [replicated(ins, outs)]
    found.append(Strategy((Shard(m_dim), R, *bias(Shard(0), 0)), (Shard(0),)))
    found.append(Strategy((R, Shard(n_dim), *bias(Shard(1), 1)), (Shard(1),)))
    if c is None:
        found.append(Strategy((Shard(ka), Shard(kb)), (SUM,)))
        found.append(Strategy((SUM, R), (SUM,)))
        found.append(Strategy((R, SUM), (SUM,)))
    return found


def _axes(attrs: Attrs, rank: int, name: str = "axes") -> list[int] | None:
    axes: Any = attrs.get(name)
    if axes is None or axes == ():
        return None
    return [a % rank for a in axes]


def _even(size: int, n: int) -> bool:
    """Whether a dim of ``size`` shards in equal pieces along an axis of ``n`` devices (a mean of
    the pieces' means is the mean only then; an axis with uneven shares never)."""
    return size % n == 0 and shares_of(n) is None


def reduction(op: str) -> ShardingRule:
    """ReduceSum / ReduceMean / ReduceMax over ``axes``: a dim not reduced may stay sharded; a
    reduced dim that is sharded leaves a pending reduction (sum, max; mean only when shards are
    even), and a pending reduction of the same kind passes through."""

    def rule(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[Strategy]:
        x = _shape(ins[0])
        axes = _axes(attrs, len(x)) or list(range(len(x)))
        keep = bool(attrs.get("keepdims", 1))
        found = [replicated(ins, outs)]
        for d in range(len(x)):
            if d in axes:
                even = _even(x[d], n)
                if op != "mean" or even:
                    found.append(Strategy((Shard(d),), (Partial(op),)))
                continue
            od = d if keep else d - sum(1 for a in axes if a < d)
            found.append(Strategy((Shard(d),), (Shard(od),)))
        found.append(Strategy((Partial(op),), (Partial(op),)))
        return found

    return rule


def whole_axes(
    attr: str = "axis", to_end: bool = False, extra_inputs: str = "R", partial: str = "none"
) -> ShardingRule:
    """Ops that need the dims they normalize over whole (Softmax along ``axis``; LayerNorm /
    RMSNorm from ``axis`` to the end): any other dim may be sharded. ``extra_inputs`` says how
    the inputs after the first are placed then: ``"R"`` (scale, bias: replicated) or ``"same"``
    (sharded alike: SoftmaxGrad's Y). ``partial="scale"`` adds a pending sum on the first input,
    the others replicated, passing to every result (ops linear in their first input: gradients
    in dY)."""
    if extra_inputs not in ("R", "same") or partial not in ("none", "scale"):
        raise ValueError(f"whole_axes: extra_inputs={extra_inputs!r}, partial={partial!r} not supported")

    def rule(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[Strategy]:
        x = _shape(ins[0])
        a: Any = attrs.get(attr, -1)
        a %= max(len(x), 1)
        busy = set(range(a, len(x))) if to_end else {a}
        found = [replicated(ins, outs)]
        for d in range(len(x)):
            if d not in busy and x[d] > 1:
                rest = tuple(Shard(d) if extra_inputs == "same" else R for _ in ins[1:])
                found.append(Strategy((Shard(d), *rest), tuple(Shard(d) for _ in outs)))
        if partial == "scale":
            found.append(linear_first(ins, outs))
        return found

    return rule


def linear_first(ins: Sequence[Type], outs: Sequence[Type]) -> Strategy:
    """A pending sum on the first input, the others replicated, passes to every result: the
    strategy of an op linear in its first input (a gradient op in the incoming gradient dY)."""
    return Strategy((SUM, *(R for _ in ins[1:])), tuple(SUM for _ in outs))


def norm_grad(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[Strategy]:
    """LayerNormalizationGrad / RMSNormalizationGrad ``(dY, X, Scale) -> (dX, dScale[, dB])``
    over the axes ``[axis, rank)``: a row dim (before ``axis``) sharded in dY and X shards dX
    alike, and dScale / dB (sums over the rows: Scale broadcasts over them) become pending sums;
    a pending sum on dY (X, Scale replicated) passes to every result (all linear in dY)."""
    x = _shape(ins[1])
    a: Any = attrs.get("axis", -1)
    a %= max(len(x), 1)
    found = [replicated(ins, outs)]
    for d in range(a):
        if x[d] > 1:
            found.append(Strategy((Shard(d), Shard(d), R), (Shard(d), *(SUM for _ in outs[1:]))))
    found.append(linear_first(ins, outs))
    return found


def transpose(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[Strategy]:
    x = _shape(ins[0])
    perm: Any = attrs.get("perm") or tuple(reversed(range(len(x))))
    found = [replicated(ins, outs), Strategy((SUM,), (SUM,))]
    for od, idim in enumerate(perm):
        found.append(Strategy((Shard(idim),), (Shard(od),)))
    return found


def reshape_dim_map(src: Sequence[int], dst: Sequence[int], n: int) -> dict[int, int]:
    """Which input dim's sharding carries to which output dim through a reshape: the first dim of
    each group of dims whose sizes multiply to the same product, when the shard boundaries agree
    (a split of an input dim needs its leading factor's shards to line up; a merge keeps the
    leading input dim's shards)."""
    out: dict[int, int] = {}
    i = j = 0
    while i < len(src) and j < len(dst):
        gi, gj = [i], [j]
        pi, pj = src[i], dst[j]
        while pi != pj:
            if pi < pj:
                i += 1
                if i >= len(src):
                    return out
                gi.append(i)
                pi *= src[i]
            else:
                j += 1
                if j >= len(dst):
                    return out
                gj.append(j)
                pj *= dst[j]
        # a group's leading size-1 dims (a dim added or dropped) carry nothing: its first real dim leads
        lead_in = next((k for k in gi if src[k] > 1), gi[0])
        lead_out = next((k for k in gj if dst[k] > 1), gj[0])
        if src[lead_in] > 1:
            inner_in = math.prod(src[k] for k in gi if k > lead_in)
            inner_out = math.prod(dst[k] for k in gj if k > lead_out)
            a = [s * inner_in for s in split_sizes(src[lead_in], n)]
            b = [s * inner_out for s in split_sizes(dst[lead_out], n)]
            if a == b:
                out[lead_in] = lead_out
        i += 1
        j += 1
    return out


def reshape(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[Strategy]:
    """Reshape, Squeeze, Unsqueeze: a pending sum passes through; a sharded dim carries over per
    ``reshape_dim_map``. Extra inputs (Reshape's target shape) are replicated."""
    x, y = _shape(ins[0]), _shape(outs[0])
    found = [replicated(ins, outs), Strategy((SUM, *(R for _ in ins[1:])), (SUM,))]
    for i, o in reshape_dim_map(x, y, n).items():
        found.append(Strategy((Shard(i), *(R for _ in ins[1:])), (Shard(o),)))
    return found


def other_dims(attr: str, default: int = 0) -> ShardingRule:
    """Split / Concat / Gather-like ops that work along ``attr``: any other dim may be sharded
    (in every input and result alike)."""

    def rule(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[Strategy]:
        x = _shape(ins[0])
        a: Any = attrs.get(attr, default)
        a %= max(len(x), 1)
        found = [replicated(ins, outs)]
        for d in range(len(x)):
            if d != a and x[d] > 1:
                found.append(Strategy(tuple(Shard(d) for _ in ins), tuple(Shard(d) for _ in outs)))
        return found

    return rule


def embedding(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[Strategy]:
    """Gather(table, indices) along axis 0: the table replicated, the indices sharded on any dim
    (the result sharded on the same dim), or the table sharded on its other dims, or on its rows
    with the indices whole: each device looks up the indices its rows hold, zeros for the others
    (Gather's ``rows``), so the result is a pending sum — Megatron's vocabulary-parallel
    embedding."""
    t, idx = _shape(ins[0]), _shape(ins[1])
    axis: Any = attrs.get("axis", 0)
    if axis % max(len(t), 1) != 0:
        return [replicated(ins, outs)]
    found = [replicated(ins, outs)]
    for d in range(len(idx)):
        if idx[d] > 1:
            found.append(Strategy((R, Shard(d)), (Shard(d),)))
    for d in range(1, len(t)):
        if t[d] > 1:
            found.append(Strategy((Shard(d), R), (Shard(len(idx) + d - 1),)))
    if t and t[0] > 1:
        found.append(Strategy((Shard(0), R), (SUM,)))
    return found


def replicate_only(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[Strategy]:
    return [replicated(ins, outs)]


def windowed(kind: str) -> ShardingRule:
    """Conv (``kind="conv"``: X, W, B?) and pooling (``"pool"``: X) over (N, C, *spatial):
    shard the batch, the output channels (conv: W's first dim), the input channels (conv without
    bias or groups: a pending sum), or one spatial dim — the latter needs rows of the neighbouring
    shards (a halo), which materialization exchanges with Sends; offered only when every shard of
    the input and of the result is non-empty and without ceil mode."""

    def rule(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[Strategy]:
        x, y = _shape(ins[0]), _shape(outs[0])
        rest = tuple(R for _ in ins[1:])
        found = [replicated(ins, outs)]
        if x and x[0] > 1:
            found.append(Strategy((Shard(0), *rest), (Shard(0),)))
        group: Any = attrs.get("group", 1)
        if kind == "pool" and x[1] > 1:
            found.append(Strategy((Shard(1),), (Shard(1),)))
        if kind == "conv" and group == 1:
            w = _shape(ins[1])
            if w[0] > 1:
                found.append(Strategy((R, Shard(0), *(Shard(0) for _ in ins[2:])), (Shard(1),)))
            if len(ins) == 2 and x[1] > 1:
                found.append(Strategy((Shard(1), Shard(1)), (SUM,)))
        if not attrs.get("ceil_mode", 0):
            for d in range(2, len(x)):
                if x[d] >= n and y[d] >= n:
                    found.append(Strategy((Shard(d), *rest), (Shard(d),)))
        return found

    return rule


def windowed_grad(kind: str) -> ShardingRule:
    """ConvGrad (``kind="conv"``: ``(dY, X, W) -> (dX, dW, dB)``) and MaxPoolGrad /
    AveragePoolGrad (``"pool"``: ``(dY, X) -> dX``) over (N, C, *spatial). The batch sharded in
    dY and X shards dX alike; dW and dB sum over the batch, so they become pending sums. Every
    result is linear in dY (pooling routes dY by X alone), so a pending sum on dY (the rest
    replicated) passes through. Channels: pooling works per channel (dY, X, dX sharded alike);
    an ungrouped conv may shard its output channels (dY's dim 1 and W's dim 0: dW and dB sharded
    alike, dX a pending sum over them) or its input channels (X's dim 1 and W's dim 1: dX and dW
    sharded alike, dB from the whole dY, replicated). Spatial dims are never sharded (no halo
    for gradients)."""
    if kind not in ("conv", "pool"):
        raise ValueError(f"windowed_grad: kind must be 'conv' or 'pool', got {kind!r}")

    def rule(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[Strategy]:
        dy, x = _shape(ins[0]), _shape(ins[1])
        found = [replicated(ins, outs)]
        if x[0] > 1:
            found.append(
                Strategy((Shard(0), Shard(0), *(R for _ in ins[2:])), (Shard(0), *(SUM for _ in outs[1:])))
            )
        if kind == "pool" and x[1] > 1:
            found.append(Strategy((Shard(1), Shard(1)), (Shard(1),)))
        if kind == "conv" and attrs.get("group", 1) == 1:
            if dy[1] > 1:
                found.append(Strategy((Shard(1), R, Shard(0)), (SUM, Shard(0), Shard(0))))
            if x[1] > 1:
                found.append(Strategy((R, Shard(1), Shard(1)), (Shard(1), Shard(1), R)))
        found.append(linear_first(ins, outs))
        return found

    return rule


def _item_dims(kind: str, first: tuple[int, ...], attrs: Attrs) -> list[tuple[int, int]]:
    """(dim of scores / prediction, dim of labels / target and of the per-item loss) pairs a loss
    may shard: for cross entropy every dim of the scores but the classes (attribute ``axis``,
    default dim 1), for squared error every dim."""
    if kind == "ce":
        axis = attrs.get("axis", 1)
        assert isinstance(axis, int)
        classes = axis % len(first) if first else 0
        pairs = [(d, d if d < classes else d - 1) for d in range(len(first)) if d != classes]
    else:
        pairs = [(d, d) for d in range(len(first))]
    return [(a, b) for a, b in pairs if first[a] > 1]


def loss(kind: str) -> ShardingRule:
    """SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss (``kind="ce"``: scores, labels) and
    MSELoss (``"mse"``: prediction, target): the loss of each item depends on that item only
    (for cross entropy: on all its classes), so the inputs may be sharded along an item dim
    (``_item_dims``). Then the
    per-item losses (reduction ``"none"``) are sharded alike, their ``"sum"`` is a pending sum,
    and their ``"mean"`` a pending mean — only when the shards are even (a local mean is an equal
    share of the global mean only then)."""
    if kind not in ("ce", "mse"):
        raise ValueError(f"loss: kind must be 'ce' or 'mse', got {kind!r}")

    def rule(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[Strategy]:
        first = _shape(ins[0])
        how = attrs.get("reduction", "mean")
        found = [replicated(ins, outs)]
        for a, b in _item_dims(kind, first, attrs):
            if how == "none":
                found.append(Strategy((Shard(a), Shard(b)), (Shard(b),)))
            elif how == "sum":
                found.append(Strategy((Shard(a), Shard(b)), (SUM,)))
            elif how == "mean" and _even(first[a], n):
                found.append(Strategy((Shard(a), Shard(b)), (Partial("mean"),)))
        return found

    return rule


def loss_grad(kind: str) -> ShardingRule:
    """SoftmaxCrossEntropyLossGrad / NegativeLogLikelihoodLossGrad / MSELossGrad ``(dLoss,
    scores | prediction, labels | target) -> dScores | dPrediction``: with the inputs sharded
    along an item dim (``_item_dims``), the gradient is sharded alike, for reduction ``"sum"``
    (dLoss, 0-d, replicated) and ``"none"`` (dLoss, per item, sharded like the items); not for
    ``"mean"``, whose gradient divides by the global item count, which a shard does not see. The
    gradient is linear in dLoss: a pending sum on dLoss (the rest replicated) passes through."""
    if kind not in ("ce", "mse"):
        raise ValueError(f"loss_grad: kind must be 'ce' or 'mse', got {kind!r}")

    def rule(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int) -> list[Strategy]:
        first = _shape(ins[1])
        how = attrs.get("reduction", "mean")
        found = [replicated(ins, outs)]
        for a, b in _item_dims(kind, first, attrs):
            if how == "none":
                found.append(Strategy((Shard(b), Shard(a), Shard(b)), (Shard(a),)))
            elif how == "sum":
                found.append(Strategy((R, Shard(a), Shard(b)), (Shard(a),)))
        found.append(linear_first(ins, outs))
        return found

    return rule
