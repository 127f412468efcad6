"""One rank's loop: its per-rank programs executed on torch, op by op, with timings and memory.

``RankProgram`` is what a rank runs: its projected program (``distir.interp.project``) and its
inputs (numpy, as the reference executor takes them). ``run_programs`` joins the process group
(``RankSetup``), makes every process group any program uses — all ranks make all groups in the
same order, as torch.distributed requires — and runs each program ``steps`` times. Per run it
returns a ``RankResult``: the outputs of the last step (numpy), the wall time of each step (the
ranks start each step together, after a barrier) and the rank thread's CPU time in it, the peak
of live tensor bytes and, with ``trace``, a ``(name, category, start, end, op text)`` slice per
op of the last step.

Execution: the program's calls are inlined; each op runs its registry ``torch`` implementation
(an op without one runs its numpy reference on the host, and is listed in ``fallback_ops``). A
value is dropped after its last reader, so the memory figure is real: on CUDA the allocator's
peak (``torch.cuda.max_memory_allocated``); on CPU the tracked bytes of the distinct storages of
live values (the step's inputs included), sampled after every op. Point-to-point operations
posted by consecutive ``rank.Send``/``rank.Recv`` start together (``TorchContext.flush``) before
any other op, or a send of a value received in the same batch. A coalesced collective (a
gradient bucket, a layer's parameter gather: a first part, then parts flagged ``coalesced``,
``distir.ops.dist``) runs as the trainer issues it, ONE call over a flat buffer
(``OpDef.torch_coalesced``), at its first part: with it go the later parts of the same collective
and group that follow it before any other communication op, as long as their inputs are computed
before the first part (``coalesced_calls``; a part that is not runs on its own, as do parts a
collective cannot share a call for). The call is traced as one slice, at its first part.

``progress`` (optional, three shared integers) holds the index of the program and of the op the
rank is at, and its ``Stage`` (starting, joining the process group, running), so the launcher
can say where a rank that died was. A failure of an op is
a ``RankFailure`` naming the rank, its device, the op as printed in the IR, and why.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from enum import IntEnum
from typing import Any

from distir.backend import require_torch
from distir.backend.context import TorchContext
from distir.backend.domain import args_to_torch, to_numpy, to_torch
from distir.ir.function import Function, Module
from distir.ir.ops import Op
from distir.ir.printer import print_op
from distir.ir.rewrite import inline_calls
from distir.ir.types import Device, TensorType
from distir.ir.values import Value
from distir.ops.rank_comm import P2P
from distir.ops.registry import REGISTRY, OpDef, OpKind, OpTypeError


class RankFailure(RuntimeError):
    """An op of a rank's program raised. ``secondary``: it failed in communication, which is what
    a rank sees when a peer died first (the launcher reports the peer's failure instead)."""

    def __init__(self, message: str, rank: int, op_text: str | None, secondary: bool) -> None:
        super().__init__(message)
        self.rank = rank
        self.op_text = op_text
        self.secondary = secondary


class Stage(IntEnum):
    """Where a rank is (``progress[2]``): its process started (importing, unpickling its
    programs); joining the process group and making the groups; running its programs."""

    STARTING = 0
    JOINING = 1
    RUNNING = 2


@dataclass(frozen=True, slots=True)
class RankSetup:
    """How a rank joins the run: ``init_method`` is ``tcp://host:port`` (local launch) or
    ``env://`` (torchrun: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE)."""

    rank: int
    world_size: int
    backend: str  # gloo, or nccl when CUDA is present
    init_method: str
    timeout_s: float
    local_rank: int = -1  # the rank on this machine (torchrun's LOCAL_RANK; -1: ``rank``): its GPU


@dataclass(frozen=True, slots=True)
class RankProgram:
    """One rank's program, its inputs (numpy, in the program's parameter order) and how often to
    run it (the first of several steps is a warm-up)."""

    device: Device
    program: Module
    inputs: tuple[Any, ...]
    ranks: dict[Device, int]  # program device -> global rank
    groups: tuple[tuple[Device, ...], ...]  # every device group any rank's program uses
    steps: int = 1
    trace: bool = False
    # the coalesced collective calls it issues over several parts: each call's op indices (in
    # the inlined program), agreed among the ranks of each group (``agreed_calls``)
    calls: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class OpSlice:
    """One op's execution on one rank (seconds since the step's start)."""

    name: str
    category: str  # compute or comm
    start: float
    end: float
    text: str
    live_bytes: int  # tracked live tensor bytes after the op
    cpu: float = 0.0  # this thread's CPU seconds during the op (wall time less preemption)


@dataclass(slots=True)
class RankResult:
    device: Device
    outputs: tuple[Any, ...]
    step_times: list[float]
    peak_memory_bytes: int
    memory_source: str  # cuda allocator or tracked live tensors
    slices: list[OpSlice] = field(default_factory=list)
    fallback_ops: list[str] = field(default_factory=list)
    step_cpu_times: list[float] = field(default_factory=list)  # this rank's thread CPU s per step

    @property
    def step_time_s(self) -> float:
        """The median step time after the warm-up step (the only step if there is one)."""
        times = self.step_times[1:] or self.step_times
        return statistics.median(times)


def _fallback(d: OpDef, op: Op) -> Any:
    """An op without a torch implementation: its numpy reference, tensors moved through the host."""

    def impl(ctx: TorchContext, inputs: Sequence[Any], attrs: Any) -> tuple[Any, ...]:
        assert d.reference is not None
        outs = d.reference([to_numpy(x) for x in inputs], attrs)
        return tuple(to_torch(ctx, y, v.type) for v, y in zip(op.outputs, outs, strict=True))

    return impl


class _LiveBytes:
    """Bytes of the distinct storages of live values (views share their base's storage)."""

    def __init__(self) -> None:
        self.count: dict[int, int] = {}
        self.bytes = 0
        self.peak = 0

    def _storages(self, value: Any) -> list[tuple[int, int]]:
        if isinstance(value, tuple):
            return [s for v in value for s in self._storages(v)]
        st = value.untyped_storage()
        return [(st.data_ptr(), int(st.nbytes()))]

    def add(self, value: Any) -> None:
        for key, n in self._storages(value):
            c = self.count.get(key, 0)
            self.count[key] = c + 1
            if c == 0:
                self.bytes += n
        self.peak = max(self.peak, self.bytes)

    def drop(self, value: Any) -> None:
        for key, n in self._storages(value):
            c = self.count[key] - 1
            if c == 0:
                del self.count[key]
                self.bytes -= n
            else:
                self.count[key] = c


def coalesced_calls(ops: Sequence[Op], params: Sequence[Value]) -> dict[int, list[int]]:
    """The collective calls a rank issues over several parts (see the module docstring): the
    index of each call's first part -> the indices of all its parts (2 or more), in order.

    A coalesced collective is an unflagged rank collective and the flagged ones after it, up to
    the next unflagged communication op. Its parts of one collective and group (a bucket may mix
    a reduce-scatter of its shardable weights with an all-reduce of the others) share one call,
    issued at the first of them, with each later part whose inputs are computed by then; a part
    whose inputs are not starts the next such call."""
    made: dict[Value, int] = {v: -1 for v in params}
    calls: dict[int, list[int]] = {}
    leader: dict[tuple[str, Any], int] = {}  # (op, group) -> the first part of its call so far
    for k, op in enumerate(ops):
        d = REGISTRY[op.name]
        if d.kind is OpKind.RANK_COMM:
            if not op.attrs.get("coalesced"):
                leader = {}  # a new collective call: parts never join an earlier one
            key = (op.name, op.attrs.get("group"))
            first = leader.get(key)
            if d.torch_coalesced is not None and (
                first is None or any(made.get(v, k) >= first for v in op.inputs)
            ):
                leader[key] = k
                calls[k] = [k]
            elif first is not None:
                calls[first].append(k)
        for v in op.outputs:
            made[v] = k
    return {k: parts for k, parts in calls.items() if len(parts) > 1}


def agreed_calls(programs: Sequence[Function]) -> list[tuple[tuple[int, ...], ...]]:
    """Per rank (``programs``: each rank's inlined program), the calls of ``coalesced_calls``
    that every rank of the call's group makes alike: a rank's readiness is its own, so where the
    ranks differ a call keeps the parts all of them put first in it (the longest common prefix,
    at least two), and the others run on their own. A group's collectives run in one order on
    all its ranks, so a part is known across ranks by (group, its place in that order)."""
    seqs: list[list[tuple[Any, int] | None]] = []  # per rank, per op: (group, place) or None
    proposed: list[dict[tuple[Any, int], tuple[tuple[Any, int], ...]]] = []  # leader -> parts
    for fn in programs:
        ops = [i for i in fn.body if isinstance(i, Op)]  # inlined: no calls
        seen: dict[Any, int] = {}
        seq: list[tuple[Any, int] | None] = []
        for op in ops:
            g = op.attrs.get("group") if REGISTRY[op.name].kind is OpKind.RANK_COMM else None
            seq.append(None if g is None else (g, seen.setdefault(g, 0)))
            if g is not None:
                seen[g] += 1
        seqs.append(seq)
        calls = coalesced_calls(ops, fn.params)
        proposed.append({seq[k]: tuple(seq[j] for j in parts) for k, parts in calls.items()})  # type: ignore[misc]
    member = [{key[0] for key in seq if key is not None} for seq in seqs]
    out = []
    for r, seq in enumerate(seqs):
        at = {key: k for k, key in enumerate(seq) if key is not None}
        mine = []
        for leader, parts in proposed[r].items():
            common = list(parts)
            for other, groups in zip(proposed, member, strict=True):
                if leader[0] in groups:
                    common = _prefix(common, other.get(leader, ()))
            if len(common) > 1:
                mine.append(tuple(at[key] for key in common))
        out.append(tuple(mine))
    return out


def _prefix(a: Sequence[Any], b: Sequence[Any]) -> list[Any]:
    """The longest common prefix of ``a`` and ``b``."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return list(a[:n])


class _Runner:
    """One program compiled to a list of steps for this rank (see the module docstring)."""

    def __init__(
        self, ctx: TorchContext, fn: Function, progress: Any, calls: Sequence[Sequence[int]] = ()
    ) -> None:
        self.ctx = ctx
        self.fn = fn
        self.ops = [i for i in fn.body if isinstance(i, Op)]
        self.progress = progress
        self.fallback: list[str] = []
        self.impls = []
        for op in self.ops:
            d = REGISTRY[op.name]
            if d.torch is None:
                if d.reference is None:
                    raise RankFailure(f"{op.name} has no torch implementation", -1, print_op(op), False)
                self.fallback.append(op.name)
                self.impls.append(_fallback(d, op))
            else:
                self.impls.append(d.torch)
        self.p2p = [REGISTRY[op.name].rendezvous is P2P for op in self.ops]
        self.comm = [REGISTRY[op.name].kind is OpKind.RANK_COMM for op in self.ops]
        keep = set(fn.outputs)
        last: dict[Value, int] = {}
        for k, op in enumerate(self.ops):
            for v in op.inputs:
                last[v] = k
        self.drop: list[list[Value]] = [[] for _ in self.ops]
        for v, k in last.items():
            if v not in keep and v not in fn.params:
                self.drop[k].append(v)
        self.texts: list[str] | None = None
        # each result's (torch dtype, shape) when it is a tensor, checked after the op
        self.expect = [
            [
                (ctx.dtype(v.type.dtype), v.type.shape) if isinstance(v.type, TensorType) else None
                for v in op.outputs
            ]
            for op in self.ops
        ]
        # coalesced collectives: first part -> its parts; parts run early (not at their index)
        self.calls = {parts[0]: list(parts) for parts in calls}
        self.early = {j for parts in self.calls.values() for j in parts[1:]}
        self.buffers: dict[tuple[int, int], Any] = {}  # the calls' flat buffers (``_buffer``)
        # a later part's inputs it reads last, dropped when its call has run (as if it ran
        # there), unless an op between the call and the part reads them
        self.with_call: dict[int, list[Value]] = {}
        for k, parts in self.calls.items():
            for j in parts[1:]:
                between = {v for i in range(k + 1, j) if i not in parts for v in self.ops[i].inputs}
                self.with_call[j] = [v for v in self.drop[j] if v not in between]
                self.drop[j] = [v for v in self.drop[j] if v in between]
        self.at = 0  # the op being run
        self.batch: list[tuple[int, float]] = []  # posted point-to-point ops: (index, when)

    def _check(self, k: int, outs: Sequence[Any]) -> None:
        """A tensor result must have its type's shape and dtype (as the reference checks)."""
        want = self.expect[k]
        if len(outs) != len(want):
            raise OpTypeError(f"{self.ops[k].name} returned {len(outs)} results, expected {len(want)}")
        for v, o, w in zip(self.ops[k].outputs, outs, want, strict=True):
            if w is not None and (o.dtype, tuple(o.shape)) != w:
                got = f"{str(o.dtype).removeprefix('torch.')} {tuple(o.shape)}"
                raise OpTypeError(f"%{v.name} came out {got}, not {v.type}")

    def _coalesced(self, parts: Sequence[int], env: dict[Value, Any]) -> list[tuple[int, Any]]:
        """Run ``parts`` (one coalesced collective) as one call; one by one if it cannot be."""
        args = [([env[v] for v in self.ops[j].inputs], self.ops[j].attrs) for j in parts]
        fused = REGISTRY[self.ops[parts[0]].name].torch_coalesced
        outs = fused(self.ctx, args, lambda slot, n, dtype: self._buffer((parts[0], slot), n, dtype))
        if outs is None:
            outs = [self.impls[j](self.ctx, ins, attrs) for j, (ins, attrs) in zip(parts, args, strict=True)]
        return list(zip(parts, outs, strict=True))

    def _buffer(self, key: tuple[int, int], numel: int, dtype: Any) -> Any:
        """A coalesced call's flat buffer ``key`` (call, slot), kept from step to step as a
        trainer keeps its buckets."""
        b = self.buffers.get(key)
        if b is None or b.numel() != numel or b.dtype != dtype:
            b = self.buffers[key] = self.ctx.torch.empty(numel, dtype=dtype, device=self.ctx.device)
        return b

    def text(self, k: int) -> str:
        if self.texts is None:
            self.texts = [print_op(op) for op in self.ops]
        return self.texts[k]

    def _flush(self, k: int, trace: list[OpSlice] | None, t0: float, live: int) -> None:
        """Start and wait for the posted point-to-point operations; a failure is charged to the
        last of them (the op ``k`` waiting for them has not started). Traced as one slice per
        batch, from the first post to the end of the wait, named by its ops."""
        batch, self.batch = self.batch, []
        self.at = batch[-1][0] if batch else k
        self.ctx.flush()
        if trace is not None and batch:
            names = "+".join(dict.fromkeys(self.ops[j].name for j, _ in batch))
            text = "; ".join(self.text(j) for j, _ in batch)
            trace.append(OpSlice(names, "comm", batch[0][1] - t0, time.perf_counter() - t0, text, live))
        self.at = k
        if self.progress is not None:
            self.progress[1] = k

    def step(self, args: Sequence[Any], trace: bool, t0: float) -> tuple[tuple[Any, ...], int, list[OpSlice]]:
        ctx = self.ctx
        env: dict[Value, Any] = dict(zip(self.fn.params, args, strict=True))
        received: set[Value] = set()
        live = _LiveBytes()
        for a in args:
            live.add(a)
        slices: list[OpSlice] = []
        traced = slices if trace else None
        clock = time.perf_counter
        cpu_clock = time.thread_time if trace else _no_clock
        for k, op in enumerate(self.ops):
            self.at = k
            if self.progress is not None:
                self.progress[1] = k
            if ctx.pending and (not self.p2p[k] or any(v in received for v in op.inputs)):
                self._flush(k, traced, t0, live.bytes)
                received.clear()
            if k in self.early:  # run with its first part (``coalesced_calls``)
                for v in self.drop[k]:
                    live.drop(env.pop(v))
                continue
            start, cpu0 = clock(), cpu_clock()
            if self.p2p[k]:
                self.batch.append((k, start))
            parts = self.calls.get(k)
            if parts is None:
                done = [(k, self.impls[k](ctx, [env[v] for v in op.inputs], op.attrs))]
            else:
                done = self._coalesced(parts, env)
            if not self.p2p[k] and ctx.device.type == "cuda":
                ctx.torch.cuda.synchronize()
            end, cpu1 = clock(), cpu_clock()
            for j, outs in done:
                self._check(j, outs)
                for v, y in zip(self.ops[j].outputs, outs, strict=True):
                    env[v] = y
                    live.add(y)
                    if self.p2p[j]:
                        received.add(v)
                if parts is not None:  # each part's inputs go as they would after it alone
                    for v in self.drop[k] if j == k else self.with_call[j]:
                        live.drop(env.pop(v))
            if trace and not self.p2p[k]:
                cat = "comm" if self.comm[k] else "compute"
                slices.append(
                    OpSlice(op.name, cat, start - t0, end - t0, self.text(k), live.bytes, cpu1 - cpu0)
                )
            for v in self.drop[k] if parts is None else ():
                live.drop(env.pop(v))
        self._flush(len(self.ops), traced, t0, live.bytes)
        self.at = len(self.ops)
        return tuple(env[v] for v in self.fn.outputs), live.peak, slices


def _no_clock() -> float:
    return 0.0


def _gpu(torch: Any, setup: RankSetup) -> int:
    return (setup.local_rank if setup.local_rank >= 0 else setup.rank) % int(torch.cuda.device_count())


def _make_context(
    torch: Any, setup: RankSetup, job: RankProgram, groups: dict[tuple[int, ...], Any]
) -> TorchContext:
    cuda = setup.backend == "nccl"
    dev = torch.device(f"cuda:{_gpu(torch, setup)}") if cuda else torch.device("cpu")
    return TorchContext(torch, dev, me=job.device, ranks=dict(job.ranks), groups=groups)


def run_programs(setup: RankSetup, jobs: Sequence[RankProgram], progress: Any = None) -> list[RankResult]:
    """Join the process group and run each of this rank's programs (see the module docstring).
    The process group stays up (the caller may gather results over it, then destroys it).
    ``progress``: shared (program index, op index, ``Stage``) the launcher reads."""
    torch = require_torch()
    torch.set_num_threads(1)
    dist = torch.distributed
    if setup.backend == "nccl":
        torch.cuda.set_device(_gpu(torch, setup))
    dist.init_process_group(
        setup.backend,
        init_method=setup.init_method,
        rank=setup.rank,
        world_size=setup.world_size,
        timeout=timedelta(seconds=setup.timeout_s),
    )
    groups: dict[tuple[int, ...], Any] = {}
    keys = sorted({tuple(sorted(job.ranks[d] for d in g)) for job in jobs for g in job.groups})
    for key in keys:  # every rank makes every group, in the same order
        groups[key] = dist.new_group(list(key)) if len(key) < setup.world_size else dist.group.WORLD
    if progress is not None:
        progress[2] = Stage.RUNNING
    results = []
    for i, job in enumerate(jobs):
        if progress is not None:
            progress[0] = i
        results.append(_run_one(torch, setup, job, groups, progress))
    dist.barrier()
    return results


def _run_one(
    torch: Any, setup: RankSetup, job: RankProgram, groups: dict[tuple[int, ...], Any], progress: Any
) -> RankResult:
    ctx = _make_context(torch, setup, job, groups)
    fn = inline_calls(job.program)
    runner = _Runner(ctx, fn, progress, job.calls)
    args = args_to_torch(ctx, fn, job.inputs)
    cuda = ctx.device.type == "cuda"
    times: list[float] = []
    cpu_times: list[float] = []
    outs: tuple[Any, ...] = ()
    peak = 0
    slices: list[OpSlice] = []
    for s in range(job.steps):
        torch.distributed.barrier()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            outs, peak, slices = runner.step(args, job.trace and s == job.steps - 1, t0)
        except RankFailure:
            raise
        except Exception as e:
            raise _failure(setup.rank, job.device, runner, e) from e
        if cuda:
            torch.cuda.synchronize()
            peak = int(torch.cuda.max_memory_allocated())
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.thread_time() - c0)
    source = "cuda allocator" if cuda else "tracked live tensors"
    fallback = sorted(set(runner.fallback))
    return RankResult(job.device, to_numpy(outs), times, peak, source, slices, fallback, cpu_times)


def _failure(rank: int, device: Device, runner: _Runner, e: BaseException) -> RankFailure:
    k = runner.at
    text = runner.text(k) if k < len(runner.ops) else None
    secondary = k < len(runner.ops) and runner.comm[k]
    where = f" at `{text}`" if text is not None else ""
    return RankFailure(
        f"rank {rank} ({device}) failed{where}: {type(e).__name__}: {e}", rank, text, secondary
    )
