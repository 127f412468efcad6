"""Compute microbenchmarks for ``distir calibrate``: registry ops timed on torch.

Each case names a registry op (its family, FLOPs, bytes and GEMM shape come from the op's cost
descriptors, so the fit is in the cost model's own terms) and runs what ``distir run`` runs for
it (``op_impl``: the op's registry torch implementation, or its numpy reference through the
host for an op without one). Cases cover matrix products over (M, N, K) shapes, elementwise
ops, row-wise ops (Softmax, LayerNormalization, SoftmaxGrad, the loss, ReduceSum along rows and along
columns) over wide and narrow rows, the rest of a GPT step's ops at the same rows (the
embedding's Gather and its gradient, Slice, the vocabulary-parallel loss's parts and their
gradient), and attention, over sizes and dtypes. Inputs are random normal tensors made once per
case (and copied, see below); the caller sets the thread count (``torch.set_num_threads``).

Timing (``time_call``): one warm-up call, then batches of calls sized to last about
``batch_s`` each; the time is the fastest of ``repeats`` batches' time per call (on a shared
machine other processes only ever add time; on CUDA, each batch ends with
``torch.cuda.synchronize``). On a CPU the clock is the calling thread's CPU time (``op_clock``:
the op runs on that one thread), so a machine whose cores other processes keep busy still
measures what the op costs.

**As a step runs them** (on a CPU): no op of a training step runs twice in a row on the same
buffers. Its inputs were written by earlier ops (the step streams through more memory than a
core's private caches hold) and its result is a fresh allocation, not the buffer its last call
wrote. Timed on the same warm buffers call after call, an op reads and writes the core's L2 and
comes out faster than in a step (on the machine this was written on, the ops of a small GPT's
training step took 39 ms warm against 55-60 ms in the step; 56-61 ms as timed here). So each call
takes the next of several copies of the case's inputs, cycled through a pool of ``POOL_CACHES``
times the core's private cache (``private_cache_bytes``, from sysfs; ``pool_copies`` copies),
and the last calls' results stay alive as long as a copy is reused (``Rotation``), so the
allocator hands every call fresh memory. ``run_cases(pool=0)`` times warm (one buffer set), as
``distir.backend.dispatch`` does for its tight-loop reference; on a GPU the pool is 0 (not
measured there).

Sizes stop at 2^20 elements per tensor (4 MiB in f32): the sizes of the steps ``distir
validate`` runs on a CPU. Beyond them a CPU slows down (every eager op's output is fresh memory
the kernel must fault in page by page: 1-7 GB/s against 30 GB/s below, on the machine this was
written on), which one memory bandwidth per family cannot describe; profiles are for the
measured range.
"""

from __future__ import annotations

import collections
import itertools
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, cast

from distir.backend import require_torch
from distir.backend.context import TorchContext
from distir.backend.domain import to_numpy, to_torch
from distir.hardware.fit import GemmSample, OpSample
from distir.hardware.gemm import GemmShape
from distir.ir.types import Device, DType, TensorType
from distir.ir.values import Attrs
from distir.ops.registry import REGISTRY, OpDef


