"""Context parallelism: ring attention over ``c`` GPUs (Liu et al., "Ring Attention", 2023; as
Megatron-LM's ``context_parallel`` and torchtitan's ``context_parallel`` run it).

**Design (op level).** Ring attention is written as ordinary ops of an explicit per-device
program, not as a sharding rule of ``Attention``: each block is the registry's ``Attention`` (or
``AttentionGrad``) on one query chunk against one key/value chunk, partial results are merged by
``AttentionMerge`` (the log-sum-exp merge, ``distir.ops.attention``), and the ring is explicit
``Send`` ops. So the reference executor runs it (and its numbers are the sequential op's:
``tests/parallel/test_context.py``), and the simulator times each block and each transfer.

**Layout (load-balanced causal chunks).** The sequence of S positions is cut into 2c equal
chunks; rank i holds chunks i and 2c−1−i (Megatron's and torchtitan's layout), so under a causal
mask every rank does the same work. ``balanced_positions`` gives a rank's global positions;
``shard_sequence`` / ``unshard_sequence`` move a tensor between the global order and the ranks'
pieces. Position-dependent ops on a rank's piece must use those global positions: ``Rope`` takes
the global position of a chunk's first row (its ``offset``); the causal mask is the block kinds
below. In the program a rank's two chunks stay separate values end to end (no copy to split or
join its piece) and travel separately: per step a rank sends its four K/V chunks (K and V of
each chunk; Megatron packs them into one buffer — the same bytes, 4α instead of α).

**Blocks.** A query chunk a against a key chunk b (global chunk indices) is ``diag`` when a = b
(the ordinary causal block), ``full`` when a > b (every key visible: ``causal=False``), and
skipped when a < b (every key hidden); without a causal mask every block is ``full``.

**Forward** (``ring_attention``): at step s = 0..c−1, rank r holds the K/V of rank (r − s) mod c;
it first sends them on to rank r+1 (except at the last step), then runs its blocks against them,
merging into its running (out, lse) per query chunk — the transfer overlaps the blocks.
**Backward**: FlashAttention-2's backward needs only the merged out and lse, so each block is
``AttentionGrad`` with them: dQ accumulates on the rank; dK/dV of the travelling K/V accumulate
along the ring, sent on with them, and after c steps arrive back at their owner (dK/dV travel c
times, K/V c−1 times). Memory per rank: 1/c of q, k, v, dout and of the results, plus the ring's
buffers (the K/V chunks received, the travelling dK/dV), also ∝ 1/c.

With ``comm_streams`` the ring runs on two streams per GPU (program devices c+r send, 2c+r
receive; ``ring_device_map``): the compute device hands a tensor to its send stream and takes it
from its receive stream (both free on one GPU), so only the streams wait for the link. A stream
runs its ops in program order, so the order is chosen for overlap: a step's tensors are all
handed to the send stream before any is moved on (the compute never waits for one transfer to
hand over the next), and the dK/dV that arrived during a step are taken at the start of the
next, before its blocks (taken after them, they would hold this step's arrivals behind the
blocks on the receive stream).

``distribute`` builds context parallelism into whole models on a ``cp`` mesh axis
(``distir.parallel.context_model``) with this layout and global positions as data; its attention
ops carry ``ring=c`` and keep K/V split over cp, and materialization lowers each to this ring
(``Ring``, ``ring_forward``, ``ring_backward``: the devices of a cp group as the ranks, no
streams) — ``distir.parallel.sharding.ring``. ``ring_step_work`` and ``ring_time`` are the
ring's work per step and its overlapped time, which the simulator (``distir.sim.ring``) and the
search's screen (``distir.search.context_cost``) both use.

**Torch's ring.** PyTorch's ``context_parallel`` (torch.distributed.tensor.experimental, as
torchtitan runs it) computes the same blocks in another form: one flash call per rank and step on
its concatenated chunks (``torch_ring_call``), the K/V all-gathered once instead of passed per step,
and ``torch_ring_time`` its time; the simulator times it so under the cost model's ``ring_form``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from distir.interp.annotate import annotate_types
from distir.ir.builder import FunctionBuilder
from distir.ir.function import Module
from distir.ir.types import Device, DType, TensorType
from distir.ir.values import Value
from distir.ir.verify import verify
from distir.parallel.strategy import StrategyError
from distir.sim.devices import DeviceMap, Slot

RING_STREAMS = ("cp_send", "cp_recv")
Pair = tuple[Value, Value]  # a rank's two chunks of one tensor


def balanced_chunks(c: int, rank: int) -> tuple[int, int]:
    """The two global chunks (of 2c) that ``rank`` holds: rank and 2c−1−rank."""
    return rank, 2 * c - 1 - rank


def balanced_positions(seq: int, c: int, rank: int) -> np.ndarray:
    """The global positions of ``rank``'s tokens, in its local order (its two chunks, in turn)."""
    n = _chunk_len(seq, c)
    return np.concatenate([np.arange(g * n, (g + 1) * n) for g in balanced_chunks(c, rank)])


