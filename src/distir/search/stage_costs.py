"""The screen's costs per stage up to the gradient sync (the pipeline's time, the layer
assignment, the peak memory of each stage's GPUs), for one strategy on one placement.

``distir.search.screen.Screen.estimate`` splits a placement into what it decides for each stage
(``Stage``: the stage's per-layer figures ``StageRows``, its first GPU's kind, its replica group
and ZeRO-3 gather) and the links between consecutive stages; ``figures`` turns them into the
pipeline's time, the layer assignment and the memory per device (``Figures``; the formulas are
the screen's, see its module docstring). What the placements of one strategy share lives in its
``Tables``: the memo of ``figures`` and of the per-stage arrays it stacks, each entry a pure
function of its key (and the strategy).

The figures are those of the stacked numpy formulation bit for bit: a stage's row gets the same
elementwise operations alone as inside the matrix, and a reduction over fewer than 8 values is done
in Python the way numpy does it (``seq_sum``); longer ones are left to numpy.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from distir.hardware.specs import DeviceSpec
from distir.parallel.distribute import DDP_BUCKET_MB, uniform_counts
from distir.parallel.grad_reduction import reduce_scatter_every_backward
from distir.parallel.pipeline.analysis import CompiledSchedule, compiled_schedule, schedule_times
from distir.parallel.pipeline.partition import Ends, call_counts
from distir.parallel.pipeline.schedules import KINDS, SCHEDULE_NAMES, build_schedule, canonical_name
from distir.parallel.strategy import Strategy
from distir.search.assignment_list_solver import seq_sum
from distir.search.layer_assignment import Assignment, objective_unchecked

# ``Screen._assign``: (time, k, comm, mem, cap) -> an optimal assignment, None if none fits
Assign = Callable[
    [np.ndarray, int, np.ndarray | None, np.ndarray | None, np.ndarray | None], Assignment | None
]


def frozen(values: Sequence[float]) -> np.ndarray:
    """``values`` as a read-only array."""
    a = np.array(values)
    a.flags.writeable = False  # shared by every estimate of the stage
    return a


@dataclass(frozen=True, slots=True)
class StageRows:
    """One stage's per-layer figures (``Screen._stage_rows``), read-only arrays of length L."""

    time: np.ndarray  # forward + backward of one microbatch
    fwd: np.ndarray  # the forward alone (ZeRO-3's gathers overlap each pass's compute)
    ibwd: np.ndarray  # a zero-bubble input-gradient pass alone (ZeRO-3's gathers overlap it, not W)
    weight: np.ndarray
    n_w: np.ndarray
    saved: np.ndarray
    out: np.ndarray
    work: np.ndarray
    carried: np.ndarray  # held from input- to weight-gradient pass (zero-bubble schedules)
    largest: np.ndarray  # the layer's largest weight (its gradient's sum with the accumulator)
    fwd_work: np.ndarray  # ``work`` of the forward alone (above what it leaves)
    bwd_work: np.ndarray  # ``work`` of the backward alone
    ibwd_work: np.ndarray  # ``bwd_work`` of a zero-bubble input-gradient pass
    zbwd_work: np.ndarray  # ``bwd_work`` with the (ZeRO-3 gathered) weights dying too
    cap: float  # the smallest memory of the stage's GPUs
    # weight gradients left pending over tp (``LayerProfile.tp_pending_bytes``), summed once per step
    tp_pending: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class Figures:
    """What ``Screen.estimate`` computes before the gradient sync (its memo)."""

    counts: tuple[int, ...]
    pipe_s: float  # the pipeline's time (``pipeline_time``): the latest of ``stage_end_s``
    stage_end_s: tuple[float, ...]  # when each stage ends its last pass (``pipeline_time``)
    grad_pass_s: tuple[tuple[float, float], ...]  # per chunk, ``PipelineTimes.grad_pass``
    delayed_s: tuple[float, ...]  # per chunk, ``PipelineTimes.delayed``
    chunk_w: tuple[float, ...]  # weight bytes per chunk
    chunk_nw: tuple[int, ...]  # weights per chunk
    # per chunk, its gradient buckets as its last weight-gradient pass fills them (``grad_buckets``)
    buckets: tuple[tuple[tuple[float, float], ...], ...]
    compute_s: float  # k × the slowest stage's per-microbatch time
    mean_busy_s: float  # k × the mean stage's per-microbatch time
    stage_w: tuple[float, ...]  # weight bytes per stage
    stage_nw: tuple[int, ...]  # weights per stage
    peak_memory_bytes: float
    capacity_bytes: float
    fits: bool
    memory_headroom: float


@dataclass(frozen=True, slots=True)
class Stage:
    """What one stage's GPUs decide for a strategy (``Screen._stage``)."""

    gpus: tuple[int, ...]
    rid: int  # the id of its rows' key (``Screen._row_ids``): equal keys, equal ids
    rows: StageRows
    kind: str  # its first GPU's kind
    group: tuple[int, ...]  # one GPU of each replica (the first of its TP group): the sync's group
    sorted_group: tuple[int, ...]
    gather: Gathers | None  # its ZeRO-3 collectives (``Screen._gather``), if it has them


class StateForm(NamedTuple):
    """How a trainer holds the model state beyond distir's trainer-neutral program
    (``distir.parallel.trainers``; the screen's ``Screen._forms``): ``fp32_grads``, the
    gradients accumulate in fp32 (Megatron-LM's ``main_grad``, DeepSpeed's ``BF16_Optimizer``,
    FSDP's fp32 reduce-scatter output), twice a half gradient; ``no_half_shard``, no persistent
    low-precision copy of a ZeRO-3 shard (FSDP's ``gather_cast``: the fp32 shard is cast at each
    gather); ``root_kept``, the root's weights (embedding, final norm, head) and the last
    block's stay gathered from their forward to their backward (``fsdp2_root``);
    ``early_gather``, ZeRO-1/2's new half weights are gathered in the next step's first forward
    (``overlap_param_gather``), so this rank's half shard persists beside the whole copy;
    ``kept``, what ``torch.distributed.pipelining``'s stages keep per microbatch until the step's
    end (``distribute``'s ``pipelining_kept``: ``every`` stage's outputs or the ``last``'s,
    ``distir.parallel.pipeline.stage_state``)."""

    fp32_grads: bool = False
    no_half_shard: bool = False
    root_kept: bool = False
    early_gather: bool = False
    kept: str = ""


NEUTRAL_STATE = StateForm()  # distir's trainer-neutral program


class Gathers(NamedTuple):
    """A stage's ZeRO-3 collectives over its shard group (``Screen._gather``): (latency,
    seconds per byte) of an all-gather and of a reduce-scatter."""

    lat: float
    per_byte: float
    rs_lat: float
    rs_per_byte: float


class GatherForm(NamedTuple):
    """How a trainer runs ZeRO-3's collectives beyond distir's program (``Screen._forms``;
    ``distribute``'s FSDP switches): ``one_stream``, a layer's reduce-scatter runs on the
    gathers' stream, after the gather issued before it (``one_dp_stream``), in
    ``reduce_f`` times the half gradient's bytes (fp32: 2); ``cast``, each gather first casts
    the fp32 shard to the compute dtype on its stream (``gather_cast``); ``copy_out``, each
    gathered layer is copied into its parameters on the compute stream (``gather_copy_out``);
    ``copy_in``, each layer's gradients are cast into the fp32 reduce-scatter input on the
    compute stream (``grad_copy_in = "cast"``)."""

    one_stream: bool = False
    reduce_f: float = 1.0
    cast: bool = False
    copy_out: bool = False
    copy_in: bool = False


NEUTRAL_GATHERS = GatherForm()


