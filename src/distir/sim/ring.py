"""Simulating ring attention on DTensors (SPMD): an attention op whose sequence is split over a
mesh axis as a ring (``distir.parallel.sharding.ring``) as one record over its mesh.

Its time is the ring's, step by step, as Megatron-LM / Transformer Engine run it
(``AttnFuncWithCPAndKVP2P``): at each of the c steps a rank computes its blocks against the K/V
it holds (``distir.parallel.context.ring_blocks``: the load-balanced layout gives every rank the
same blocks per step; a diagonal block costs the kernel's causal time, about half a full one;
fully masked blocks are skipped) while the next K/V travel to it, so a step lasts the longer of
the two:

``distir.parallel.context.ring_time``: forward Σ_{s<c−1} max(C_s, T) + C_{c−1}, backward
max(C_0, T) + Σ_{0<s<c−1} max(C_s, 2T) + max(C_{c−1}, T) + T; C_s the step's blocks and the ops
combining them (``ring_step_work``: log-sum-exp merges, Adds) on the GPU, each block at the cost
model's fused-attention time for its shape; T the transfer of a rank's K and V (one message, as
Transformer Engine packs them) over the slowest hop of the ring (each hop costed as a lone
point-to-point send, as ``MeshSend``'s are: concurrent rings crossing one network link are not
made to share it).

Memory: the op's results, plus the ring's buffers while it runs (the screen's figures,
``distir.search.context_cost``): the K/V received beside the ones held, 2 × K/V bytes forward;
with the travelling dK/dV, 4 × K/V bytes backward.
"""

from __future__ import annotations

from collections.abc import Sequence

from distir.ir.dtensor import DTensorType
from distir.ir.ops import Op
from distir.ir.types import TensorType, Type
from distir.ir.values import Attrs
from distir.ops.attention import ATTENTION, ATTENTION_GRAD, ATTENTION_MERGE, lse_dtype
from distir.ops.elementwise import ADD
from distir.ops.registry import CommPattern, OpDef
from distir.parallel.context import ring_step_work, ring_time
from distir.parallel.sharding.ring import RING_OPERANDS
from distir.sim.layout import local_piece, mesh_info, piece_bytes
from distir.sim.records import OpRecord
from distir.sim.units import Units, per_gpu

EMPTY = Attrs({})


def ring_record(dom: Units, op: Op, ins: Sequence[Type], outs: Sequence[Type], ax: int) -> OpRecord:
    """The record of ``op`` run as a ring along mesh axis ``ax`` (module docstring)."""
    where = RING_OPERANDS[op.name]
    q, k = ins[where.q], ins[where.k]
    assert isinstance(q, DTensorType) and isinstance(k, DTensorType)
    mesh = q.mesh
    c = mesh.shape[ax]
    units = dom.mesh_units(mesh)
    backward = where.dout is not None
    kv = 2.0 * piece_bytes(k, 0)  # a rank's K and V pieces (even shards along the ring)
    hop = 0.0
    for g in mesh_info(mesh).groups(ax):
        for i in range(c):
            pair = (mesh.devices[g[i]], mesh.devices[g[(i + 1) % c]])
            hop = max(hop, dom.comm_seconds(CommPattern.P2P, kv, pair))
    steps = [0.0] * c
    flops = 0.0
    for _unit, rep, pos, count in units:
        per_step, f = _compute(dom, op, ins, outs, rep, pos, c, backward)
        steps = [max(a, b) for a, b in zip(steps, per_step, strict=True)]
        flops += f * count
    seconds = ring_time(steps, hop, backward)
    per, allocs, bump = dom.sizes(outs, False)
    extra = (4.0 if backward else 2.0) * kv
    gpu_of = dom.slot_gpu
    bump = per_gpu([*bump, *((gpu_of[u], extra) for u, *_ in units)])
    devs = tuple(sorted(u for u, *_ in units))
    return OpRecord(devs, seconds, False, op.name, flops, False, per, allocs, bump, None)


def _chunk(t: Type, dim: int) -> TensorType:
    """A rank's piece cut in half along ``dim`` (one of its two chunks)."""
    assert isinstance(t, TensorType)
    shape = list(t.shape)
    shape[dim] //= 2
    return TensorType(t.dtype, tuple(shape), t.device)


def _compute(
    dom: Units,
    op: Op,
    ins: Sequence[Type],
    outs: Sequence[Type],
    rep: object,
    pos: int,
    c: int,
    backward: bool,
) -> tuple[list[float], float]:
    """Per step, the slowest rank's compute on the unit's device; the unit's FLOPs per device."""
    where = RING_OPERANDS[op.name]
    gpu = dom.dev_gpu[rep]  # type: ignore[index]
    lq = _chunk(local_piece(ins[where.q], rep, pos), 1)  # type: ignore[arg-type]
    lk = _chunk(local_piece(ins[where.k], rep, pos), 1)  # type: ignore[arg-type]
    lo = _chunk(local_piece(outs[0], rep, pos), 1)  # type: ignore[arg-type]
    lse = TensorType(lse_dtype(lq.dtype), (lq.shape[0], lq.shape[2], lq.shape[1]), lq.device)
    causal = bool(op.attrs.get("causal", False))
    base = {k: v for k, v in op.attrs.items() if k != "ring"}

    def cost(
        od: OpDef, a: Sequence[TensorType], b: Sequence[TensorType], diag: bool | None = None
    ) -> tuple[float, float]:
        at = Attrs({**base, "causal": bool(diag)}) if od in (ATTENTION, ATTENTION_GRAD) else EMPTY
        shapes = tuple((x.dtype, x.shape) for x in (*a, *b))
        key = ("ring", od.name, at, *shapes, dom.gpu_class_of(rep))  # type: ignore[arg-type]
        got = dom.local_costs.get(key)
        if got is None:
            got = dom.local_costs[key] = (
                float(dom.cost.compute_time(od, list(a), list(b), at, gpu)),
                float(od.flops(list(a), list(b), at)),
            )
        return got

    # a block's operands: (dout, q, k, v, out, lse) -> (dq, dk, dv), or (q, k, v) -> (out, lse)
    block = ([lo, lq, lk, lk, lo, lse], [lq, lk, lk]) if backward else ([lq, lk, lk], [lo, lse])
    kernel = ATTENTION_GRAD if backward else ATTENTION
    merge = cost(ATTENTION_MERGE, [lo, lse, lo, lse], [lo, lse])[0]
    add_q, add_k = cost(ADD, [lq, lq], [lq])[0], cost(ADD, [lk, lk], [lk])[0]
    steps = []
    flops = 0.0
    for s in range(c):
        worst = 0.0
        for r in range(c):
            work = ring_step_work(c, r, s, causal, backward)
            t = work.merges * merge + work.q_adds * add_q + work.kv_adds * add_k
            for _x, _y, diag in work.blocks:
                sec, f = cost(kernel, *block, diag)
                t += sec
                if r == 0:
                    flops += f
            worst = max(worst, t)
        steps.append(worst)
    return steps, flops
