"""Tensor-parallel communication overlapped with matrix products (Megatron-LM's
``--tp-comm-overlap``: Transformer Engine's userbuffers).

With sequence parallelism every tensor-parallel collective sits next to a GEMM, and Transformer
Engine runs the two at once, in one of three ways (``c``: the collective alone, ``g``: the GEMM
alone, ``n``: the tensor-parallel size, the number of chunks):

- **ring exchange, AllGather then its GEMM** (QKV and FC1 forward; the row-parallel input
  gradient): each rank multiplies the chunk it holds while chunks pass around the ring,
  ``n - 1`` transfers of ``c / (n - 1)`` beside ``n`` products of ``g / n``; the pair takes
  ``max(g, c + g / n)``. Every GEMM that reads the gathered tensor is that product (``g`` their
  sum): Megatron-Core computes Q, K and V as one GEMM of one fused weight (``linear_qkv``,
  megatron/core/transformer/attention.py at f2e5db4) where a model may write three, and
  PyTorch's async tensor parallelism gathers once for all the matmuls of one gathered input
  (``fused_all_gather_matmul`` takes a list of weights).
- **pipelined, a GEMM then its ReduceScatter** (proj and FC2 forward; the column-parallel input
  gradient): the GEMM runs in ``k`` chunks, chunk ``i``'s partial sums reduce-scattered while
  chunk ``i + 1`` is multiplied; the pair takes ``max(g + c / k, g / k + c)``.
- **bulk, a collective beside an independent GEMM** (the backward's re-gathered layer input
  beside the input-gradient GEMM, the input gradient's ReduceScatter beside the weight-gradient
  GEMM): the two run side by side and take ``max(g, c)``.

How many chunks and what the collectives' kernels take from the GEMM beside them is the
trainer's (``Form``, the cost model's ``tp_overlap``):

- **Transformer Engine's userbuffers** (``te_form``; Megatron-LM's ``--tp-comm-overlap``):
  Megatron-LM hands ``initialize_ub`` an empty configuration unless ``--tp-comm-overlap-cfg``
  names one (``_initialize_tp_communicators``, megatron/training/initialize.py at core_r0.8.0),
  so every layer takes TE's defaults (``initialize_ub``'s ``add_ub``,
  transformer_engine/pytorch/module/base.py, the same at v1.7, v1.8 and v1.9; Megatron at
  core_r0.8.0 calls ``initialize_ub(..., tp_size=...)``, which v1.7 and v1.9 take and v1.8, whose
  second parameter is ``tp_group``, does not): the pipeline method splits its GEMM into
  ``num_splits=4`` chunks whatever ``n`` (``k = 4``; a ring has one chunk per rank); the
  pipeline and bulk methods move data with userbuffers kernels of ``num_sm=16`` SMs
  (``UbufCommOverlap``, ``use_ce = 0``, transformer_engine/pytorch/csrc/comm_gemm_overlap.h at
  v1.7), and the GEMM beside them is launched on every SM (``_math_sms`` is the device's SM
  count unless ``set_sm_margin``, which defaults to 0): nothing is reserved, the two kernels
  share the SMs while both run; the ring exchange copies through the copy engines
  (``UbufP2PCommOverlap``, ``use_ce = 1``). So a pipelined or bulk collective slows the GEMM beside it by
  ``s = 16 / SMs`` of the time they share, as an NCCL kernel slows the compute beside it
  (``distir.sim.interference``'s rate model): bulk ``max(g + s·min(c, g), c)``, pipelined
  ``max(g + c / k + s·min(c, g)·(k − 1) / k, g / k + c)`` (the last chunk's reduction runs
  after the GEMM).
- **one chunk per rank, no SMs** (``PER_RANK``): ``k = n``, ``s = 0``.
- **PyTorch's async tensor parallelism** (``ASYNC_TP``; torchtitan's
  ``enable_async_tensor_parallel``): one chunk per rank, no SMs, and no bulk pairs. Inductor's
  ``micro_pipeline_tp`` pass (torch/_inductor/fx_passes/micro_pipeline_tp.py at torch 2.6.0 and
  2.7.0, the releases either side of the main 1963fc8 that torchtitan's December-2024 benchmark
  ran, which match alike for tensorwise float8 scales) rewrites only an
  all-gather whose result is the left operand of matmuls (``_find_consumer_matmuls``: ``mm``
  or ``_scaled_mm``, directly or as reshape → mm → reshape; ``fuse_all_gather_matmul``) and a
  reduce-scatter whose input is a matmul's result used by nothing else
  (``_find_producer_matmul``, ``fuse_matmul_reduce_scatter``), forward and backward graph
  alike; every other collective stays a plain functional collective, waited on at its first
  use. So a reduce-scatter fed by a sum (the backward's input gradient of Q, K and V, or of the
  MLP's two column-parallel projections, summed over the matmuls that read one gathered
  input) runs exposed: ``pairs`` finds it no direct GEMM, and this form offers it no
  independent one. (The pass takes only matmuls reading the gathered tensor as their left
  operand; ``pairs`` takes every GEMM reading it. In a Llama block the two agree: the
  backward's weight-gradient GEMM reads the gathered gradient through a Reshape.)

The simulator keeps every op in the program and on its stream, in order; the collective is
charged what its pair takes beyond the GEMM (``exposed``), so the trace shows its exposed part.
Which ops pair is read from the program's structure (``pairs``: a layout-changing op — a
``Fusion.TRANSPARENT`` op — whose result a GEMM consumes first (with the other GEMMs reading
it), or whose input a GEMM produced,
and the GEMMs before it that it does not depend on, nearest first) and from the planner's
records (the op is a one-step AllGather or ReduceScatter along one mesh axis,
``OpRecord.collective``, on the very clocks of the GEMM: not on a communication stream). In
program order each collective takes its direct GEMM if free, else the nearest free independent
one (a ring takes its direct GEMM and the free GEMMs of its group); a GEMM overlaps one
collective. Not modelled: the lower efficiency of the split products (a ring's GEMMs run on
1/n of the gathered tokens, ``n_chunk = n / _tp_size`` in ``split_overlap_ag``; a pipeline's on
a quarter of the output features, ``m_chunk = m / _num_splits`` in ``split_overlap_rs``; TE
issues them round-robin on three compute streams, ``_NUM_MAX_UB_STREAMS``, so ready chunks run
side by side), and the HBM bandwidth the userbuffers kernels take.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeVar

from distir.ir.function import Function
from distir.ir.ops import Instr, Op
from distir.ir.values import Value
from distir.ops.registry import REGISTRY, CommPattern, Fusion, OpDef, UnknownOpError
from distir.sim.records import CallSummary, OpRecord

NO_PAIR = -1
BULK_CANDIDATES = 8  # independent GEMMs looked at before a collective, nearest first
TE_PIPELINE_SPLITS = 4  # the pipelined GEMM's chunks: TE's default ``num_splits`` (module docstring)
TE_COMM_SMS = 16  # the SMs of TE's pipelined and bulk userbuffers kernels: its default ``num_sm``


class Form(NamedTuple):
    """How a trainer overlaps (module docstring): ``splits``, the chunks of a pipelined pair (0:
    one per rank); ``share``, the fraction of the GEMM's SMs a pipelined or bulk collective's
    kernels hold while they run; ``bulk``, whether a collective that pairs with no direct GEMM
    may run beside an independent one (False: only the direct pairs, ring and pipelined)."""

    splits: int
    share: float
    bulk: bool = True


PER_RANK = Form(0, 0.0)
ASYNC_TP = Form(0, 0.0, bulk=False)  # PyTorch's micro_pipeline_tp pass (module docstring)


def te_form(sms: int) -> Form:
    """Transformer Engine's userbuffers on a GPU of ``sms`` SMs (module docstring)."""
    return Form(TE_PIPELINE_SPLITS, TE_COMM_SMS / sms)