class Reduction(NamedTuple):
    """How a trainer reduces the gradients of the last microbatch (``Screen._forms``):
    ``reduce_f`` times the half gradient's bytes (fp32 reductions: 2), ZeRO-1 by reduce-scatters
    to each rank's shard (``scatter``: Megatron-LM's DDP buckets) rather than an all-reduce;
    chunks after the first in one call after their last backward (``delayed``: Megatron-LM's
    ``delay_grad_reduce``, ``distribute``'s ``delayed_sync``), or the whole stage's after its
    last pass (``after_stage``: DeepSpeed's pipeline engine), or each chunk's after its last
    backward and before that backward's input gradient is sent on, so the drain waits for
    every chunk's reduction in turn (``before_send``: FSDP2's post-backward under
    ``torch.distributed.pipelining``, ``distribute``'s ``late_post_backward``) rather than in
    buckets during the last backwards; buckets of ``bucket_bytes``."""

    reduce_f: float = 1.0
    scatter: bool = False
    delayed: bool = False
    after_stage: bool = False
    before_send: bool = False
    # a bucket's cap in the compute dtype's bytes: DDP's ``bucket_cap_mb``, or Megatron-LM's
    # max(40M, 1M·d) parameters (``distribute``'s ``_bucket_bytes``)
    bucket_bytes: float = DDP_BUCKET_MB * float(1 << 20)


NEUTRAL_REDUCTION = Reduction()


@dataclass(slots=True)
class Tables:
    """Per strategy without its placement: what ``Screen.estimate`` reuses across placements.
    Filled by ``Screen``; every entry is a pure function of its key (and the strategy)."""

    b: int  # the per-replica microbatch; with batch shares, that of one share (``Screen._stage_rows``)
    stage_of: list[int]  # per chunk, its stage
    zero3: bool  # ZeRO-3 gathers weights in every microbatch
    static_f: float  # static memory per weight byte (weights, optimizer state)
    grad_f: float  # the accumulated gradient per weight byte, once a chunk's backward made it
    holds: tuple[tuple[Hold, ...], ...]  # per stage, what it holds at its peaks (``holds``)
    inflight: list[float]  # per stage (``inflight``)
    pending_w: list[float]  # per stage, deferred weight gradients at most (``pending_weight_grads``)
    identity: tuple[int, ...]  # the identity placement
    root_kept: bool = False  # ``StateForm.root_kept`` (ZeRO-3 on one stage)
    gathers: GatherForm = NEUTRAL_GATHERS  # how ZeRO-3's collectives run (``GatherForm``)
    reduction: Reduction = NEUTRAL_REDUCTION  # how the gradients are reduced (``Reduction``)
    kept: str = ""  # ``StateForm.kept`` (a training pipeline)
    stages: dict[tuple[int, ...], Stage] = field(default_factory=dict)  # by GPUs
    figures: dict[tuple[object, ...], Figures] = field(default_factory=dict)  # ``estimate``'s memo
    # per (stage rows, first stage rows, kind, gather): the stage's per-layer time (``TimeRow``)
    time: dict[tuple[object, ...], TimeRow] = field(default_factory=dict)
    # per (first stage rows, link): a cut's transfer per layer, array and list
    comm: dict[tuple[object, ...], tuple[np.ndarray, list[float]]] = field(default_factory=dict)
    # per first stage rows: the memory rows, the saved bytes, and (weights, counts, saved) as lists
    mem: dict[int, tuple[np.ndarray, np.ndarray, tuple[list[float], list[float], list[float]]]] = field(
        default_factory=dict
    )
    parts: dict[tuple[int, ...], tuple[int, ...] | str] = field(default_factory=dict)  # ``Screen._with``
    # per stages' rows (their ids, in stage order): their maxima and the first's rows as lists
    stacked: dict[tuple[int, ...], Stacked] = field(default_factory=dict)


class Stacked(NamedTuple):
    """What ``figures`` takes from the stages' rows alone (``_stacked``): per layer the largest
    working set over the stages (whole, the forward's, the backward's — plain or, ZeRO-3, with
    the weights dying — and the zero-bubble input-gradient pass's), and the first stage's
    ``out``, ``carried`` and ``largest`` rows, as lists."""

    work: np.ndarray
    fwd: list[float]
    bwd: dict[bool, list[float]]  # by whether the backward is split (zero-bubble)
    out: list[float]
    carried: list[float]
    largest: list[float]


def _stacked(tb: Tables, stages: list[Stage]) -> Stacked:
    """``Stacked`` of ``stages`` (``tb``'s memo: a pure function of their rows and ZeRO-3)."""
    key = tuple(st.rid for st in stages)
    got = tb.stacked.get(key)
    if got is None:
        first = stages[0].rows
        got = tb.stacked[key] = Stacked(
            frozen(np.max([st.rows.work for st in stages], axis=0)),
            np.max([st.rows.fwd_work for st in stages], axis=0).tolist(),
            {
                False: np.max(
                    [st.rows.zbwd_work if tb.zero3 else st.rows.bwd_work for st in stages], axis=0
                ).tolist(),
                True: np.max([st.rows.ibwd_work for st in stages], axis=0).tolist(),
            },
            first.out.tolist(),
            first.carried.tolist(),
            first.largest.tolist(),
        )
    return got


class TimeRow(NamedTuple):
    """A stage's per-microbatch time per layer (``_time_row``), as array and list; with ZeRO-3
    also what a chunk's ends add to it (``chunk_edges``): per layer its gather, and its forward
    and backward beside the neighbour's gather its row counts them overlapped with."""

    row: np.ndarray
    values: list[float]
    gather: list[float] | None = None  # a layer's all-gather (one call), None without ZeRO-3
    fwd_over: list[float] | None = None  # max(forward, next layer's gather) − forward
    bwd_over: list[float] | None = None  # max(backward, previous layer's gather) − backward


def chunk_edges(tr: TimeRow, a: int, b: int) -> float:
    """What a chunk of layers [a, b) adds to the sum of their ``TimeRow`` values: with ZeRO-3,
    each pass's first gather, which nothing before it in the chunk hides (the forward's of layer
    a, the backward's of layer b − 1), less the overlap its row gave the chunk's last layer's
    forward with a gather past the chunk (layer b's) and the first layer's backward with layer
    a − 1's (``_Gathers`` in ``distribute``: a chunk gathers only its own layers); 0 without."""
    if tr.gather is None or tr.fwd_over is None or tr.bwd_over is None or b <= a:
        return 0.0
    return tr.gather[a] + tr.gather[b - 1] - tr.fwd_over[b - 1] - tr.bwd_over[a]