def shard_sequence(x: Any, c: int, dim: int) -> list[np.ndarray]:
    """Rank r's piece of ``x`` (global order along ``dim``): its two chunks, concatenated."""
    a = np.asarray(x)
    return [np.take(a, balanced_positions(a.shape[dim], c, r), axis=dim) for r in range(c)]


def unshard_sequence(parts: Sequence[Any], dim: int) -> np.ndarray:
    """The inverse of ``shard_sequence``: the ranks' pieces back in global order."""
    c = len(parts)
    seq = sum(np.asarray(p).shape[dim] for p in parts)
    order = np.concatenate([balanced_positions(seq, c, r) for r in range(c)])
    return np.take(np.concatenate([np.asarray(p) for p in parts], axis=dim), np.argsort(order), axis=dim)


def _chunk_len(seq: int, c: int) -> int:
    if c < 1 or seq % (2 * c):
        raise StrategyError(
            f"context parallelism over c={c} cuts the sequence into 2c = {2 * c} equal chunks; "
            f"{seq} positions do not divide"
        )
    return seq // (2 * c)


def block_kind(q_chunk: int, k_chunk: int, causal: bool) -> str | None:
    """``diag``, ``full`` or None (skipped) for a query chunk against a key chunk (docstring)."""
    if not causal or q_chunk > k_chunk:
        return "full"
    return "diag" if q_chunk == k_chunk else None


@dataclass(frozen=True, slots=True)
class RingShape:
    """Global attention shapes: q (batch, seq, heads, head_dim), k and v (…, kv_heads, …)."""

    batch: int
    seq: int
    heads: int
    head_dim: int
    kv_heads: int
    dtype: DType = DType.f64
    causal: bool = True


def ring_device_map(c: int, comm_streams: bool) -> DeviceMap:
    """Program device r on GPU r; with ``comm_streams``, c+r and 2c+r on its ring streams."""
    m = {Device(r): Slot(r) for r in range(c)}
    if comm_streams:
        for k, stream in enumerate(RING_STREAMS):
            m.update({Device((k + 1) * c + r): Slot(r, stream) for r in range(c)})
    return DeviceMap(m)


