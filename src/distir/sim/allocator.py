"""The CUDA caching allocator's per-stream pools, from the program's own liveness.

PyTorch's caching allocator (``c10/cuda/CUDACachingAllocator.cpp``) hands each allocation a block
associated with the stream current when it was made; a freed block goes back to the cache and is
reused only by later allocations on that same stream (``get_free_block`` matches the stream of
the search key). Its *reserved* bytes grow when no cached block of the stream fits and never
shrink unless an allocation fails — it then releases the cached blocks that are whole segments
(``release_cached_blocks``, after synchronizing) and retries — or ``torch.cuda.empty_cache()``
is called. Memory freed on a communication stream is therefore not available to the compute
stream: FSDP2 allocates its all-gather input and output on its all-gather copy-in stream and
its reduce-scatter output (the sharded gradient, read by the optimizer) on its reduce-scatter
stream (``foreach_all_gather``, ``foreach_reduce``,
torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py).

**Model.** Each piece of storage the simulator tracks (``distir.sim.reference``: entry
parameters and every non-view op result, freed after its last use) is allocated on the *stream*
of its value: per GPU, the slot its type's device (or mesh) is mapped to. A result of a reducing
collective (reduce-scatter, all-reduce, reduce) on a communication stream is allocated on a
stream of its own beside that stream's (``<stream>/reduce``; on the compute stream, on it):
trainers make their reductions' outputs on a different CUDA stream from their gathers' even when
one NCCL stream runs both (FSDP2's reduce-scatter stream against its all-gather copy-in stream;
FSDP1's post-backward stream against its unshard stream). Each allocation is a block of its
bytes rounded up to 512 B (``kMinBlockSize``; the allocator's ``allocated_bytes`` counts these
sizes). The walk replays every allocation and free, in program order, through a model of the
allocator's segments (``distir.sim.segments``: best fit among the cached blocks of the request's
stream, splitting and merging, 2 MiB small segments, 20 MiB segments for requests of 1–10 MiB,
larger ones rounded to 2 MiB); an op's transient bump — a multi-step redistribution's
intermediate layouts, a ring attention's buffers — is allocated on the op's stream before its
results and freed after them, as one block per GPU or as the blocks the op names
(``OpRecord.scratch``).
A stream's *pool* is the segments reserved for it; they are never released, so the allocator's
reserved bytes at their peak are the pools' sum, the holes in them included: a large block freed
and cached, too small for a later larger request on its stream, stays reserved beside the new
segment (torchtitan's bf16 logits, 3.9 GiB, beside the fp32 log-softmax's 7.8 GiB blocks). A
value handed to another stream of the same GPU (a ``MeshSend`` between meshes whose devices
share GPUs: the hand-over of a gradient to the reduction stream, of a gathered weight to the
compute stream) is the same allocation, so it stays in the pool it was allocated in. The
allocated peak is the peak of the bytes live on all streams at once (the simulator's tensor
peak, in blocks); ``Pools.live`` gives each stream's own live peak.

Not modelled: what the trainer allocates that the program does not hold (autograd's temporaries,
kernels' workspaces), which adds requests and so changes which cached blocks fit; the release
of cached segments when an allocation fails (below: the reserved figure is the one with no
capacity); the events that keep a block from reuse while another stream still reads it
(``record_stream``). The runtime memory's flat ``fragmentation`` fraction, which stands for the
holes where no segments are modelled (the simulator's fit), is not added to the segments.

**Fit.** An allocation that finds no cached block on its stream and no free device memory
makes the allocator release every cached segment that holds no live block, across all streams,
and retry; it fails only when the live blocks, the segments they sit in and what is not the
allocator's (CUDA context, library workspaces, NCCL buffers) leave no room. So a run fits when
its *allocated* peak with the fragmentation fraction and the runtime memory fits
(``SimResult.oom_gpus``, unchanged): a reserved peak above the capacity still runs, with the
allocator freeing and refilling its caches (synchronizing and calling ``cudaFree``/``cudaMalloc``
each time: slower, which the step time does not include). ``over_capacity`` names those GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import chain
from typing import NamedTuple

from distir.interp.loop import interpret
from distir.interp.shapes import Mixed, type_of
from distir.ir.dtensor import DTensorType
from distir.ir.function import Function, Module
from distir.ir.ops import Op
from distir.ir.types import Type
from distir.ops.dist import MESH_SEND
from distir.ops.registry import CommPattern
from distir.sim import overlap
from distir.sim.cost import CostModel, epilogues, fuses
from distir.sim.devices import DeviceMap
from distir.sim.interference import COMPUTE
from distir.sim.oprecord import slots_of
from distir.sim.records import OpRecord
from distir.sim.reference import OpStep, Storage, _Walker, freed_after, inlined_ops
from distir.sim.segments import Block, CachingAllocator
from distir.sim.units import Units

BLOCK = 512  # kMinBlockSize: every allocation is rounded up to a multiple of it
# collectives whose results trainers allocate on their reduction stream (FSDP's reduce-scatter
# output; an in-place all-reduce of a persistent bucket, as DDP's and Megatron-LM's, allocates
# nothing there, so their reserved figure counts one bucket too many per stream)
REDUCING = frozenset({CommPattern.REDUCESCATTER, CommPattern.ALLREDUCE, CommPattern.REDUCE})
REDUCE_SUFFIX = "/reduce"


class Pool(NamedTuple):
    """One caching-allocator pool: a GPU's stream."""

    gpu: int
    stream: str