def new_tables(
    s: Strategy,
    b: int,
    train: bool,
    n_state: int,
    mixed: bool = False,
    form: StateForm = NEUTRAL_STATE,
    gathers: GatherForm = NEUTRAL_GATHERS,
    reduction: Reduction = NEUTRAL_REDUCTION,
) -> Tables:
    """Empty tables for ``s`` (without its placement) at microbatch ``b``; ``n_state``: optimizer
    state tensors per weight; ``mixed``: fp32 masters and state beside the compute-dtype weights
    (whose bytes the profiles count), as ``distribute(precision="mixed")`` holds them; ``form``:
    how the trainer holds them otherwise (``StateForm``); ``gathers``: how its ZeRO-3
    collectives run (``GatherForm``); ``reduction``: how it reduces the gradients
    (``Reduction``)."""
    # memory per device: static (weights, state) + what the schedule holds (activations in
    # flight, carried values, gradients) + transient; the ZeRO paper's model state, as
    # ``distribute`` holds it: the gradient accumulates in place (ZeRO-2/3: this replica's
    # shard, reduce-scattered in buckets during every backward) from a chunk's first backward
    # on, and the optimizer updates weights and state in place
    h = s.zero_degree  # HSDP shards over its group, replicates across groups
    zero3 = train and s.zero == 3 and s.d * s.c > 1
    # FSDP's gather_cast keeps no low-precision shard: the fp32 master is cast at each gather
    static_f = 0.0 if zero3 and mixed and form.no_half_shard else 1.0 / h if s.zero == 3 else 1.0
    if train and mixed and form.early_gather and s.zero in (1, 2) and s.d * s.c > 1:
        static_f += 1.0 / h
    grad_f = 0.0
    if train:
        # ZeRO-2 under a pipeline accumulates whole gradients, reduce-scattered in the last
        # backward (``reduce_scatter_every_backward``): only one microbatch leaves no sum whole
        grad_f = 1.0 / h if s.zero >= 2 and (s.k == 1 or reduce_scatter_every_backward(s)) else 1.0
        grad_f *= 2.0 if mixed and form.fp32_grads else 1.0
        # mixed: the fp32 master (sharded from ZeRO-1 on) and state, each twice a half weight
        state = 2.0 * (1 + n_state) if mixed else float(n_state)
        static_f += state / (h if s.zero >= 1 else 1)
    tl = timeline(s.schedule, s.p, s.k, s.v, train)
    return Tables(
        b=b,
        stage_of=[c % s.p for c in range(s.p * s.v)],
        zero3=zero3,
        static_f=static_f,
        grad_f=grad_f,
        holds=tl.holds,
        inflight=list(tl.inflight),
        pending_w=list(tl.pending_w),
        identity=tuple(range(s.devices)),
        root_kept=zero3 and s.p == 1 and form.root_kept,
        kept=form.kept if train and s.p > 1 else "",
        gathers=gathers if zero3 else NEUTRAL_GATHERS,
        reduction=reduction,
    )


class Timeline(NamedTuple):
    """Per stage of a schedule, what its action list holds (``holds``; ``inflight``,
    ``pending_weight_grads``): shared by every strategy with the same schedule, p, k and v."""

    holds: tuple[tuple[Hold, ...], ...]
    inflight: tuple[float, ...]
    pending_w: tuple[float, ...]


@functools.lru_cache(maxsize=4096)
def timeline(schedule: str, p: int, k: int, v: int, train: bool) -> Timeline:
    """The ``Timeline`` of the schedule; inference holds one microbatch's forward per chunk."""
    if not train:
        return Timeline(((Hold((1,) * v, (0,) * v, (0,) * v, "F"),),) * p, (1.0,) * p, (0.0,) * p)
    hs = holds(schedule, p, k, v)
    return Timeline(
        hs,
        tuple(float(max(sum(hd.fwd) for hd in h)) for h in hs),
        tuple(float(max(sum(hd.wgrad) for hd in h)) for h in hs),
    )


@dataclass(frozen=True, slots=True)
class _WholeEnds:
    """The layer assignment with the model's ends (``Ends``) kept whole: the embedding's calls
    as one unit that the first chunk takes, head and loss as one that the last takes; the
    solver sees one column per unit (times and memory summed, cuts inside a unit dropped)."""

    ends: Ends
    n_layers: int

    def units(self) -> list[int]:
        """The first layer call of each unit."""
        pre, post, n = self.ends.pre, self.ends.post, self.n_layers
        return [*([0] if pre else []), *range(pre, n - post), *([n - post] if post else [])]

    def assign(
        self,
        assign: Assign,
        time_c: np.ndarray,
        k: int,
        comm: np.ndarray | None,
        mem: np.ndarray | None,
        cap: np.ndarray | None,
    ) -> tuple[int, ...] | None:
        """Layer calls per chunk of the optimal assignment of the units, None if none fits."""
        starts = self.units()
        if len(starts) == self.n_layers:
            got = assign(time_c, k, comm, mem, cap)
            return None if got is None else got.counts
        cuts = [b - 1 for b in starts[1:]]  # the cut after each unit but the last
        got = assign(
            np.add.reduceat(time_c, starts, axis=1),
            k,
            None if comm is None else np.ascontiguousarray(comm[:, cuts]),
            None if mem is None else np.add.reduceat(mem, starts, axis=1),
            cap,
        )
        if got is None:
            return None
        ends_at = [*starts[1:], self.n_layers]
        bounds = [0, *(ends_at[u - 1] for u in itertools.accumulate(got.counts))]
        return tuple(b - a for a, b in itertools.pairwise(bounds))


def figures(
    s: Strategy,
    tb: Tables,
    stages: list[Stage],
    links: tuple[tuple[float, float] | None, ...],
    zero3: tuple[Gathers | None, ...],
    balance: bool,
    *,
    train: bool,
    specs: Mapping[str, DeviceSpec],
    stalls: Mapping[str, float],
    assign: Assign,
    ends: Ends,
    bucket_memo: dict[tuple[object, ...], tuple[tuple[float, float], ...]],
) -> Figures:
    """``Screen.estimate``'s figures up to the gradient sync for ``s`` (its tables ``tb``), from
    what the placement decides: per stage ``stages``, per cut between chunks its link (None
    within one stage), per stage its ZeRO-3 gather (``()`` without ZeRO-3); with ``balance``
    (and no pinned partition) the layers are assigned by ``assign``, the model's ``ends``
    (embedding; head and loss) kept with the first and the last chunk. Per-stage arrays come
    from ``tb`` (module docstring); ``Figures.counts`` are layer calls per chunk; the chunks'
    gradient buckets are memoized in ``bucket_memo`` (``_chunk_buckets``)."""
    first = stages[0]
    lt = [
        _time_row(s, tb, st, first, z, train, specs, stalls) for st, z in itertools.zip_longest(stages, zero3)
    ]
    comm, comm_rows = _comm_rows(tb, first, links, train)
    mem, saved, lists = _mem_of(s, tb, first, train)
    caps = np.array([st.rows.cap for st in stages], float)
    work = _stacked(tb, stages).work
    # the largest working set (ZeRO-3: with the largest gathered layer) bounds what layers may hold
    transient = work.max() + (float(first.rows.weight.max()) if tb.zero3 else 0.0)
    time_c = np.array([lt[c].row for c in tb.stage_of])
    counts = _layer_counts(s, time_c, comm, mem, caps - transient, balance, assign, ends)
    bounds = [0, *itertools.accumulate(counts)]
    t_stage, c_cut, t_chunk = _stage_times(s, tb, lt, comm_rows, bounds)
    passes = chunk_passes(s, stages, tb.stage_of, t_chunk, bounds)
    times = pipeline_time(s, t_stage, passes, c_cut, train, tb.reduction.delayed)
    peaks, stage_w, stage_nw = _stage_peaks(s, tb, stages, saved, lists, bounds)
    if tb.root_kept:  # one stage: the root's and the last block's weights, gathered whole
        w = lists[0]
        peaks[0] += seq_sum([*w[: ends.pre], *w[len(w) - ends.post - 1 :]])
    if tb.kept:  # the passes' peak beside what is kept, or the step's end with the merge
        for j, (kept, merge) in enumerate(pipelining_kept(s, tb.kept, _stacked(tb, stages).out, bounds)):
            peaks[j] = max(peaks[j] + kept, (tb.static_f + tb.grad_f) * stage_w[j] + kept + merge)
    cap_list = caps.tolist()
    headroom = [c - p for c, p in zip(cap_list, peaks, strict=True)]
    worst = headroom.index(min(headroom))  # np.argmin: the first least
    return Figures(
        counts=tuple(counts),
        pipe_s=max(times.stage_end),
        stage_end_s=tuple(times.stage_end),
        grad_pass_s=tuple(times.grad_pass),
        delayed_s=tuple(times.delayed),
        chunk_w=tuple([float(first.rows.weight[a:b].sum()) for a, b in itertools.pairwise(bounds)]),
        chunk_nw=tuple([int(first.rows.n_w[a:b].sum()) for a, b in itertools.pairwise(bounds)]),
        buckets=_chunk_buckets(s, tb, stages, bounds, bucket_memo) if train else (),
        compute_s=s.k * max(t_stage),
        mean_busy_s=s.k * sum(t_stage) / s.p,
        stage_w=tuple(stage_w),
        stage_nw=tuple(stage_nw),
        peak_memory_bytes=max(peaks),
        capacity_bytes=cap_list[worst] if peaks[worst] > cap_list[worst] else min(cap_list),
        fits=min(headroom) >= 0,
        memory_headroom=min(headroom),
    )