class Ring:
    """Builds a ring (module docstring) into ``fb``: rank r is program device ``devices[r]``;
    with ``streams`` = (send-stream devices, receive-stream devices), one of each per rank, a
    transfer goes through them. ``attrs``: the attention ops' attributes besides ``causal``
    (``scale``, ``dropout``); ``tag`` prefixes the names of its values."""

    def __init__(
        self,
        fb: FunctionBuilder,
        devices: Sequence[Device],
        causal: bool,
        streams: tuple[Sequence[Device], Sequence[Device]] | None = None,
        attrs: dict[str, Any] | None = None,
        tag: str = "",
    ) -> None:
        self.fb, self.devices, self.c, self.causal = fb, tuple(devices), len(devices), causal
        self.streams = streams
        self.attrs = dict(attrs or {})
        self.tag = tag

    def send(self, x: Value, r: int, name: str) -> Value:
        """Start moving ``x`` from rank r to rank r+1 (on the streams: as far as the receive
        stream; ``take`` finishes the move right before use)."""
        nxt = (r + 1) % self.c
        if self.streams is None:
            return self.fb.op("Send", x, names=[name], dst=self.devices[nxt])[0]
        (on_send,) = self.fb.op("Send", x, names=[name], dst=self.streams[0][r])
        return self.fb.op("Send", on_send, names=[name], dst=self.streams[1][nxt])[0]

    def send_many(self, xs: Sequence[Value], r: int, names: Sequence[str]) -> list[Value]:
        """``send`` of each of ``xs``, all handed to the send stream first, then moved on: the
        compute stream never waits for one transfer to hand over the next."""
        nxt = (r + 1) % self.c
        if self.streams is None:
            return [self.send(x, r, n) for x, n in zip(xs, names, strict=True)]
        on_send = [
            self.fb.op("Send", x, names=[n], dst=self.streams[0][r])[0]
            for x, n in zip(xs, names, strict=True)
        ]
        return [
            self.fb.op("Send", x, names=[n], dst=self.streams[1][nxt])[0]
            for x, n in zip(on_send, names, strict=True)
        ]

    def take(self, x: Value, r: int) -> Value:
        if self.streams is None:
            return x
        return self.fb.op("Send", x, names=[x.name], dst=self.devices[r])[0]

    def take_pair(self, x: Pair, r: int) -> Pair:
        return self.take(x[0], r), self.take(x[1], r)

    def pass_kv(self, held: Sequence[tuple[Pair, Pair]], s: int, tag: str) -> list[tuple[Pair, Pair]]:
        """Step ``s``: every rank sends the K/V chunks it holds on to the next rank (none at the
        last step); ``arrive`` takes them in at step s+1."""
        if s == self.c - 1:
            return []
        c = self.c
        out = []
        for r, kv in enumerate(held):
            at = f"{(r - s) % c}_at{(r + 1) % c}"
            xs = [x for p in kv for x in p]
            names = [f"{self.tag}{tag}{w}{at}_{i}" for w in "kv" for i in range(2)]
            k0, k1, v0, v1 = self.send_many(xs, r, names)
            out.append(((k0, k1), (v0, v1)))
        return out

    def arrive(self, sent: Sequence[tuple[Pair, Pair]]) -> list[tuple[Pair, Pair]]:
        """What each rank holds after ``pass_kv``: the chunks its previous rank sent."""
        return [(self.take_pair(sent[r - 1][0], r), self.take_pair(sent[r - 1][1], r)) for r in range(self.c)]

    def blocks(self, r: int, s: int) -> list[tuple[int, int, bool]]:
        """(query chunk, key chunk, causal) of rank r at step s, local chunk indices 0/1."""
        return ring_blocks(self.c, r, s, self.causal)


def ring_blocks(c: int, r: int, s: int, causal: bool) -> list[tuple[int, int, bool]]:
    """The blocks rank r of a ring of c computes at step s (it then holds the K/V of rank
    (r − s) mod c): (query chunk, key chunk, diagonal), local chunk indices 0/1; the fully masked
    ones left out."""
    j = (r - s) % c
    gq, gk = balanced_chunks(c, r), balanced_chunks(c, j)
    out = []
    for x in (0, 1):
        for y in (0, 1):
            kind = block_kind(gq[x], gk[y], causal)
            if kind is not None:
                out.append((x, y, kind == "diag"))
    return out


class StepWork(NamedTuple):
    """What one rank computes at one ring step, as the ring's program does it: its blocks
    (``ring_blocks``) and the elementwise ops combining their results — forward, ``merges``
    (``AttentionMerge``: every block but each query chunk's first, at step 0); backward, Adds of
    query-chunk size (dQ: every block but each query chunk's first) and of key-chunk size (dK and
    dV: every block but each key chunk's first in the step, and from step 1 on the dK/dV that
    arrived, once per key chunk the step touched)."""

    blocks: list[tuple[int, int, bool]]
    merges: int
    q_adds: int
    kv_adds: int