class Pools(NamedTuple):
    """Per GPU: the allocated peak (bytes live on all its streams at once, in blocks), each
    stream's pool (the segments the caching allocator reserves for it, ``distir.sim.segments``)
    and each stream's live peak (the most bytes live on it at once, in blocks), by stream name."""

    allocated: dict[int, float]
    pools: dict[int, dict[str, float]]
    live: dict[int, dict[str, float]]

    def reserved(self, gpu: int) -> float:
        """The allocator's reserved bytes at their peak on ``gpu``: its pools' sum."""
        return sum(self.pools.get(gpu, {}).values())


def block_bytes(nbytes: float) -> float:
    """``nbytes`` rounded up to the allocator's block size (512 B); 0 stays 0."""
    if nbytes <= 0:
        return 0.0
    return float(math.ceil(nbytes / BLOCK) * BLOCK)


def reserved_bytes(pools: Pools, gpu: int, fixed: float) -> float:
    """What the allocator reserves at its peak on ``gpu`` (its segments, the holes in them
    included: the runtime memory's flat fragmentation fraction, which stands for them elsewhere,
    is not added) plus what is not the allocator's (``fixed``: context, workspaces,
    communication buffers)."""
    return pools.reserved(gpu) + fixed


def over_capacity(reserved: Mapping[int, float], capacity: Mapping[int, float]) -> list[int]:
    """The GPUs whose reserved peak exceeds their capacity (they run, with the allocator
    releasing cached blocks and retrying: module docstring)."""
    return sorted(g for g, r in reserved.items() if r > capacity.get(g, float("inf")))


class _StreamWalker(_Walker):
    """The reference planner's walk, also noting the stream each storage is allocated on. Its
    clocks and memory figures are ``units``' (``distir.sim.units``: prepared, devices that hold
    alike grouped; ``streams`` gives each clock's memory figure and stream name)."""

    def __init__(
        self,
        units: Units,
        streams: Sequence[Pool],
        fuse: bool,
        tp_overlap: overlap.Form | None,
        gemm_epilogues: bool = True,
    ) -> None:
        super().__init__(units, fuse, tp_overlap, gemm_epilogues)
        self.streams = streams
        self.home: dict[Storage, dict[int, str]] = {}  # storage -> figure -> stream name
        # storage handed over from another stream of the same GPU -> figure -> the allocation it is
        self.same: dict[Storage, dict[int, Storage]] = {}

    def streams_of(self, t: Type, suffix: str = "") -> dict[int, str]:
        """Per memory figure, the stream a value of type ``t`` lives on (its first clock there);
        ``suffix`` names a communication stream's pool for reductions (the compute stream makes
        its own collectives' results on itself: no suffix)."""
        out: dict[int, str] = {}
        for s in slots_of(self.units, [t]):
            g, name = self.streams[s]
            out.setdefault(g, name if name == COMPUTE else name + suffix)
        return out

    def op(self, op: Op, args: Sequence[Mixed]) -> Sequence[Mixed]:
        n = len(self.frames[-1].steps)
        outs = super().op(op, args)
        steps = self.frames[-1].steps
        if len(steps) == n or not isinstance(steps[-1], OpStep) or not steps[-1].made:
            return outs
        step = steps[-1]
        suffix = REDUCE_SUFFIX if _reduces(step.record) else ""
        for s, o in zip(step.made, outs, strict=True):
            self.home[s] = self.streams_of(type_of(o), suffix)
        if op.name == MESH_SEND.name and step.reads and self._one_gpu(args[0], outs[0]):
            for s in step.made:  # a hand-over between streams of the same GPUs
                self._hand_over(step.reads[0], s)
        return outs

    def _one_gpu(self, source: Mixed, dest: Mixed) -> bool:
        """Whether a ``MeshSend`` from ``source`` to ``dest`` moves each piece to another
        stream of the GPU it is on: the meshes' devices lie on the same GPUs, position by
        position (else it is a transfer between GPUs, received into a new buffer)."""
        a, b = type_of(source), type_of(dest)
        if not isinstance(a, DTensorType) or not isinstance(b, DTensorType):
            return False
        gpu = self.units.dev_gpu
        return [gpu[d] for d in a.mesh.devices] == [gpu[d] for d in b.mesh.devices]

    def _hand_over(self, source: tuple[Storage, ...], made: Storage) -> None:
        """Note ``made`` as the allocation of ``source`` on each GPU where that holds the same
        bytes: a tensor handed to another stream of its GPU is not allocated again (PyTorch's
        streams share the GPU's memory; the consumer waits on an event or the producer calls
        ``record_stream``), so it stays in its first stream's pool until both are freed."""
        if len(source) != 1:
            return
        src = source[0]
        root = self.same.get(src, {})
        held = dict(src.nbytes)
        for g, b in made.nbytes:
            if b > 0 and held.get(g) == b:
                first = self.same.setdefault(made, {})[g] = root.get(g, src)
                self.home[made][g] = self.home[first][g]