def pipelining_kept(
    s: Strategy, mode: str, out: Sequence[float], bounds: Sequence[int]
) -> list[tuple[float, float]]:
    """Per stage, what ``torch.distributed.pipelining`` keeps of the step's k microbatches by its
    end (``StateForm.kept``; ``distir.parallel.pipeline.stage_state``) and the merge of the last
    chunk's outputs at the end (the step's ``torch.cat``), from ``out`` (per layer call, the
    activation it hands on, per microbatch) and the chunks' layer ``bounds``: each chunk but the
    first its received activations and their gradients, each chunk but the last its received
    gradients, the last chunk its outputs (the logits the loss takes: the layer before the loss)
    and, with ``every``, each other chunk its outputs too. The receive buffers are held from the
    step's start, the rest grows to it: all of it is counted beside the passes' peak, a bound."""
    chunks = len(bounds) - 1
    kept = [0.0] * s.p
    merge = [0.0] * s.p
    for c in range(chunks):
        a, b = bounds[c], bounds[c + 1]
        last = c == chunks - 1
        x = 2.0 * out[a - 1] if c > 0 else 0.0  # received activations and their gradients
        x += 0.0 if last else out[b - 1]  # received gradients
        if last and b - 2 >= a:
            x += out[b - 2]  # the logits
            merge[c % s.p] += s.k * out[b - 2]
        elif mode == "every" and not last:
            x += out[b - 1]
        kept[c % s.p] += s.k * x
    return list(zip(kept, merge, strict=True))


def _comm_rows(
    tb: Tables, first: Stage, links: tuple[tuple[float, float] | None, ...], train: bool
) -> tuple[np.ndarray, list[list[float] | None]]:
    """Per cut between chunks, its transfer after each layer (``_comm_row``): the (chunks − 1,
    L − 1) matrix (zeros within one stage) and the rows as lists (None within one stage)."""
    n_layers = first.rows.time.size
    comm = np.zeros((max(len(tb.stage_of) - 1, 0), max(n_layers - 1, 0)))
    comm_rows: list[list[float] | None] = []
    for c, link in enumerate(links):
        if link is None:
            comm_rows.append(None)
        else:
            row, row_list = _comm_row(tb, first, link, train)
            comm[c] = row
            comm_rows.append(row_list)
    return comm, comm_rows


def _layer_counts(
    s: Strategy,
    time_c: np.ndarray,
    comm: np.ndarray,
    mem: np.ndarray,
    room: np.ndarray,
    balance: bool,
    assign: Assign,
    ends: Ends,
) -> tuple[int, ...]:
    """Layer calls per chunk: the pinned partition; with ``balance`` (one chunk per stage, p > 1)
    the optimal assignment of ``time_c`` (per chunk and layer) over the cuts ``comm``, each
    stage's ``mem`` within its ``room`` (if none fits, time alone), the uniform split where it is
    as fast and fits; else the uniform split."""
    chunks = time_c.shape[0]
    n_blocks = time_c.shape[1] - ends.pre - ends.post
    if isinstance(s.partition, tuple):
        return call_counts(s.partition, ends)
    uni = call_counts(uniform_counts(n_blocks, chunks), ends)
    if not (balance and s.v == 1 and s.p > 1):
        return uni
    whole = _WholeEnds(ends, time_c.shape[1])
    cm = comm if chunks > 1 else None
    got = whole.assign(assign, time_c, s.k, cm, mem, room)
    if got is None:  # nothing fits: balance time alone, report the memory honestly
        got = whole.assign(assign, time_c, s.k, cm, None, None)
    assert got is not None
    # equal time: keep the uniform split (the simpler strategy string)
    if got != uni and objective_unchecked(uni, time_c, s.k, comm) <= objective_unchecked(
        got, time_c, s.k, comm
    ) * (1 + 1e-6):
        cut = np.concatenate([[0], np.cumsum(uni)])
        if all(mem[j, cut[j] : cut[j + 1]].sum() <= room[j] for j in range(s.p)):
            return uni
    return got


def _stage_times(
    s: Strategy,
    tb: Tables,
    lt: list[TimeRow],
    comm_rows: list[list[float] | None],
    bounds: list[int],
) -> tuple[list[float], list[float], list[float]]:
    """Per stage its per-microbatch time (its chunks' layers on its row of ``lt``), per cut
    between chunks its transfer, and per chunk its time, for the chunks' layer ``bounds``."""
    stage_of = tb.stage_of
    chunks = len(stage_of)
    t_chunk: list[float] = []
    for c in range(chunks):
        a, b = bounds[c], bounds[c + 1]
        tr = lt[stage_of[c]]
        t = seq_sum(tr.values[a:b]) if b - a < 8 else float(tr.row[a:b].sum())
        t_chunk.append(t if tr.gather is None else t + chunk_edges(tr, a, b))
    c_cut: list[float] = []
    for c in range(chunks - 1):
        cr = comm_rows[c]
        c_cut.append(0.0 if cr is None else cr[bounds[c + 1] - 1])
    t_stage = [sum(t_chunk[c] for c in range(chunks) if stage_of[c] == j) for j in range(s.p)]
    return t_stage, c_cut, t_chunk


def _stage_peaks(
    s: Strategy,
    tb: Tables,
    stages: list[Stage],
    saved: np.ndarray,
    lists: tuple[list[float], list[float], list[float]],
    bounds: list[int],
) -> tuple[list[float], list[float], list[int]]:
    """Per stage its peak memory, its weight bytes and its weight count, for the chunks' layer
    ``bounds`` (``saved`` and ``lists``: ``_mem_of``'s)."""
    first = stages[0]
    chunks = len(tb.stage_of)
    w_list, nw_list, saved_list = lists
    w_bytes, n_w = first.rows.weight, first.rows.n_w
    # the backward's working set per layer; zero-bubble (split): the input-gradient pass's
    fwd_list, bwd_lists, out_list, carried_list, largest_list = _stacked(tb, stages)[1:]
    peaks: list[float] = []
    stage_w: list[float] = []
    stage_nw: list[int] = []
    for j in range(s.p):
        # the stage's chunks in order (chunk c is the (c // p)-th of stage c mod p), their layers
        own = [range(bounds[c], bounds[c + 1]) for c in range(j, chunks, s.p)]
        layers = [i for r in own for i in r]
        if len(layers) < 8:
            wj = seq_sum([w_list[i] for i in layers])
            nwj = int(seq_sum([nw_list[i] for i in layers]))  # exact: ints below 2**53
            sv = seq_sum([saved_list[i] for i in layers])
        else:
            wj = float(w_bytes[layers].sum())
            nwj = int(n_w[layers].sum())
            sv = float(saved[layers].sum())
        # the worst moment of the stage's action list (``holds``): microbatches between F and B
        # (or I) hold their chunk's saved activations, those between I and W what I carries to
        # W, and a chunk's accumulated gradient exists from its first backward on; each pass
        # adds its working set (a backward: ``_backward``; a weight-gradient pass: its layer's
        # gradients, and once accumulators exist the sum of a gradient and its accumulator,
        # beside both: the program's Add is not in place)
        wk = Work(
            max([0.0, *[fwd_list[i] for i in layers]]),
            max([0.0, *[w_list[i] for i in layers]]),
            tb.grad_f * max([0.0, *[largest_list[i] for i in layers]]),
        )
        split = bool(tb.pending_w[j])
        carried = first.rows.carried if split else None
        per = _Lists(
            saved_list, w_list, out_list, bwd_lists[split], carried_list if split else None, largest_list
        )
        bt = [_backward(r, per, tb.grad_f) for r in own]
        if s.v == 1:
            cv = [0.0 if carried is None else float(carried[layers].sum())]
            act = _held(tb.holds[j], [sv], cv, [tb.grad_f * wj], bt, wk)
        else:
            svs = [seq_sum([saved_list[i] for i in r]) for r in own]
            cvs = [0.0 if carried is None else float(carried[list(r)].sum()) for r in own]
            gws = [tb.grad_f * seq_sum([w_list[i] for i in r]) for r in own]
            act = _held(tb.holds[j], svs, cvs, gws, bt, wk)
        # max([0.0, ...]): the exact maximum of 0.0 and the values; ZeRO-3 holds the running
        # layer's gathered weights beside its working set (whose weight gradient is whole until
        # reduce-scattered), and those of the chunk's next layer, gathered one layer ahead
        gathered = 0.0
        if tb.zero3:
            gathered = max(
                [0.0, *[w_list[i] + (w_list[i + 1] if i + 1 < r.stop else 0.0) for r in own for i in r]]
            )
        peaks.append(tb.static_f * wj + act + gathered)
        stage_w.append(wj)
        stage_nw.append(nwj)
    return peaks, stage_w, stage_nw