def ring_step_work(c: int, r: int, s: int, causal: bool, backward: bool) -> StepWork:
    """Rank r's work at step s of a ring of c (``StepWork``)."""
    blocks = ring_blocks(c, r, s, causal)
    xs, ys = {x for x, _y, _d in blocks}, {y for _x, y, _d in blocks}
    firsts = len(xs) if s == 0 else 0
    if not backward:
        return StepWork(blocks, len(blocks) - firsts, 0, 0)
    kv = 2 * (len(blocks) - len(ys)) + (2 * len(ys) if s > 0 else 0)
    return StepWork(blocks, 0, len(blocks) - firsts, kv)


def ring_time(steps: Sequence[float], hop: float, backward: bool) -> float:
    """A ring's time from its steps' compute (``steps``, the slowest rank's per step) and one
    hop of a rank's K and V (``hop``), transfers overlapping the blocks as Megatron-LM /
    Transformer Engine run them: forward, the next K/V travel during each step but the last,
    Σ_{s<c−1} max(C_s, T) + C_{c−1}; backward, a step's partial dK/dV travel during the next
    step beside the next K/V (one after the other on the link), max(C_0, T) +
    Σ_{0<s<c−1} max(C_s, 2T) + max(C_{c−1}, T) + T, the last T the final hop of dK/dV back to
    their owner."""
    c = len(steps)
    if not backward:
        return sum(max(x, hop) for x in steps[:-1]) + steps[-1]
    comm = [hop if s in (0, c - 1) else 2 * hop for s in range(c)]
    return sum(max(x, t) for x, t in zip(steps, comm, strict=True)) + hop


# the rings a trainer may run (``ring_time`` / ``torch_ring_time``): p2p (Megatron-LM's and
# Transformer Engine's, the K/V passed rank to rank), torch (torch.distributed.tensor.experimental
# ``context_parallel``, the K/V all-gathered: ``torch_ring_call``)
RING_FORMS = ("p2p", "torch")


class TorchCall(NamedTuple):
    """The one flash call a rank makes at a step of torch's ring: its queries and its keys as
    counts of the rank's two chunks (1: one chunk, 2: both), and whether it is causal."""

    q_chunks: int
    k_chunks: int
    causal: bool


def torch_ring_call(c: int, r: int, s: int, causal: bool) -> TorchCall:
    """Rank r's call at step s of torch's ring over c ranks (``_templated_ring_attention`` in
    torch/distributed/tensor/experimental/_attention.py, with its default load balancing, the
    layout of this module): the rank's two chunks stay concatenated, so a step is one call — step
    0 the rank's queries against its own K/V, causal; from step 1 on (it then holds the K/V of rank
    (r − s) mod c), for s ≤ r all its queries against the first K/V chunk, else its second query
    chunk against both K/V chunks, neither causal. The same blocks as ``ring_blocks``, in
    one kernel. Without a causal mask (no load balancing) every step is the whole piece."""
    if s == 0:
        return TorchCall(2, 2, causal)
    if not causal:
        return TorchCall(2, 2, False)
    return TorchCall(2, 1, False) if s <= r else TorchCall(1, 2, False)


def torch_ring_time(steps: Sequence[float], gather: float, hop: float, backward: bool, waited: bool) -> float:
    """Torch's ring (``torch_ring_call``) from its steps' compute (``steps``, the slowest rank's),
    the all-gather of the group's K/V (``gather``: ``context_parallel``'s default rotate method,
    one all-gather at step 0, each step then slicing its rank's K/V out of it) and, backward, one
    hop of a rank's dK/dV (``hop``: fp32 accumulators, sent to the next rank after every step by
    a one-peer all-to-all, ``_AllToAllRotater``). Eager (``waited`` False) a collective is waited
    on first use: the all-gather overlaps step 0, the dK/dV of a step travel during the next
    step's kernel, forward max(C_0, G) + Σ_{s≥1} C_s, backward max(C_0, G) + Σ_{s≥1} max(C_s, H)
    + H (the last H the final hop back to the owner). Under torch.compile (``waited``) the trace
    waits on each functional collective where it is issued (``_maybe_wrap_tensor`` in
    torch/distributed/_functional_collectives.py: ``wait_tensor`` at once when tracing) and
    Inductor keeps the wait there (``reorder_for_compute_comm_overlap`` defaults to False in
    torch/_inductor/config.py): nothing overlaps, G + Σ C_s, plus c·H backward."""
    c = len(steps)
    if waited:
        return gather + sum(steps) + (c * hop if backward else 0.0)
    first = max(steps[0], gather)
    if not backward:
        return first + sum(steps[1:])
    return first + sum(max(x, hop) for x in steps[1:]) + hop