def _reduces(rec: OpRecord) -> bool:
    """Whether ``rec`` is a reducing collective (its results go to the reduction stream)."""
    return rec.comm and rec.collective is not None and rec.collective.pattern in REDUCING


def stream_pools(
    module: Module, fn: Function, args: Sequence[Mixed], dmap: DeviceMap, cost: CostModel
) -> Pools:
    """Walk ``fn`` at ``args`` as the reference planner does and size each stream's pool
    (module docstring), per real GPU."""
    units = Units(dmap, cost)
    units.prepare(module, fn, args)  # a DTensor program: alike devices grouped (the same bytes)
    members = units.units if units.units is not None else [(j,) for j in range(len(dmap.slots))]
    streams = [Pool(units.slot_gpu[u], dmap.slots[m[0]].stream) for u, m in enumerate(members)]
    walker = _StreamWalker(units, streams, fuses(cost), overlap.form_of(cost), epilogues(cost))
    params = {p: Storage(units.bytes_by_gpu(type_of(a))) for p, a in zip(fn.params, args, strict=True)}
    for a, s in zip(args, params.values(), strict=True):
        walker.home[s] = walker.streams_of(type_of(a))
    entry = walker.frame(fn, {p: (s,) for p, s in params.items()})
    walker.frames.append(entry)
    interpret(module, fn, args, walker)
    results = tuple(s for v in fn.outputs for s in entry.storage[v])
    ledger = _Ledger(walker.home, walker.same, dict(enumerate(streams)))
    for s in params.values():
        ledger.allocate(s)
    ledger.top.update(ledger.total)
    free_at = freed_after(fn, entry.steps, params, results)
    frees: dict[int, list[Storage]] = {}
    for s, at in free_at.items():
        frees.setdefault(at, []).append(s)
    for at, op in enumerate(chain([None], inlined_ops(entry.steps)), start=-1):
        if op is not None:
            ledger.step(op, _dying(op, free_at, at))
        for s in frees.get(at, ()):
            ledger.free(s)
    by_figure = ledger.pools()
    figure = {g: units.gpu_figure.get(g, g) for g in sorted({s.gpu for s in dmap.slots})}
    return Pools(
        {g: by_figure.allocated[f] for g, f in figure.items()},
        {g: dict(by_figure.pools[f]) for g, f in figure.items()},
        {g: dict(by_figure.live[f]) for g, f in figure.items()},
    )


def _dying(op: OpStep, free_at: Mapping[Storage, int], at: int) -> bool:
    """Whether ``op``'s first input's only storage is freed right after it (its smaller bump,
    ``OpRecord.bump_dying``, applies: as ``distir.sim.reference.peak_memory``)."""
    rec = op.record
    return (
        rec.bump_dying is not None
        and bool(op.reads)
        and len(op.reads[0]) == 1
        and free_at.get(op.reads[0][0]) == at
    )


class _Entry(NamedTuple):
    """One GPU's part of a storage in the ledger."""

    gpu: int
    key: Pool  # its pool
    blocks: float  # its bytes in blocks
    root: Storage  # the allocation it is: itself, or the one handed over to it