class _Lists(NamedTuple):
    """Per layer (lists of the stage rows): what ``_backward`` reads."""

    saved: list[float]
    weight: list[float]
    out: list[float]
    bwd_work: list[float]  # zero-bubble: the input-gradient pass's
    carried: list[float] | None  # zero-bubble: what each input-gradient pass carries to W
    largest: list[float]


def _backward(r: range, x: _Lists, grad_f: float) -> tuple[float, float]:
    """What a microbatch's backward of the chunk of layers ``r`` adds at its worst moment to
    what the stage holds before it (its saved activations counted there): (the chunk's first
    backward, a later one). The layers run last to first, as the program inlines them: layer
    i's backward runs beside the gradient reaching it (``out``) with its working set
    (``bwd_work``: above what is live when it starts, its own input, residuals and incoming
    gradient freed as they die), the layers after it having freed their saved activations —
    in a zero-bubble schedule's input-gradient pass, kept what each carries to its
    weight-gradient pass — and, in the first backward, left their weight gradients (later ones
    add them into the accumulators: once its backward returned, the Add of its largest weight's
    gradient makes their sum beside both, the gradient passed on beside them). Sums run from the
    chunk's last layer (as ``np.cumsum`` of the reversed rows)."""
    gone = made = 0.0  # saved bytes freed, weight gradients left by the layers after i
    first = later = 0.0
    for i in reversed(r):
        base = x.out[i] + x.bwd_work[i] - gone
        later = max(later, base)
        first = max(first, base + made)
        gone += x.saved[i] if x.carried is None else x.saved[i] - x.carried[i]
        if x.carried is None:
            made += grad_f * x.weight[i]
            dx = x.out[i - 1] if i > 0 else 0.0
            later = max(later, dx + grad_f * x.weight[i] + grad_f * x.largest[i] - gone)
    return first, later


def _time_row(
    s: Strategy,
    tb: Tables,
    st: Stage,
    first: Stage,
    gather: Gathers | None,
    train: bool,
    specs: Mapping[str, DeviceSpec],
    stalls: Mapping[str, float],
) -> TimeRow:
    """Stage ``st``'s per-microbatch time per layer: its rows' time, with the ZeRO-3 gathers
    (``gather``) overlapped as ``distribute`` prefetches them, plus the gradient accumulation of
    the weights of the first stage's rows; memoized in ``tb``.

    ZeRO-3 gathers every weight before its forward and its backward, in every microbatch, a
    layer's weights in one collective call (coalesced parts), on the stage's gather stream one
    layer ahead (``distribute._Gathers``, FSDP's forward and backward prefetch): the next
    layer's gather is issued as a layer starts, so a pass over layers with compute c_i and
    gathers g_i takes g_first + Σ max(c_i + s·g_next(i), g_next(i)) + c_last, where a layer
    beside a gather runs s of the gather's time longer (s: the SMs the gather holds, ``stalls``
    by GPU kind, as the simulator charges it, ``distir.sim.interference.share``). Per layer the row
    holds max(f_i + s·g_{i+1}, g_{i+1}) + max(b_i + s·g_{i−1}, g_{i−1}) (the backward runs the
    layers last to first); a chunk's ends add ``chunk_edges``. A trainer's ``GatherForm`` adds
    (``_fsdp_terms``) its casts and copies, and on one stream the reduce-scatters behind the
    gathers."""
    key = (st.rid, first.rid, st.kind, gather)
    got = tb.time.get(key)
    if got is None:
        row = np.array(st.rows.time)  # a fresh array: the terms below add into it
        w_bytes, n_w = first.rows.weight, first.rows.n_w
        edges: tuple[list[float], list[float], list[float]] | None = None
        if gather is not None:
            spec = specs[st.kind]
            g = w_bytes * gather.per_byte + (n_w > 0) * gather.lat  # a layer's gathers: one call
            if tb.gathers.cast:  # the fp32 shard cast (read 4, write 2 bytes a parameter)
                g = g + 3.0 * w_bytes / s.zero_degree / (0.8 * spec.memory_bandwidth)
            f = st.rows.fwd
            # the backward's gathers overlap the pass that reads the weights: a zero-bubble
            # schedule's input-gradient pass (``distribute``: its weight pass gathers nothing)
            bwd = st.rows.ibwd if s.schedule == "zb1" else st.rows.time - f
            g_next = np.append(g[1:], 0.0)
            g_prev = np.insert(g[:-1], 0, 0.0)
            stall = stalls[st.kind]  # the SMs a gather holds beside the compute
            fwd_over = np.maximum(f + stall * g_next, g_next) - f
            bwd_over = np.maximum(bwd + stall * g_prev, g_prev) - bwd
            row += (
                fwd_over + bwd_over + _fsdp_terms(tb.gathers, gather, w_bytes, n_w, bwd, g_prev, stall, spec)
            )
            edges = (g.tolist(), fwd_over.tolist(), bwd_over.tolist())
        # gradient accumulation: microbatches after the first add into the accumulators (ZeRO-2/3
        # reducing in every backward: into this replica's shard, ``grad_f`` of the weights)
        if train and s.k > 1:
            spec = specs[st.kind]
            per = 3 * tb.grad_f * w_bytes / (0.8 * spec.memory_bandwidth) + n_w * spec.launch_overhead_s
            row += (s.k - 1) / s.k * per
        row.flags.writeable = False
        got = tb.time[key] = TimeRow(row, row.tolist(), *(edges or ()))
    return got