def ring_attention(shape: RingShape, c: int, comm_streams: bool = False) -> Module:
    """The forward and backward of attention over ``c`` ranks by ring (module docstring).

    Entry parameters, per rank r (on device r): the two chunks of its load-balanced piece of
    the sequence (``shard_sequence``, cut in half) of q, k, v and dout — ``8c`` in all, rank by
    rank, chunk by chunk. Results per rank, likewise as two chunks each: out, lse (B, h, chunk),
    dq, dk, dv — equal to ``Attention`` / ``AttentionGrad`` of the whole sequence, pieced back
    with ``unshard_sequence``. Chunks stay separate values (no copy to split or join a rank's
    piece), and travel separately (a Send per chunk of K and of V)."""
    n = _chunk_len(shape.seq, c)
    if c < 2:
        raise StrategyError(f"ring attention needs c >= 2 ranks, got c={c}")
    fb = FunctionBuilder(f"ring_attention_c{c}")
    devices = [Device(r) for r in range(c)]
    streams = (
        ([Device(c + r) for r in range(c)], [Device(2 * c + r) for r in range(c)]) if comm_streams else None
    )
    ring = Ring(fb, devices, shape.causal, streams)
    b, h, hk, d = shape.batch, shape.heads, shape.kv_heads, shape.head_dim
    ranks = []
    for r in range(c):
        dev = Device(r)
        qt = TensorType(shape.dtype, (b, n, h, d), dev)
        kt = TensorType(shape.dtype, (b, n, hk, d), dev)
        named = (("q", qt), ("k", kt), ("v", kt), ("dout", qt))
        ranks.append(Local(*((fb.param(f"{x}_{r}_0", t), fb.param(f"{x}_{r}_1", t)) for x, t in named)))
    fwd = ring_forward(ring, ranks)
    bwd = ring_backward(ring, ranks, fwd)
    results: list[Value] = []
    for r in range(c):
        (o0, l0), (o1, l1) = fwd[r]
        results += [o0, o1, l0, l1]
        results += [v for g in bwd[r] for v in g]
    module = Module((fb.ret(*results),))
    verify(module)
    return verify(annotate_types(module))


class Local(NamedTuple):
    """A rank's pieces, each as its two chunks (``dout``: for the backward only)."""

    q: Pair
    k: Pair
    v: Pair
    dout: Pair | None = None


def ring_forward(ring: Ring, ranks: Sequence[Local]) -> list[tuple[tuple[Value, Value], tuple[Value, Value]]]:
    """The forward ring: per rank, per query chunk, the merged (out, lse)."""
    fb, c = ring.fb, ring.c
    held = [(x.k, x.v) for x in ranks]  # the K/V chunks rank r holds at this step
    acc: list[list[tuple[Value, Value] | None]] = [[None, None] for _ in range(c)]
    for s in range(c):
        sent = ring.pass_kv(held, s, "")
        for r, (ks, vs) in enumerate(held):
            for x, y, diag in ring.blocks(r, s):
                names = [f"{ring.tag}o{r}_{x}", f"{ring.tag}lse{r}_{x}"]
                o, lse = fb.op(
                    "Attention", ranks[r].q[x], ks[y], vs[y], names=names, causal=diag, **ring.attrs
                )
                prev = acc[r][x]
                if prev is not None:
                    o, lse = fb.op("AttentionMerge", *prev, o, lse, names=names)
                acc[r][x] = (o, lse)
        held = ring.arrive(sent) if sent else held
    out = []
    for a in acc:
        first, second = a
        assert first is not None and second is not None  # every query sees its diagonal block
        out.append((first, second))
    return out