class _Ledger:
    """Live bytes per (GPU, stream) and per GPU, in blocks, with their peaks. An allocation
    handed over to another stream (``same``) is counted once, until its last holder is freed."""

    def __init__(
        self,
        home: dict[Storage, dict[int, str]],
        same: dict[Storage, dict[int, Storage]],
        streams: dict[int, Pool],
    ) -> None:
        self.home, self.same, self.streams = home, same, streams
        gpus = sorted({p.gpu for p in streams.values()})
        self.live: dict[Pool, float] = {}
        self.peak: dict[Pool, float] = {}
        self.total = dict.fromkeys(gpus, 0.0)
        self.top = dict(self.total)
        self.holders: dict[tuple[Storage, int], int] = {}
        self.cache: dict[Storage, list[_Entry]] = {}
        # per GPU, its caching allocator's segments (``distir.sim.segments``), and the block
        # each live allocation holds
        self.segments = {g: CachingAllocator() for g in gpus}
        self.blocks: dict[tuple[Storage, int], Block] = {}

    def entries(self, s: Storage) -> list[_Entry]:
        """Per GPU of ``s``: its pool, its blocks and the allocation it is (itself, or the one it
        was handed over from), computed once per storage."""
        got = self.cache.get(s)
        if got is None:
            home, same = self.home.get(s, {}), self.same.get(s, {})
            got = self.cache[s] = [
                _Entry(g, Pool(g, home[g]), block_bytes(b), same.get(g, s)) for g, b in s.nbytes
            ]
        return got

    def allocate(self, s: Storage) -> None:
        live, peak, total, holders = self.live, self.peak, self.total, self.holders
        for g, key, b, root in self.entries(s):
            holders[root, g] = holders.get((root, g), 0) + 1
            if root is s:
                live[key] = v = live.get(key, 0.0) + b
                if v > peak.get(key, 0.0):
                    peak[key] = v
                total[g] += b
                if b > 0:
                    self.blocks[s, g] = self.segments[g].malloc(key.stream, b)

    def free(self, s: Storage) -> None:
        for g, key, b, root in self.entries(s):
            left = self.holders[root, g] = self.holders[root, g] - 1
            if left == 0:
                self.live[key if root is s else self._key(root, g)] -= b
                self.total[g] -= b
                block = self.blocks.pop((root, g), None)
                if block is not None:
                    self.segments[g].free(block)

    def _key(self, s: Storage, g: int) -> Pool:
        return next(e.key for e in self.entries(s) if e.gpu == g)

    def step(self, op: OpStep, dying: bool) -> None:
        """An op's transient peak (its bump beyond its results, on the op's own stream, with its
        results on theirs), then its results allocated."""
        rec = op.record
        bump = rec.bump_dying if dying and rec.bump_dying is not None else rec.bump
        made: dict[int, float] = {}  # bytes per GPU of its results
        for s in op.made:
            for g, b in s.nbytes:
                made[g] = made.get(g, 0.0) + b
        extras = [(g, x) for g, b in bump if (x := block_bytes(b - made.get(g, 0.0))) > 0]
        held: list[tuple[int, Block]] = []
        if extras:
            self._transient(op, extras)
            on = self._op_streams(op)
            # one block per GPU, or the separate blocks the op names (``OpRecord.scratch``)
            blocks = [(g, block_bytes(b)) for g, b in rec.scratch if b > 0] or extras
            held = [(g, self.segments[g].malloc(on[g].stream, x)) for g, x in blocks]
        for s in op.made:
            self.allocate(s)
        for g, block in held:  # the op's scratch, allocated before its results, freed after
            self.segments[g].free(block)
        top, total = self.top, self.total
        for g in made:
            if total[g] > top[g]:
                top[g] = total[g]

    def _transient(self, op: OpStep, extras: list[tuple[int, float]]) -> None:
        """The peaks while ``op`` runs with ``extras`` (bytes per GPU beyond its results) on the
        op's own stream of each GPU and its results (not handed over) on theirs."""
        on = self._op_streams(op)
        fresh = [e for s in op.made for e in self.entries(s) if e.root is s]
        for g, extra in extras:
            key = on[g]
            mine = sum(e.blocks for e in fresh if e.gpu == g and e.key == key)
            theirs = sum(e.blocks for e in fresh if e.gpu == g)
            self.peak[key] = max(self.peak.get(key, 0.0), self.live.get(key, 0.0) + extra + mine)
            self.top[g] = max(self.top[g], self.total[g] + extra + theirs)

    def _op_streams(self, op: OpStep) -> dict[int, Pool]:
        """Per GPU, the stream ``op`` runs on there (its first slot on the GPU)."""
        return {self.streams[d].gpu: self.streams[d] for d in reversed(op.record.devs)}

    def pools(self) -> Pools:
        live: dict[int, dict[str, float]] = {g: {} for g in self.total}
        for (g, name), v in sorted(self.peak.items()):
            if v > 0:
                live[g][name] = v
        pools = {g: {k: float(v) for k, v in sorted(a.by_stream.items())} for g, a in self.segments.items()}
        return Pools(dict(self.top), pools, live)