def _fsdp_terms(
    form: GatherForm,
    gather: Gathers,
    w_bytes: np.ndarray,
    n_w: np.ndarray,
    bwd: np.ndarray,
    g_prev: np.ndarray,
    stall: float,
    spec: DeviceSpec,
) -> np.ndarray | float:
    """What a trainer's ZeRO-3 (``GatherForm``) adds to each layer's per-microbatch time beyond
    ``_time_row``'s gathers: on the compute stream the copy-out of each pass's gathered weights
    (read and write) and the cast of the gradients into the fp32 reduce-scatter input (read 2,
    write 4 bytes a parameter); on one stream, the reduce-scatter of the layer after it (whose
    backward just ended) queued behind the gather of the layer before, the backward overlapping
    both (beyond what it overlaps the gather alone), and the first layer's own reduce-scatter
    after the backward, which nothing hides."""
    if form == NEUTRAL_GATHERS:
        return 0.0
    bw = 0.8 * spec.memory_bandwidth
    out: np.ndarray = np.zeros_like(w_bytes)
    if form.copy_out:
        out = out + 2 * (2.0 * w_bytes / bw + (n_w > 0) * spec.launch_overhead_s)
    if form.copy_in:
        out = out + 3.0 * w_bytes / bw + (n_w > 0) * spec.launch_overhead_s
    if form.one_stream:
        r = form.reduce_f * w_bytes * gather.rs_per_byte + (n_w > 0) * gather.rs_lat
        both = g_prev + np.append(r[1:], 0.0)
        out = out + (np.maximum(bwd + stall * both, both) - np.maximum(bwd + stall * g_prev, g_prev))
        out[0] += r[0]
    return out


def _comm_row(
    tb: Tables, first: Stage, link: tuple[float, float], train: bool
) -> tuple[np.ndarray, list[float]]:
    """A transfer over ``link`` after each layer but the last, as array and list: forward
    activation (of the first stage's rows) and, training, its gradient back; memoized."""
    key = (first.rid, link)
    got = tb.comm.get(key)
    if got is None:
        lat, per_byte = link
        trips = 2.0 if train else 1.0
        row = trips * (lat + first.rows.out[:-1] * per_byte)
        row.flags.writeable = False
        got = tb.comm[key] = (row, row.tolist())
    return got


def _mem_of(
    s: Strategy, tb: Tables, first: Stage, train: bool
) -> tuple[np.ndarray, np.ndarray, tuple[list[float], list[float], list[float]]]:
    """Per stage, its memory per layer (static and activations in flight, of the first stage's
    rows); the saved bytes per layer; and weight bytes, weight counts and saved bytes as
    lists. Memoized in ``tb``."""
    got = tb.mem.get(first.rid)
    if got is None:
        w_bytes = first.rows.weight
        saved = first.rows.saved * (1.0 if train else 0.0)
        carried = first.rows.carried * (1.0 if train else 0.0)
        # a bound of the peak: every term at its own worst moment (the layer assignment needs
        # memory linear in the layers)
        f = tb.static_f + tb.grad_f
        mem = np.array([f * w_bytes + tb.inflight[j] * saved + tb.pending_w[j] * carried for j in range(s.p)])
        mem.flags.writeable = False
        saved.flags.writeable = False
        got = tb.mem[first.rid] = (
            mem,
            saved,
            (w_bytes.tolist(), first.rows.n_w.tolist(), saved.tolist()),
        )
    return got


class Hold(NamedTuple):
    """What a stage holds at a moment of its action list, per chunk of the stage (in order), and
    the pass that runs then: ``F`` right after a forward (its working set still held), ``B``
    right before a backward or input-gradient pass, ``W`` before a weight-gradient pass, ``O``
    after the last pass (the optimizer)."""

    fwd: tuple[int, ...]  # microbatches between their forward and their (input-)gradient pass
    wgrad: tuple[int, ...]  # microbatches between the input- and the weight-gradient pass
    grads: tuple[int, ...]  # 1 where the chunk's accumulated gradient exists (a backward done)
    phase: str
    run: int = -1  # the chunk (of the stage's, in order) whose pass runs; -1 after the last


class Work(NamedTuple):
    """A stage's working sets (its largest layer's) by pass: ``Hold.phase``; a backward's is
    the running chunk's (``_backward``)."""

    fwd: float
    wgrad: float  # a weight-gradient pass: its layer's weight gradients
    add: float  # the accumulation's sum beside the gradient and the accumulator


def _held(
    hs: tuple[Hold, ...],
    sv: list[float],
    cv: list[float],
    gw: list[float],
    bt: list[tuple[float, float]],
    work: Work,
) -> float:
    """What a stage holds at its worst moment among ``hs`` (``holds``), from per chunk its saved
    (``sv``) and carried (``cv``) bytes per microbatch, its gradient bytes (``gw``) and what its
    backward adds (``bt``: ``_backward``), with the working set of the pass then running
    (``work``)."""
    best = 0.0
    if len(sv) == 1:  # one chunk: each sum of one product is 0.0 + the product, as ``seq_sum``
        (s0,), (c0,), (g0,) = sv, cv, gw
        for h in hs:
            x = 0.0 + h.fwd[0] * s0
            x += 0.0 + h.wgrad[0] * c0
            x += 0.0 + h.grads[0] * g0
            x += _pass(h, bt, work)
            if x > best:
                best = x
        return best
    for h in hs:
        x = seq_sum([a * b for a, b in zip(h.fwd, sv, strict=True)])
        x += seq_sum([a * b for a, b in zip(h.wgrad, cv, strict=True)])
        x += seq_sum([a * b for a, b in zip(h.grads, gw, strict=True)])
        x += _pass(h, bt, work)
        best = max(best, x)
    return best


def _pass(h: Hold, bt: list[tuple[float, float]], work: Work) -> float:
    """What the pass running at ``h`` adds: the forward's working set; a backward's (``bt`` of
    the running chunk: its first backward, or a later one, beside its accumulators); a
    weight-gradient pass's gradients."""
    if h.phase == "F":
        return work.fwd
    if h.phase == "O":
        return 0.0
    if h.phase == "B":
        first, later = bt[h.run]
        return later if h.grads[h.run] else first
    return work.wgrad + work.add if h.grads[h.run] else work.wgrad


@functools.lru_cache(maxsize=4096)
def holds(schedule: str, p: int, k: int, v: int) -> tuple[tuple[Hold, ...], ...]:
    """Per stage of the training schedule, the states its action list passes through (after
    each action; ``Hold``) that no other dominates (each count at least as large), in order:
    what ``distribute``'s program holds at each moment — the saved activations of a microbatch
    from its forward to its backward (zero-bubble: to its input-gradient pass, then what that
    carries until the weight-gradient pass), and a chunk's gradient accumulator from its first
    backward (weight-gradient pass) on.

    From the action counts, without building the action lists: closed forms for one chunk per
    stage (GPipe, 1F1B, ZB-H1: ``_states_v1``), one period of the steady phase for the
    interleaved schedule (``_states_interleaved``); on arguments a schedule refuses (which it
    reports), from the action lists (``holds_of_actions``): the same states (a test checks)."""
    canon = canonical_name(schedule) if schedule in SCHEDULE_NAMES else schedule
    if v == 1 and canon == "interleaved":  # one chunk per stage: plain 1F1B
        canon = "1f1b"
    if type(p) is not int or type(k) is not int or type(v) is not int or min(p, k, v) < 1:
        return holds_of_actions(schedule, p, k, v)
    if v == 1 and canon in _ONE_CHUNK:
        return tuple(_assembled(_states_v1(canon, p, k, r), 1) for r in range(p))
    if canon == "interleaved" and v > 1 and k % p == 0:
        return tuple(_assembled(_states_interleaved(p, k, v, r), v) for r in range(p))
    return holds_of_actions(schedule, p, k, v)


def _assembled(seen: dict[tuple[str, int], set[tuple[int, ...]]], v: int) -> tuple[Hold, ...]:
    """A stage's ``Hold``s from the states met per (pass, chunk running it): the undominated
    ones of each, passes in the order F, B, W, O, then by chunk."""
    states: list[Hold] = []
    for (phase, c), xs in sorted(seen.items(), key=lambda kv: ("FBWO".index(kv[0][0]), kv[0][1])):
        states += [Hold(x[:v], x[v : 2 * v], x[2 * v :], phase, c) for x in _undominated(xs)]
    return tuple(states)