def ring_backward(
    ring: Ring, ranks: Sequence[Local], fwd: Sequence[tuple[tuple[Value, Value], tuple[Value, Value]]]
) -> list[tuple[Pair, Pair, Pair]]:
    """The backward ring, from the merged forward (out, lse) of each rank's query chunks: per
    rank (dq, dk, dv), each as its two chunks."""
    fb, c = ring.fb, ring.c
    held = [(x.k, x.v) for x in ranks]
    dkv: list[tuple[Pair, Pair] | None] = [None] * c  # arriving dK/dV of the held K/V
    dq: list[list[Value | None]] = [[None, None] for _ in range(c)]
    for s in range(c):
        # the dK/dV that arrived during the last step, taken first: a receive stream runs its
        # transfers in program order, so taking them after this step's blocks would queue this
        # step's arrivals behind the blocks
        arrived = [
            (ring.take_pair(prev[0], r), ring.take_pair(prev[1], r)) if prev is not None else None
            for r, prev in enumerate(dkv)
        ]
        sent = ring.pass_kv(held, s, "b")
        out_dkv = []
        for r, (ks, vs) in enumerate(held):
            loc = ranks[r]
            assert loc.dout is not None
            dks: list[Value | None] = [None, None]
            dvs: list[Value | None] = [None, None]
            for x, y, diag in ring.blocks(r, s):
                o, lse = fwd[r][x]
                g = fb.op(
                    "AttentionGrad",
                    loc.dout[x],
                    loc.q[x],
                    ks[y],
                    vs[y],
                    o,
                    lse,
                    names=[f"{ring.tag}dq{r}_{x}", f"{ring.tag}dk{r}_{y}", f"{ring.tag}dv{r}_{y}"],
                    causal=diag,
                    **ring.attrs,
                )
                dq[r][x] = _add(fb, dq[r][x], g[0])
                dks[y], dvs[y] = _add(fb, dks[y], g[1]), _add(fb, dvs[y], g[2])
            got = arrived[r]
            j = (r - s) % c
            dk = _sum_chunks(fb, dks, got[0] if got else None, ks, f"{ring.tag}dk{j}")
            dv = _sum_chunks(fb, dvs, got[1] if got else None, vs, f"{ring.tag}dv{j}")
            dk0, dk1, dv0, dv1 = ring.send_many(
                [*dk, *dv], r, [dk[0].name, dk[1].name, dv[0].name, dv[1].name]
            )
            out_dkv.append(((dk0, dk1), (dv0, dv1)))
        dkv = [out_dkv[r - 1] for r in range(c)]
        held = ring.arrive(sent) if sent else held
    results = []
    for r in range(c):
        dq0, dq1 = dq[r]
        last = dkv[r]
        assert dq0 is not None and dq1 is not None and last is not None
        results.append(((dq0, dq1), ring.take_pair(last[0], r), ring.take_pair(last[1], r)))
    return results


def _sum_chunks(
    fb: FunctionBuilder, parts: Sequence[Value | None], arrived: Pair | None, like: Pair, name: str
) -> Pair:
    """This step's gradient of each K/V chunk plus what arrived with it; a chunk no block touched
    passes on what arrived (or zeros at the first step)."""
    out = []
    for i, p in enumerate(parts):
        a = arrived[i] if arrived is not None else None
        if p is None:
            p = a if a is not None else fb.op("FillLike", like[i], names=[f"{name}_{i}"], value=0.0)[0]
        elif a is not None:
            (p,) = fb.op("Add", a, p, names=[f"{name}_{i}"])
        out.append(p)
    return out[0], out[1]


def _add(fb: FunctionBuilder, acc: Value | None, x: Value) -> Value:
    return x if acc is None else fb.op("Add", acc, x, names=[x.name])[0]


__all__ = [
    "RING_FORMS",
    "RING_STREAMS",
    "Local",
    "Ring",
    "RingShape",
    "StepWork",
    "TorchCall",
    "balanced_chunks",
    "balanced_positions",
    "block_kind",
    "ring_attention",
    "ring_backward",
    "ring_blocks",
    "ring_device_map",
    "ring_forward",
    "ring_step_work",
    "ring_time",
    "shard_sequence",
    "torch_ring_call",
    "torch_ring_time",
    "unshard_sequence",
]