def form_of(cost: object) -> Form | None:
    """The overlap a cost model charges: None when it overlaps nothing (``tp_comm_overlap``
    off), its ``tp_overlap()`` when it has one, else ``PER_RANK``."""
    if not getattr(cost, "tp_comm_overlap", False):
        return None
    fn = getattr(cost, "tp_overlap", None)
    return fn() if fn is not None else PER_RANK


_R = TypeVar("_R", OpRecord, OpRecord | CallSummary)


class Candidates(NamedTuple):
    """The GEMMs a layout-changing op may overlap: ``direct`` (its result's first consumer, or
    its input's producer, or ``NO_PAIR``), ``after`` (the direct GEMM comes after it), and
    ``bulk``: GEMMs before it that it does not depend on, nearest first; ``group``: with a
    direct GEMM after it, the other GEMMs that read its result (one product with the direct
    one, in a ring)."""

    direct: int
    after: bool
    bulk: tuple[int, ...]
    group: tuple[int, ...] = ()


def _opdef(instr: Instr) -> OpDef | None:
    """The registry's definition of an op instruction (None: a call, or an op it does not know)."""
    if not isinstance(instr, Op):
        return None
    try:
        return REGISTRY[instr.name]
    except UnknownOpError:
        return None


def _is_gemm(instr: Instr) -> bool:
    d = _opdef(instr)
    return d is not None and d.gemm is not None