def holds_of_actions(schedule: str, p: int, k: int, v: int) -> tuple[tuple[Hold, ...], ...]:
    """``holds`` from the schedule's action lists (``build_schedule``): each action's state
    followed, the states met kept per (pass, chunk running it)."""
    out = []
    for actions in build_schedule(schedule, p, k, v):
        fi, iw, made = [0] * v, [0] * v, [0] * v
        # per (pass, chunk running it) the states met
        seen: dict[tuple[str, int], set[tuple[int, ...]]] = {}
        for a in actions:
            c = a.stage // p
            if a.kind != "F":  # before a backward pass
                seen.setdefault(("W" if a.kind == "W" else "B", c), set()).add((*fi, *iw, *made))
            fi[c] += 1 if a.kind == "F" else -1 if a.kind in "BI" else 0
            iw[c] += 1 if a.kind == "I" else -1 if a.kind == "W" else 0
            if a.kind in "BW":
                made[c] = 1
            if a.kind == "F":  # after a forward
                seen.setdefault(("F", c), set()).add((*fi, *iw, *made))
        seen[("O", -1)] = {(*fi, *iw, *made)}
        out.append(_assembled(seen, v))
    return tuple(out)


_ONE_CHUNK = frozenset({"gpipe", "1f1b", "zb1"})


def _states_v1(schedule: str, p: int, k: int, r: int) -> dict[tuple[str, int], set[tuple[int, ...]]]:
    """Stage ``r``'s states (forward count − backward count, input- minus weight-gradient
    passes, whether a gradient was made) per pass, in ``holds``' order, from the counts of the
    action list (``schedules``): ``w`` warm-up forwards (GPipe: all k), then forward w + n and
    the n-th backward alternate. ZB-H1's backward is its input-gradient pass I, after the n-th of
    which the oldest pending weight-gradient pass W runs once n > r (min(n, r) then pending,
    n − r W's done), the min(k, r) left running at the end; 1F1B and GPipe are that with r = 0
    (a backward makes its gradient at once). Before the n-th backward (1-based) min(w + n, k)
    forwards and n − 1 backwards are done; after forward f, q = max(0, f − w − 1) backwards.
    Only counts where a state may change or is not dominated are visited: past its last
    change a state repeats; a warm-up forward's is dominated by the next's, and so is a
    cool-down backward's past n = rr + 2, and a final W's past the second."""
    w = k if schedule == "gpipe" else min(p - 1 - r, k)
    rr = r if schedule == "zb1" else 0
    # forwards: (f, 0, 0) through the warm-up, then from f = w + rr + 2 on (w + 1, rr, 1)
    fs = range(min(w + 1, k), min(k, w + rr + 2) + 1)
    fwd: set[tuple[int, ...]] = {
        (f - q, min(q, rr), int(q >= rr + 1)) for f in fs for q in (max(0, f - w - 1),)
    }
    # backwards: the state changes up to n = rr + 2; in the cool-down (n > k − w) only its
    # forward count falls, from n = rr + 2 on
    c0 = max(1, k - w + 1)
    ns = {*range(1, min(k, rr + 2) + 1), *range(c0, min(k, max(c0, rr + 2)) + 1)}
    bwd: set[tuple[int, ...]] = {(min(w + n, k) - n + 1, min(n - 1, rr), int(n >= rr + 2)) for n in ns}
    if schedule != "zb1":
        return {("F", 0): fwd, ("B", 0): bwd, ("O", -1): {(0, 0, 1)}}
    c1 = max(r + 1, k - w + 1)
    ws = {*range(r + 1, min(k, r + 2) + 1), *range(c1, min(k, max(c1, r + 2)) + 1)}
    wgt: set[tuple[int, ...]] = {(min(w + n, k) - n, r + 1, int(n >= r + 2)) for n in ws}
    left = min(k, r)
    wgt |= {(0, left - t, int(k >= r + 1 or t >= 1)) for t in range(min(left, 2))}
    return {("F", 0): fwd, ("B", 0): bwd, ("W", 0): wgt, ("O", -1): {(0, 0, 1)}}


