"""Materializing ring attention: an attention op whose sequence is split over a mesh axis as a
ring (``Attention`` / ``AttentionGrad`` with ``ring`` = c, every sequence-shaped operand
``Shard(1)`` along an axis of c devices: ``distir.ops.attention``, ring) becomes, per group of
devices along that axis, the explicit ring of ``distir.parallel.context``: each device cuts its
pieces into its two load-balanced chunks (``Slice``), runs the blocks (``Attention`` /
``AttentionGrad`` of one query chunk against one key chunk; fully masked blocks skipped), passes
K/V (and, backward, dK/dV) to the next device with ``Send`` and merges the partial results by
their log-sum-exps (``AttentionMerge``); then joins its chunks again (``Concat``). The devices
of a group are the ring's ranks in their order along the axis (rank r holds chunks r and
2c−1−r: the order the ``ring`` attribute promises).

The materialized form has no communication streams (a ``Send`` blocks sender and receiver); the
SPMD simulation times the ring with its transfers overlapped (``distir.sim.ring``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import DTensorType, Mesh, Shard
from distir.ir.ops import Op
from distir.ir.types import Device, Type
from distir.ir.values import Attrs, Value
from distir.ops.attention import ATTENTION, ATTENTION_GRAD, is_ring
from distir.parallel.context import Local, Pair, Ring, ring_backward, ring_forward

_SEQ = Shard(1)


class RingOperands(NamedTuple):
    """Where an attention op keeps the operands the ring needs: q, k, v, and (backward) dout,
    out, lse (input indices; None when absent)."""

    q: int
    k: int
    v: int
    dout: int | None = None
    out: int | None = None
    lse: int | None = None


RING_OPERANDS = {
    ATTENTION.name: RingOperands(0, 1, 2),
    ATTENTION_GRAD.name: RingOperands(1, 2, 3, 0, 4, 5),
}


def ring_axis(name: str, attrs: Attrs, types: Sequence[Type | None]) -> int | None:
    """The mesh axis an op ``name`` on inputs of ``types`` runs its ring along, or None when it
    is not a ring (module docstring)."""
    where = RING_OPERANDS.get(name)
    if where is None:
        return None
    q, k = types[where.q], types[where.k]
    if not isinstance(q, DTensorType) or not isinstance(k, DTensorType):
        return None
    for ax, (pq, pk) in enumerate(zip(q.placements, k.placements, strict=True)):
        if pq == _SEQ and pk == _SEQ and is_ring(attrs, q.mesh.shape[ax]):
            return ax
    return None


def lower_ring(fb: FunctionBuilder, op: Op, mesh: Mesh, local: dict[tuple[Value, Device], Value]) -> bool:
    """Lower ``op`` as a ring when it is one (module docstring); False otherwise."""
    ax = ring_axis(op.name, op.attrs, [v.type for v in op.inputs])
    if ax is None:
        return False
    where = RING_OPERANDS[op.name]
    attrs = {k: v for k, v in op.attrs.items() if k not in ("causal", "ring")}
    causal = bool(op.attrs.get("causal", False))
    tag = f"{op.outputs[0].name}_"
    c = mesh.shape[ax]

    def halves(i: int, d: Device, dim: int = 1) -> Pair:
        v = op.inputs[i]
        assert isinstance(v.type, DTensorType)
        return _halves(fb, local[(v, d)], v.type.shape[dim] // (2 * c), dim)

    for group in mesh.groups(ax):
        ring = Ring(fb, group, causal, attrs=attrs, tag=tag)

        ranks = [
            Local(
                halves(where.q, d),
                halves(where.k, d),
                halves(where.v, d),
                halves(where.dout, d) if where.dout is not None else None,
            )
            for d in group
        ]
        if where.dout is None:
            fwd = ring_forward(ring, ranks)
            for d, ((o0, l0), (o1, l1)) in zip(group, fwd, strict=True):
                _join(fb, local, op.outputs[0], d, (o0, o1), 1)
                _join(fb, local, op.outputs[1], d, (l0, l1), 2)
            continue
        assert where.out is not None and where.lse is not None
        merged = []
        for d in group:
            o, lse = halves(where.out, d), halves(where.lse, d, 2)
            merged.append(((o[0], lse[0]), (o[1], lse[1])))
        for d, grads in zip(group, ring_backward(ring, ranks, merged), strict=True):
            for out, pair in zip(op.outputs, grads, strict=True):
                _join(fb, local, out, d, pair, 1)
    return True


def _halves(fb: FunctionBuilder, x: Value, n: int, dim: int) -> Pair:
    """A device's piece cut into its two chunks of ``n`` along ``dim``."""
    parts: list[Any] = [
        fb.op("Slice", x, names=[f"{x.name}_h{i}"], starts=[i * n], ends=[(i + 1) * n], axes=[dim])[0]
        for i in (0, 1)
    ]
    return parts[0], parts[1]


def _join(
    fb: FunctionBuilder,
    local: dict[tuple[Value, Device], Value],
    v: Value,
    d: Device,
    pair: Sequence[Value],
    dim: int,
) -> None:
    (local[(v, d)],) = fb.op("Concat", *pair, names=[f"{v.name}.{d}"], axis=dim)


__all__ = ["RING_OPERANDS", "RingOperands", "lower_ring", "ring_axis"]