def _is_layout_change(instr: Instr) -> bool:
    d = _opdef(instr)
    return d is not None and d.fusion is Fusion.TRANSPARENT


def _ancestors(body: Sequence[Instr], producer: dict[Value, int], v: Value) -> set[int]:
    """The instructions ``v`` is computed from (in this body)."""
    seen: set[int] = set()
    stack = [producer[v]] if v in producer else []
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        stack.extend(producer[x] for x in body[i].inputs if x in producer)
    return seen


def pairs(fn: Function) -> list[Candidates | None]:
    """Per instruction of ``fn``'s body, the GEMMs a collective there may overlap, or None (not
    a one-input, one-result layout change, or nothing to overlap)."""
    body = fn.body
    gemms = [i for i, x in enumerate(body) if _is_gemm(x)]
    out: list[Candidates | None] = [None] * len(body)
    if not gemms:
        return out
    producer: dict[Value, int] = {}
    first_use: dict[Value, int] = {}
    gemm_uses: dict[Value, list[int]] = {}
    is_gemm = set(gemms)
    for i, instr in enumerate(body):
        for v in instr.inputs:
            first_use.setdefault(v, i)
            if i in is_gemm and i not in gemm_uses.setdefault(v, []):
                gemm_uses[v].append(i)
        for v in instr.outputs:
            producer[v] = i
    for i, instr in enumerate(body):
        if len(instr.inputs) != 1 or len(instr.outputs) != 1 or not _is_layout_change(instr):
            continue
        src = instr.inputs[0]
        direct, after = first_use.get(instr.outputs[0], NO_PAIR), True
        if direct not in is_gemm:
            direct, after = producer.get(src, NO_PAIR), False
            if direct not in is_gemm or first_use.get(src) != i:
                direct = NO_PAIR
        needs = _ancestors(body, producer, src)
        bulk = tuple(j for j in reversed(gemms) if j < i and j not in needs and j != direct)
        group = tuple(j for j in gemm_uses.get(instr.outputs[0], ()) if j != direct) if after else ()
        out[i] = Candidates(direct, after, bulk[:BULK_CANDIDATES], group)
    return out


def chunks(mode: str, ranks: int, splits: int = 0) -> int:
    """How many chunks a ``mode`` pair runs in over a collective of ``ranks`` ranks: a ring one
    per rank, a pipeline ``splits`` (0: one per rank; a collective of one rank: one, nothing to
    pipeline)."""
    if mode == "pipelined" and ranks > 1 and splits > 0:
        return splits
    return ranks


def exposed(mode: str, comm_s: float, gemm_s: float, n: int, share: float = 0.0) -> float:
    """What a collective costs beyond the GEMM it runs with (the module docstring's formulas):
    ``mode`` is ``ring`` (AllGather, then the GEMM), ``pipelined`` (the GEMM, then
    ReduceScatter) or ``bulk``; ``n`` chunks (``chunks``); ``share``, the fraction of the GEMM's
    SMs a pipelined or bulk collective holds. Never more than ``comm_s``."""
    if mode == "bulk":
        return min(comm_s, max(share * min(comm_s, gemm_s), comm_s - gemm_s))
    if n < 2:
        return comm_s
    if mode == "ring":
        return min(comm_s, max(0.0, comm_s + gemm_s / n - gemm_s))
    stall = share * min(comm_s, gemm_s) * (n - 1) / n
    return min(comm_s, max(comm_s / n + stall, comm_s + gemm_s / n - gemm_s))


