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

**Torch's ring** (the cost model's ``ring_form`` = ``torch``: torch.distributed.tensor.experimental
``context_parallel``, as torchtitan runs it) is timed as that code runs it
(``distir.parallel.context.torch_ring_time``): one flash call per rank and step on the rank's
concatenated chunks (``torch_ring_call``); the K/V all-gathered over the ring once (its default
rotate method) rather than passed per step; the partial outputs and log-sum-exps merged in fp32
(``_SDPAMerger`` with ``convert_to_f32``: the block's out cast to fp32, then ``AttentionMerge`` on
fp32, the merged out cast back once), and backward dQ, dK and dV accumulated in fp32 (an fp32
``Add`` per step, a cast back at the end), the dK/dV passed rank to rank in fp32. The K/V its
flash calls take have the queries' heads (the flash op, ``aten._scaled_dot_product_flash_attention``,
takes no fewer K/V heads: a grouped-query model's K/V reach it repeated, as torchtitan's
``repeat_kv`` repeats them), so the all-gather and the dK/dV carry that many. Under torch.compile
(the cost model's ``fuse``) every collective is waited where it is issued (``torch_ring_time``).
Its copies (``torch.cat``, each charged as a ``Concat`` pass over what it writes): the K and V
concatenated into the rotater's input (``torch.cat([key.flatten(), value.flatten()])``) at the
first step, eager at every step but the last (compiled, the later ones feed nothing and are dead
code); ``_partial_update``, which updates one chunk of an fp32 accumulator and concatenates the
two — the merged out and its log-sum-exp on a rank that takes only its second query chunk, dQ
likewise backward, dK and dV on a rank that takes only the first K/V chunk — compiled a pass over
the chunk left unchanged (Inductor's pointwise ``cat`` writes the updated chunk from the merge or
add), eager over both; and eager, the dK/dV concatenated for the next rank at every step
(compiled, the adds write into that buffer).
Memory beside the results, at the fullest step (``_templated_ring_attention`` and its backward,
torch/distributed/tensor/experimental/_attention.py): the gathered K/V (c × a rank's K/V), the
running fp32 out and the merged one made beside it (``_SDPAMerger``: ``out - sigmoid(...) * (out -
block_out)``, then ``_partial_update``'s ``torch.cat``), and the step's flash out; backward, the
gathered K/V, the fp32 dQ, dK, dV, the dK/dV sent and received, and the step's flash dQ, dK, dV
in the compute dtype (``grad_query_``, ``grad_key_``, ``grad_value_``), added into the fp32 ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from distir.ir.dtensor import DTensorType
from distir.ir.ops import Op
from distir.ir.types import _ITEMSIZE, Device, DType, TensorType, Type
from distir.ir.values import Attrs
from distir.ops.attention import ATTENTION, ATTENTION_GRAD, ATTENTION_MERGE, lse_dtype
from distir.ops.elementwise import ADD, CAST
from distir.ops.registry import CommPattern, OpDef
from distir.ops.shape.join import CONCAT
from distir.parallel.context import ring_step_work, ring_time, torch_ring_call, torch_ring_time
from distir.parallel.sharding.ring import RING_OPERANDS
from distir.sim.layout import local_piece, mesh_info, piece_bytes
from distir.sim.records import OpRecord
from distir.sim.units import Units, per_gpu

EMPTY = Attrs({})
F32 = DType.f32


def ring_record(dom: Units, op: Op, ins: Sequence[Type], outs: Sequence[Type], ax: int) -> OpRecord:
    """The record of ``op`` run as a ring along mesh axis ``ax`` (module docstring)."""
    where = RING_OPERANDS[op.name]
    q, k = ins[where.q], ins[where.k]
    assert isinstance(q, DTensorType) and isinstance(k, DTensorType)
    mesh = q.mesh
    c = mesh.shape[ax]
    units = dom.mesh_units(mesh)
    backward = where.dout is not None
    groups = [tuple(mesh.devices[i] for i in g) for g in mesh_info(mesh).groups(ax)]
    torch_form = getattr(dom.cost, "ring_form", "p2p") == "torch"
    # a rank's K and V pieces (even shards along the ring); torch's: with the queries' heads
    kv = 2.0 * piece_bytes(q if torch_form else k, 0)
    hop = _hop(dom, groups, kv * (4.0 / _itemsize(q.dtype) if torch_form and backward else 1.0))
    compute = _torch_compute if torch_form else _compute
    steps = [0.0] * c
    flops = 0.0
    for _unit, rep, pos, count in units:
        per_step, f = compute(dom, op, ins, outs, rep, pos, c, backward)
        steps = [max(a, b) for a, b in zip(steps, per_step, strict=True)]
        flops += f * count
    if torch_form:
        gather = max(dom.comm_seconds(CommPattern.ALLGATHER, c * kv, g) for g in groups)
        waited = bool(getattr(dom.cost, "fuse", False))
        seconds = torch_ring_time(steps, gather, hop, backward, waited)
        parts = _torch_buffers(q, kv, c, backward)
    else:
        seconds = ring_time(steps, hop, backward)
        parts = ((4.0 if backward else 2.0) * kv,)
    per, allocs, bump = dom.sizes(outs, False)
    gpu_of = dom.slot_gpu
    bump = per_gpu([*bump, *((gpu_of[u], sum(parts)) for u, *_ in units)])
    scratch = tuple((gpu_of[u], b) for u, *_ in units for b in parts) if torch_form else ()
    devs = tuple(sorted(u for u, *_ in units))
    return OpRecord(devs, seconds, False, op.name, flops, False, per, allocs, bump, None, scratch=scratch)


def _itemsize(dtype: DType) -> float:
    return float(_ITEMSIZE[dtype])


def _hop(dom: Units, groups: Sequence[tuple[Device, ...]], nbytes: float) -> float:
    """The slowest hop of ``nbytes`` from a rank to the next over the rings ``groups``."""
    hop = 0.0
    for g in groups:
        for i in range(len(g)):
            hop = max(hop, dom.comm_seconds(CommPattern.P2P, nbytes, (g[i], g[(i + 1) % len(g)])))
    return hop


def _torch_buffers(q: DTensorType, kv: float, c: int, backward: bool) -> tuple[float, ...]:
    """Torch's ring's buffers beside its results (module docstring), one per tensor, ``kv`` a
    rank's K and V: at its fullest step, the gathered K/V, the fp32 accumulators and the step's
    flash results."""
    piece = piece_bytes(q, 0)  # a rank's queries: a step's out, as its dQ
    f32 = 4.0 / _itemsize(q.dtype)
    out32 = f32 * piece  # the fp32 out, as dQ: the queries' shape
    if not backward:  # the running fp32 out, the merged one made beside it, the step's out
        return (c * kv, out32, out32, piece)
    # gathered K/V, dQ, dK/dV accumulated (the buffer received), sent (their concatenation) and
    # in flight, the step's dQ, dK, dV
    return (c * kv, out32, f32 * kv, f32 * kv, f32 * kv, piece, kv / 2.0, kv / 2.0)


def _chunk(t: Type, dim: int, n: int = 1) -> TensorType:
    """``n`` of the two chunks a rank's piece holds along ``dim`` (n = 1: one of them)."""
    assert isinstance(t, TensorType)
    shape = list(t.shape)
    shape[dim] = shape[dim] * n // 2
    return TensorType(t.dtype, tuple(shape), t.device)


Pricer = Callable[..., tuple[float, float]]


def _pricer(dom: Units, op: Op, rep: object) -> Pricer:
    """(seconds, FLOPs) of an op of the ring on ``rep``'s GPU, memoized: ``cost(od, ins, outs,
    diag)`` (``diag``: the attention kernels' causal flag)."""
    gpu = dom.dev_gpu[rep]  # type: ignore[index]
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

    return cost


def _lse(o: TensorType, dtype: DType | None = None) -> TensorType:
    return TensorType(dtype or lse_dtype(o.dtype), (o.shape[0], o.shape[2], o.shape[1]), o.device)


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
    lq = _chunk(local_piece(ins[where.q], rep, pos), 1)  # type: ignore[arg-type]
    lk = _chunk(local_piece(ins[where.k], rep, pos), 1)  # type: ignore[arg-type]
    lo = _chunk(local_piece(outs[0], rep, pos), 1)  # type: ignore[arg-type]
    lse = _lse(lq)
    causal = bool(op.attrs.get("causal", False))
    cost = _pricer(dom, op, rep)
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


def _torch_compute(
    dom: Units,
    op: Op,
    ins: Sequence[Type],
    outs: Sequence[Type],
    rep: object,
    pos: int,
    c: int,
    backward: bool,
) -> tuple[list[float], float]:
    """``_compute`` for torch's ring (module docstring): per step, the slowest rank's flash call
    (``torch_ring_call``) and its fp32 merge or accumulation; the casts to and from fp32 at the
    first and last steps."""
    lq = local_piece(ins[RING_OPERANDS[op.name].q], rep, pos)  # type: ignore[arg-type]
    assert isinstance(lq, TensorType)
    causal = bool(op.attrs.get("causal", False))
    cost = _pricer(dom, op, rep)

    def rows(n: int, dtype: DType | None = None) -> TensorType:  # n chunks of q's shape
        x = _chunk(lq, 1, n)
        return x if dtype is None else TensorType(dtype, x.shape, x.device)

    def call(qn: int, kn: int, diag: bool) -> tuple[float, float]:
        qt, kt = rows(qn), rows(kn)
        if backward:
            return cost(ATTENTION_GRAD, [qt, qt, kt, kt, qt, _lse(qt)], [qt, kt, kt], diag)
        return cost(ATTENTION, [qt, kt, kt], [qt, _lse(qt)], diag)

    def acc(n: int) -> float:  # an fp32 accumulator of n chunks takes a block's result
        if backward:
            return cost(ADD, [rows(n, F32), rows(n)], [rows(n, F32)])[0]
        o32, lse = rows(n, F32), _lse(rows(n), F32)
        return cost(ATTENTION_MERGE, [o32, lse, o32, lse], [o32, lse])[0]

    def copy(*ts: TensorType) -> float:  # a torch.cat's pass over ``ts`` (read and written)
        return sum(cost(CONCAT, [t], [t])[0] for t in ts)

    eager = not bool(getattr(dom.cost, "fuse", False))
    # forward: the out cast to fp32 and back; backward: dQ, dK, dV cast back from fp32
    cast_in = 0.0 if backward else cost(CAST, [rows(2)], [rows(2, F32)])[0]
    cast_out = (3.0 if backward else 1.0) * cost(CAST, [rows(2, F32)], [rows(2)])[0]
    send_kv = copy(rows(2), rows(2))  # torch.cat([key.flatten(), value.flatten()]): the rotater's input
    # ``_partial_update``'s torch.cat of a chunk updated in place and the one left as it was: compiled,
    # a pass over the unchanged chunk (Inductor writes the updated one into the cat); eager, both
    pass_n = 2 if eager else 1
    out_cat = copy(rows(pass_n, F32), _lse(rows(pass_n), F32))  # the fp32 out and its lse
    grad_cat = copy(rows(pass_n, F32))  # an fp32 dQ, dK or dV
    grad_send = copy(rows(2, F32), rows(2, F32)) if eager else 0.0  # the dK/dV sent each step

    def extra(s: int, qn: int, kn: int) -> float:
        """The step's copies beside its kernel and accumulation (module docstring)."""
        t = send_kv if s == 0 or (eager and s < c - 1) else 0.0
        if backward:
            t += grad_send
            if s > 0:
                t += 2.0 * grad_cat if kn == 1 else grad_cat if qn == 1 else 0.0
        elif s > 0 and qn == 1:
            t += out_cat
        return t

    steps, flops = [], 0.0
    for s in range(c):
        worst = 0.0
        for r in range(c):
            qn, kn, diag = torch_ring_call(c, r, s, causal)
            sec, f = call(qn, kn, diag)
            if s > 0 or backward:
                sec += acc(qn) + (2.0 * acc(kn) if backward else 0.0)
            sec += extra(s, qn, kn)
            worst = max(worst, sec + (cast_in if s == 0 else 0.0) + (cast_out if s == c - 1 else 0.0))
            flops += f if r == 0 else 0.0
        steps.append(worst)
    return steps, flops