def _states_interleaved(p: int, k: int, v: int, r: int) -> dict[tuple[str, int], set[tuple[int, ...]]]:
    """Stage ``r``'s states of the interleaved schedule (v > 1, p dividing k) per (pass, chunk
    running it), from the counts (``interleaved_1f1b``): of its k·v virtual microbatches, ``w``
    warm-up forwards, then forward w + m and backward m alternate, then the rest backwards; the
    n first forwards hold chunk c's (``_done``) n // g·p + its share of n mod g (g = p·v), the
    backwards the chunks reversed. After n forwards and m backwards chunk c holds F_c(n) − B_c(m)
    and has a gradient once B_c(m) > 0; the states are met after each forward and before each
    backward. From m = g on they repeat with period g (the counts grow by p per period, every
    chunk has a gradient): the steady phase is visited up to m < 2g only; and a warm-up
    forward's state only grows until its chunk's next forward."""
    total, g = k * v, p * v
    w = min(total, 2 * (p - r - 1) + (v - 1) * p)
    steady = total - w

    def state(n: int, m: int) -> tuple[int, ...]:
        b = [_done(m, v - 1 - c, p, g) for c in range(v)]
        return (*[_done(n, c, p, g) - b[c] for c in range(v)], *[0] * v, *[int(x > 0) for x in b])

    seen: dict[tuple[str, int], set[tuple[int, ...]]] = {}
    for i in range(w):  # warm-up: after forward i, dominated by the next of its chunk's
        if (i + 1 if (i + 1) % p else i + 1 + (v - 1) * p) >= w:
            seen.setdefault(("F", (i % g) // p), set()).add(state(i + 1, 0))
    for m in range(min(steady, 2 * g)):  # after forward w + m, which is before backward m
        x = state(w + m + 1, m)
        seen.setdefault(("F", ((w + m) % g) // p), set()).add(x)
        seen.setdefault(("B", v - 1 - (m % g) // p), set()).add(x)
    for m in range(steady, total):  # cool-down: before backward m
        seen.setdefault(("B", v - 1 - (m % g) // p), set()).add(state(total, m))
    seen[("O", -1)] = {(*[0] * 2 * v, *[1] * v)}
    return seen


def _done(n: int, c: int, p: int, g: int) -> int:
    """Of virtual microbatches 0 … n − 1 (chunk (i mod g) // p each, g = p·v), chunk c's."""
    return n // g * p + min(max(n % g - c * p, 0), p)


def _undominated(xs: AbstractSet[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The states of ``xs`` no other one dominates (each count at least as large), sorted.

    A state's dominators are larger in lexicographic order, so in decreasing order each state
    meets its dominators before itself; the undominated ones kept so far suffice to test it (a
    dominated dominator is itself dominated by one of them, which then dominates the state)."""
    front: list[tuple[int, ...]] = []
    for x in sorted(xs, reverse=True):
        if not any(all(map(operator.ge, y, x)) for y in front):  # states of one length
            front.append(x)
    front.reverse()
    return front


def inflight(s: Strategy, j: int, train: bool) -> float:
    """Chunk-microbatches whose activations stage j holds at most at once (its action list:
    k for GPipe, min(k, p−j) for 1F1B, Megatron's warm-up 2(p−j−1) + (v−1)p + 1 capped by k·v
    for the interleaved schedule)."""
    if not train:
        return 1.0
    return float(max(sum(hd.fwd) for hd in holds(s.schedule, s.p, s.k, s.v)[j]))


def pending_weight_grads(s: Strategy, j: int, train: bool) -> float:
    """Microbatches whose weight-gradient pass stage j defers at most at once (ZB-H1: the input-
    gradient pass done, the weight-gradient pass not yet; each holds what ``split_backward``
    carries), from the stage's own action list; 0 for schedules without the split."""
    if not train:
        return 0.0
    return float(max(sum(hd.wgrad) for hd in holds(s.schedule, s.p, s.k, s.v)[j]))


class Passes(NamedTuple):
    """One chunk's per-microbatch passes (seconds), in the order of ``KINDS``: forward,
    backward, and a zero-bubble schedule's input- and weight-gradient parts of the backward."""

    fwd: float
    bwd: float
    ibwd: float
    wbwd: float


def _chunk_buckets(
    s: Strategy,
    tb: Tables,
    stages: list[Stage],
    bounds: list[int],
    memo: dict[tuple[object, ...], tuple[tuple[float, float], ...]],
) -> tuple[tuple[tuple[float, float], ...], ...]:
    """Per chunk its ``grad_buckets`` (the first stage's weights, its own stage's gradient-pass
    times, the trainer's bucket), memoized on the rows' ids, the layers, the kind of pass and the
    bucket: strategies of one model meet the same chunks again and again."""
    zb = canonical_name(s.schedule) == "zb1"
    out = []
    for c, (a, b) in enumerate(itertools.pairwise(bounds)):
        st = stages[tb.stage_of[c]]
        cap = tb.reduction.bucket_bytes
        key = (stages[0].rid, st.rid, a, b, zb, cap)
        got = memo.get(key)
        if got is None:
            got = memo[key] = grad_buckets(stages[0].rows.weight, _grad_pass_rows(s, st.rows), a, b, cap)
        out.append(got)
    return tuple(out)


def _grad_pass_rows(s: Strategy, rows: StageRows) -> np.ndarray:
    """Per layer, its part of the pass computing the weight gradients: the backward, or ZB-H1's
    weight-gradient pass (the backward less its input-gradient part)."""
    bwd: np.ndarray = rows.time - rows.fwd
    if canonical_name(s.schedule) == "zb1":
        bwd = bwd - np.minimum(rows.ibwd, bwd)
    return bwd


def grad_buckets(
    weight: np.ndarray, grad_time: np.ndarray, a: int, b: int, cap: float = DDP_BUCKET_MB * float(1 << 20)
) -> tuple[tuple[float, float], ...]:
    """Layers ``a``…``b−1``'s gradient buckets as their pass fills them: the layers run last to
    first, each leaving its weight gradients (``weight`` bytes) after its ``grad_time``; a
    bucket closes once it holds ``cap`` bytes (``Reduction.bucket_bytes``, as ``Screen._calls``
    counts the calls) and at the chunk's first layer. Per bucket (x, y): the fraction of the pass run when
    it closes and the fraction of the chunk's gradient bytes in it and the buckets after it; ()
    without weights."""
    total_w = float(weight[a:b].sum())
    if total_w <= 0.0:
        return ()
    total_t = float(grad_time[a:b].sum())
    out: list[tuple[float, float]] = []
    t = held = 0.0
    left = total_w
    for i in range(b - 1, a - 1, -1):
        t += float(grad_time[i])
        held += float(weight[i])
        if held >= cap or i == a:
            out.append((t / total_t if total_t > 0.0 else (b - i) / (b - a), left / total_w))
            left -= held
            held = 0.0
    return tuple(out)


class PipelineTimes(NamedTuple):
    """When a pipeline's stages end and when each chunk's last gradients are computed
    (``pipeline_time``)."""

    stage_end: list[float]  # per stage, when its last pass ends
    # per chunk, (start, end) of its last pass computing weight gradients: the last backward, or
    # ZB-H1's last weight-gradient pass (inference: (0, 0))
    grad_pass: list[tuple[float, float]]
    # per chunk, when a reduction delayed by its rank's backward steps starts (``delayed_ready``)
    delayed: list[float]


def pipeline_time(
    s: Strategy,
    t_stage: Sequence[float],
    passes: Sequence[Passes],
    c_cut: Sequence[float],
    train: bool = True,
    delayed_sync: bool = False,
) -> PipelineTimes:
    """When each stage ends its last pass, from the stages' per-microbatch times ``t_stage``,
    their chunks' passes and the cuts' transfers (each cut's activation forward and, training,
    its gradient back, in equal halves): the schedule's own action lists list-scheduled with
    these times (``distir.parallel.pipeline.analysis.schedule_times``, the order ``distribute``
    writes the program in), so chunks of unequal times stall the stages as the schedule makes
    them wait, and a stage ahead of the first ends its backwards earlier (its gradient sync
    starts then). One stage runs its k microbatches back to back; a pipeline without backward
    (inference) takes ``(k−1)·max(T, C) + Σ T + Σ C`` over its stages' forward times T and
    transfers C, every stage counted to that end. With ``delayed_sync`` (Megatron-LM's delayed
    reductions) an interleaved schedule's ``delayed_ready`` times too."""
    if s.p == 1 or not train:
        end = (s.k - 1) * max([*t_stage, *c_cut]) + sum(t_stage) + sum(c_cut)
        last = [(end - ps.bwd, end) if train else (0.0, 0.0) for ps in passes]
        return PipelineTimes([end] * s.p, last, [g for _, g in last])
    v = s.v if canonical_name(s.schedule) == "interleaved" else 1
    order = compiled_schedule(s.schedule, s.p, s.k, v)
    transfers = [(x / 2.0, x / 2.0) for x in c_cut]
    got = schedule_times(order, passes, transfers)
    zb = canonical_name(s.schedule) == "zb1"
    kind = KINDS.index("W" if zb else "B")
    grad = []
    for c, ps in enumerate(passes):
        end = got.slot_end[4 * c + kind]
        grad.append((end - (ps.wbwd if zb else ps.bwd), end))
    delayed = delayed_ready(order, got.action_end, s.p) if v > 1 and delayed_sync else [g for _, g in grad]
    return PipelineTimes(got.rank_end, grad, delayed)


def delayed_ready(order: CompiledSchedule, action_end: Sequence[float], p: int) -> list[float]:
    """Per virtual stage, when the backward ``rank`` backward steps after its last one ends on
    its rank (the rank's last if fewer): where Megatron-LM's interleaved schedule launches a
    delayed chunk's gradient reduction (``distribute``'s ``_ScheduleWriter._delay_sync``)."""
    b = KINDS.index("B")
    ends: list[list[float]] = [[] for _ in range(p)]
    last: dict[int, tuple[int, int]] = {}  # virtual stage -> (rank, its last backward's position)
    for i, (r, sl) in enumerate(zip(order.rank, order.slot, strict=True)):
        if sl % 4 == b:
            last[sl // 4] = (r, len(ends[r]))
            ends[r].append(action_end[i])
    out = [0.0] * (max(last) + 1 if last else 0)
    for vs, (r, i) in last.items():
        out[vs] = ends[r][min(i + r, len(ends[r]) - 1)]
    return out


def chunk_passes(
    s: Strategy,
    stages: Sequence[Stage],
    stage_of: Sequence[int],
    t_chunk: Sequence[float],
    bounds: Sequence[int],
) -> list[Passes]:
    """Per chunk its passes: the forward its layers' forward rows, the backward the rest of its
    per-microbatch time ``t_chunk`` (with ZeRO-3's gathers, which its time row counts
    overlapped with both passes, and the gradient accumulation); under a zero-bubble schedule
    the input-gradient part its layers' rows of that pass, the weight-gradient part the rest."""
    out = []
    zb = canonical_name(s.schedule) == "zb1"
    for c, t in enumerate(t_chunk):
        rows = stages[stage_of[c]].rows
        a, b = bounds[c], bounds[c + 1]
        f = float(rows.fwd[a:b].sum())
        bwd = max(t - f, 0.0)
        i = min(float(rows.ibwd[a:b].sum()), bwd) if zb else bwd
        out.append(Passes(f, bwd, i, bwd - i))
    return out