def _charged(
    rec: OpRecord | CallSummary, gemm: OpRecord | CallSummary, mode: str, form: Form, extra_s: float = 0.0
) -> OpRecord | None:
    """``rec`` charged its exposed part beside ``gemm`` in ``mode`` under ``form`` (``extra_s``:
    the time of the GEMMs of its group, one product with ``gemm``), or None when the two do not
    pair (not a one-step AllGather/ReduceScatter on the GEMM's clocks; the wrong pattern for a
    ring or a pipeline)."""
    if not isinstance(rec, OpRecord) or not isinstance(gemm, OpRecord) or gemm.comm:
        return None
    col = rec.collective
    if col is None or col.pattern not in (CommPattern.ALLGATHER, CommPattern.REDUCESCATTER):
        return None
    if rec.devs != gemm.devs:
        return None
    if mode == "ring" and col.pattern is not CommPattern.ALLGATHER:
        return None
    if mode == "pipelined" and col.pattern is not CommPattern.REDUCESCATTER:
        return None
    n = chunks(mode, col.size, form.splits)
    share = form.share if mode != "ring" else 0.0
    return rec._replace(seconds=exposed(mode, rec.seconds, gemm.seconds + extra_s, n, share))


def _choices(c: Candidates, form: Form) -> list[tuple[int, str]]:
    """The GEMMs ``c``'s collective may take under ``form``, in order, each with its mode."""
    direct = [(c.direct, "ring" if c.after else "pipelined")] if c.direct != NO_PAIR else []
    return direct + [(j, "bulk") for j in c.bulk] if form.bulk else direct


class _Group(NamedTuple):
    members: tuple[int, ...]  # instruction indices
    seconds: float  # their time together


def _members(
    record: Callable[[int], OpRecord | CallSummary], c: Candidates, j: int, mode: str, taken: set[int]
) -> _Group:
    """The GEMMs a ring's product takes with its direct GEMM ``j``: the free ones of its group
    on ``j``'s clocks (none in the other modes)."""
    head = record(j)
    if mode != "ring" or not c.group or not isinstance(head, OpRecord):
        return _Group((), 0.0)
    found = [(g, r) for g in c.group if g not in taken and isinstance(r := record(g), OpRecord)]
    kept = [(g, r) for g, r in found if not r.comm and r.devs == head.devs]
    return _Group(tuple(g for g, _ in kept), sum(r.seconds for _, r in kept))


def apply(records: Sequence[_R], paired: Sequence[Candidates | None], form: Form = PER_RANK) -> list[_R]:
    """``records`` (one per instruction) with each collective that pairs charged its exposed
    part under ``form``; in program order, a collective takes the first free GEMM of its
    candidates."""
    out = list(records)
    taken: set[int] = set()
    for i, c in enumerate(paired):
        if c is None:
            continue
        for j, mode in _choices(c, form):
            if j in taken:
                continue
            prod: _Group = _members(lambda g: out[g], c, j, mode, taken)
            new = _charged(out[i], out[j], mode, form, prod.seconds)
            if new is not None:
                out[i] = new
                taken.update((j, *prod.members))
                break
    return out


def apply_kinds(
    kinds: list[int], table: list[OpRecord], paired: Sequence[Candidates | None], form: Form = PER_RANK
) -> None:
    """``apply`` for a plan kept as distinct records (``table``) and an index per instruction
    (``kinds``), in place: a collective charged differently gets a record of its own."""
    made: dict[tuple[int, int, str, tuple[int, ...]], int | None] = {}
    taken: set[int] = set()
    for i, c in enumerate(paired):
        if c is None:
            continue
        for j, mode in _choices(c, form):
            if j in taken:
                continue
            prod: _Group = _members(lambda g: table[kinds[g]], c, j, mode, taken)
            key = (kinds[i], kinds[j], mode, tuple(kinds[g] for g in prod.members))
            if key not in made:
                new = _charged(table[kinds[i]], table[kinds[j]], mode, form, prod.seconds)
                if new is not None:
                    table.append(new)
                made[key] = None if new is None else len(table) - 1
            k = made[key]
            if k is not None:
                kinds[i] = k
                taken.update((j, *prod.members))
                break