class Case(NamedTuple):
    """One op at one size: the registry op, its input shapes, attributes, which inputs are
    integer class labels (drawn in [0, shape[-1] of input 0)), which are an integer 1 (a step
    count), which stay f32 whatever the dtype (statistics such as attention's lse), and which
    are non-negative (|N(0, 1)|: Adam's second moment, a mean of squares — a negative one
    would make its square root NaN, which this machine's CPU computes ~10x slower)."""

    op: str
    shapes: tuple[tuple[int, ...], ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    labels: tuple[int, ...] = ()
    ones: tuple[int, ...] = ()
    f32: tuple[int, ...] = ()
    nonneg: tuple[int, ...] = ()

    def dtype(self, i: int, dtype: DType) -> DType:
        """The dtype of input ``i`` when the case runs in ``dtype``."""
        if i in self.labels or i in self.ones:
            return DType.i64
        return DType.f32 if i in self.f32 else dtype


class Sizes(NamedTuple):
    """The sweep: GEMM (M, N, K) per dtype kind, elementwise sizes, row-wise (rows, cols),
    attention (B, S, heads, head dim)."""

    gemm: tuple[tuple[int, int, int], ...]
    gemm_low: tuple[tuple[int, int, int], ...]  # for 16-bit dtypes (slow on CPUs)
    elementwise: tuple[int, ...]
    rows: tuple[tuple[int, int], ...]
    attention: tuple[tuple[int, int, int, int], ...]


FULL = Sizes(
    gemm=(
        (128, 128, 128),
        (256, 256, 256),
        (512, 512, 512),
        (1024, 1024, 1024),
        (2048, 512, 512),
        (512, 2048, 128),
        (64, 1024, 1024),
        (1024, 64, 1024),
        (256, 256, 2048),
        (1536, 1536, 512),
    ),
    gemm_low=((128, 128, 128), (256, 256, 256), (512, 512, 512), (512, 128, 1024), (768, 768, 256)),
    elementwise=(1 << 10, 1 << 13, 1 << 16, 1 << 18, 1 << 20),
    # rows of 1024, and of a small model's hidden sizes: a row-wise op's cost grows with its
    # rows as well as its bytes, so 512 rows of 128 are not priced like 64 rows of 1024
    rows=((64, 1024), (256, 1024), (1024, 1024), (512, 128), (2048, 128), (1024, 256)),
    attention=((1, 64, 4, 32), (2, 128, 4, 32), (1, 256, 4, 64)),
)

QUICK = Sizes(
    gemm=((32, 32, 32), (64, 64, 64), (128, 128, 128), (256, 128, 64), (64, 256, 128)),
    gemm_low=((32, 32, 32), (64, 64, 64), (128, 64, 128)),
    elementwise=(1 << 8, 1 << 12, 1 << 16, 1 << 18),
    rows=((16, 256), (64, 512), (256, 1024)),
    attention=((1, 32, 2, 16), (1, 64, 2, 32)),
)

ROW_OPS = (
    "Softmax",
    "SoftmaxGrad",
    "ReduceSum",
    "SoftmaxCrossEntropyLoss",
    "LayerNormalization",
    "LayerNormalizationGrad",
)
POINTWISE = ("Mul", "Gelu", "Exp", "GeluGrad")
BANDWIDTH_OP = "Add"  # the case whose times measure the memory bandwidth (``calibrate``)


def _row_case(op: str, r: int, c: int) -> Case:
    """A row-wise op over (r, c), reducing along the last axis."""
    if op == "LayerNormalization":
        return Case(op, ((r, c), (c,), (c,)), (("axis", -1),))
    if op == "SoftmaxGrad":
        return Case(op, ((r, c), (r, c)), (("axis", -1),))
    if op == "LayerNormalizationGrad":
        return Case(op, ((r, c), (r, c), (c,)), (("axis", -1),))
    if op == "ReduceSum":
        return Case(op, ((r, c),), (("axes", (-1,)),))
    if op == "SoftmaxCrossEntropyLoss":
        return Case(op, ((r, c), (r,)), labels=(1,))
    return Case(op, ((r, c),), (("axis", -1),))


def _step_cases(r: int, c: int) -> list[Case]:
    """The other ops a GPT training step runs, at (r rows, c columns): the embedding's Gather
    from a (c, c) table and its gradient, the position table's Slice, and the vocabulary-parallel
    loss's parts and their gradient (one piece of 2c classes: half the labels on it). Without
    cases of their own they take their class's rates, which other ops set (a Gather moves its
    rows through an index, not a stream)."""
    return [
        Case("Gather", ((c, c), (r,)), (("axis", 0), ("rows", (0, c))), labels=(1,)),
        Case("GatherGrad", ((r, c), (r,), (c, c)), (("axis", 0), ("size", c), ("rows", (0, c))), labels=(1,)),
        Case("Slice", ((r, c),), (("starts", (0,)), ("ends", (r // 2,)), ("axes", (0,)))),
        Case("SoftmaxCrossEntropyParts", ((r, c), (r,), (r,)), (("rows", (0, 2 * c)),), labels=(2,)),
        Case(
            "SoftmaxCrossEntropyPartsGrad",
            ((r,), (r,), (r, c), (r,), (r,)),
            (("rows", (0, max(2 * c, r))),),  # labels drawn below r: within the classes
            labels=(4,),
        ),
    ]


def _cases(sizes: Sizes, low: bool) -> list[Case]:
    """Every case of ``sizes`` (``low``: the GEMM shapes for 16-bit dtypes)."""
    out = [Case("MatMul", ((m, k), (k, n))) for m, n, k in (sizes.gemm_low if low else sizes.gemm)]
    out += [Case(BANDWIDTH_OP, ((n,), (n,))) for n in (1, *sizes.elementwise)]
    for n in sizes.elementwise:
        out += [Case(op, ((n,),) * REGISTRY[op].min_inputs) for op in POINTWISE]
    out += [_row_case(op, r, c) for r, c in sizes.rows for op in ROW_OPS]
    # a sum over the leading axis: what a bias's or a norm's gradient reduces
    out += [Case("ReduceSum", ((r, c),), (("axes", (0,)),)) for r, c in sizes.rows]
    out += [Case("Adam", ((n,),) * 4 + ((),), ones=(4,), nonneg=(3,)) for n in sizes.elementwise]
    for r, c in sizes.rows:
        out += [
            Case("Reshape", ((r, c),), (("shape", (r * c,)),)),
            Case("Transpose", ((r, c),), (("perm", (1, 0)),)),
        ]
    out += [c for r, cols in sizes.rows for c in _step_cases(r, cols)]
    for b, s, h, d in sizes.attention:
        out.append(Case("Attention", ((b, s, h, d),) * 3, (("causal", True),)))
        out.append(Case("AttentionGrad", ((b, s, h, d),) * 5 + ((b, h, s),), (("causal", True),), f32=(5,)))
    return out


def op_impl(op: OpDef) -> Callable[[TorchContext, Sequence[Any], Attrs], Sequence[Any]]:
    """What ``distir run`` executes for ``op``: its registry torch implementation, or, for an op
    without one, its numpy reference with the tensors moved through the host (as the worker's
    fallback does)."""
    if op.torch is not None:
        return cast(Callable[[TorchContext, Sequence[Any], Attrs], Sequence[Any]], op.torch)
    ref = op.reference
    if ref is None:
        raise ValueError(f"{op.name} has neither a torch implementation nor a reference")

    def fallback(ctx: TorchContext, inputs: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
        return [to_torch(ctx, y) for y in ref([to_numpy(x) for x in inputs], attrs)]

    return fallback


POOL_CACHES = 4  # the operand pool spans this many times the core's private cache
DEFAULT_PRIVATE_CACHE = 1 << 20  # when sysfs does not say (1 MiB: a recent server core's L2)
MAX_COPIES = 256  # at most this many copies of a case's inputs


def private_cache_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """The largest data cache of one core that no other CPU shares (Linux sysfs: each
    ``index*/`` with ``type``, ``size`` such as ``1024K`` and ``shared_cpu_list``), or
    ``DEFAULT_PRIVATE_CACHE`` where sysfs does not say."""
    best = 0
    for d in sorted(root.glob("index*")):
        try:
            kind = (d / "type").read_text().strip()
            size = (d / "size").read_text().strip().upper()
            shared = (d / "shared_cpu_list").read_text().strip()
        except OSError:
            continue
        if kind == "Instruction" or not size or "," in shared or "-" in shared:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1], 1)
        digits = size[:-1] if size[-1] in "KMG" else size
        if digits.isdigit():
            best = max(best, int(digits) * unit)
    return best or DEFAULT_PRIVATE_CACHE


def pool_copies(nbytes: float, pool: float, cap: int = MAX_COPIES) -> int:
    """How many copies of a case's inputs (``nbytes`` together) to cycle through so that they
    span ``pool`` bytes: at least 2, at most ``cap``; 1 when ``pool`` is 0 (warm: one set)."""
    if pool <= 0:
        return 1
    return max(2, min(cap, math.ceil(pool / max(nbytes, 1.0))))


def _nbytes(value: Any) -> int:
    """Bytes of a result (a tensor, or a tuple of them)."""
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    return int(value.numel() * value.element_size()) if hasattr(value, "element_size") else 0


class Rotation:
    """A call of ``impl`` on the next of ``sets`` (input copies, in turn), keeping the fewest
    latest results that span ``pool`` bytes alive (every call's result is the size of the
    first's: a case's shapes are fixed): each call reads inputs it did not just read and writes
    memory the allocator hands out afresh, from a heap holding a pool of live results, as in a
    step (see the module docstring). ``pool`` 0: no result is kept. The bookkeeping per call is
    a cycle step and a bounded append (C-level), so it adds little to the time of a small op."""

    def __init__(
        self, impl: Callable[..., Any], ctx: Any, sets: Sequence[Sequence[Any]], attrs: Attrs, pool: float
    ) -> None:
        self.impl, self.ctx, self.attrs, self.pool = impl, ctx, attrs, pool
        order = list(sets)
        self.next_set = itertools.cycle(order[1:] + order[:1]).__next__
        self.kept: collections.deque[Any] | None = None

    def __call__(self) -> None:
        out = self.impl(self.ctx, self.next_set(), self.attrs)
        if self.kept is None:
            size = max(_nbytes(out), 1)
            keep = 0 if self.pool <= 0 else min(MAX_COPIES, math.ceil(self.pool / size))
            self.kept = collections.deque(maxlen=keep)
        self.kept.append(out)


class CaseCost(NamedTuple):
    family: str  # the op's cost class (``OpDef.cost_class``): calibration fits rates per class
    flops: float
    nbytes: float
    gemm: GemmShape | None


def case_cost(case: Case, dtype: DType) -> CaseCost:
    """The case's cost class, FLOPs, bytes and GEMM shape as the registry counts them."""
    op = REGISTRY[case.op]
    ins = [TensorType(case.dtype(i, dtype), s, Device(0)) for i, s in enumerate(case.shapes)]
    attrs = Attrs(dict(case.attrs))
    outs = op.infer_types(ins, attrs, [None] * len(ins))
    nbytes = op.bytes_read(ins, outs, attrs) + op.bytes_written(ins, outs, attrs)
    gemm = op.gemm(ins, outs, attrs) if op.gemm is not None else None
    return CaseCost(op.cost_class.value, op.flops(ins, outs, attrs), nbytes, gemm)


def time_call(
    fn: Callable[[], Any],
    sync: Callable[[], None],
    batch_s: float,
    repeats: int,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Seconds per call of ``fn`` on ``clock`` (see the module docstring)."""
    t0 = clock()
    fn()
    sync()
    first = max(clock() - t0, 1e-7)
    calls = max(1, min(10_000, math.ceil(batch_s / first)))
    times = []
    for _ in range(repeats):
        t0 = clock()
        for _ in range(calls):
            fn()
        sync()
        times.append((clock() - t0) / calls)
    return min(times)


def op_clock(device: str) -> Callable[[], float]:
    """What times one op on ``device``: on a CPU this thread's CPU time (the op runs on it, one
    thread: what it costs, without the time other processes of a shared machine take from it,
    which a fastest-of-repeats cannot remove once every core is busy all the time); on a GPU
    the wall clock (the kernel runs on the device)."""
    return time.thread_time if device == "cpu" else time.perf_counter


class Timing(NamedTuple):
    """What ``run_cases`` measured: GEMM samples, other op samples, the 1-element Add's time."""

    gemm: list[GemmSample]
    ops: list[OpSample]
    launch_s: float


def plan(sizes: Sizes, dtypes: Sequence[DType]) -> list[tuple[Case, DType]]:
    """Every (case, dtype) to time, in order."""
    return [(c, dt) for dt in dtypes for c in _cases(sizes, dt in (DType.bf16, DType.f16))]


def default_pool(device: str) -> int:
    """The operand pool (bytes) ops are timed on (see the module docstring): ``POOL_CACHES``
    times the core's private cache on a CPU, 0 (warm) on a GPU."""
    return POOL_CACHES * private_cache_bytes() if device == "cpu" else 0


def _inputs(torch: Any, ctx: TorchContext, case: Case, dt: DType, gen: Any) -> list[Any]:
    """Random inputs of ``case`` in ``dt`` (labels, ones and non-negative inputs as it says)."""
    xs = []
    for i, s in enumerate(case.shapes):
        if i in case.labels:
            xs.append(torch.randint(0, case.shapes[0][-1], s, generator=gen).to(ctx.device))
        elif i in case.ones:
            xs.append(torch.ones(s, dtype=torch.int64, device=ctx.device))
        else:
            x = torch.randn(s, generator=gen)
            x = x.abs() if i in case.nonneg else x
            xs.append(x.to(ctx.device, ctx.dtype(case.dtype(i, dt))))
    return xs


def run_cases(
    work: Sequence[tuple[Case, DType]],
    device: str = "cpu",
    batch_s: float = 0.02,
    repeats: int = 5,
    tick: Callable[[str], None] | None = None,
    pool: int | None = None,
) -> Timing:
    """Time every (case, dtype) of ``work`` on ``device``; ``tick(label)`` after each.
    ``pool``: bytes of input copies each case cycles through (None: ``default_pool(device)``;
    0: one warm set)."""
    torch = require_torch()
    ctx = TorchContext.local(device)
    sync = torch.cuda.synchronize if ctx.device.type == "cuda" else (lambda: None)
    clock = op_clock(ctx.device.type)
    gen = torch.Generator(device="cpu").manual_seed(0)
    span = default_pool(ctx.device.type) if pool is None else pool
    gemm: list[GemmSample] = []
    ops: list[OpSample] = []
    launch = math.inf
    for case, dt in work:
        cost = case_cost(case, dt)
        xs = _inputs(torch, ctx, case, dt, gen)
        copies = pool_copies(sum(x.numel() * x.element_size() for x in xs), span)
        sets = [xs] + [[x.clone() for x in xs] for _ in range(copies - 1)]
        call = Rotation(op_impl(REGISTRY[case.op]), ctx, sets, Attrs(dict(case.attrs)), span)
        secs = time_call(call, sync, batch_s, repeats, clock)
        del call, sets
        if cost.gemm is not None:
            gemm.append(GemmSample(cost.gemm, dt.name, cost.flops, secs))
        elif math.prod(case.shapes[0]) == 1:
            launch = min(launch, secs)
        else:
            ops.append(OpSample(case.op, cost.family, dt.name, cost.flops, cost.nbytes, secs))
        if tick is not None:
            tick(f"{case.op} {'x'.join(map(str, case.shapes[0]))} {dt.name}")
    return Timing(gemm, ops, launch if math.isfinite(launch) else 0.0)
