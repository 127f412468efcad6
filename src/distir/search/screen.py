"""The analytic screen: a strategy's step time and peak memory per device in about a millisecond.

AMP's formulas, generalized (heterogeneous devices, uneven layers, memory, schedules, ZeRO):

- **Stage times.** Stage j runs its layers on its TP groups; a layer costs what its profile says
  (``distir.search.profile``: the simulator on that layer alone, on that kind of GPUs, so TP
  collectives are included); a stage mixing device kinds runs at its slowest group's pace.
- **Pipeline.** With each chunk's forward and backward (ZB-H1: input- and weight-gradient
  parts) per microbatch and C_j the transfer after chunk j (activation forward, its gradient
  backward, over the slowest pair of the two stages' GPUs): the schedule's action lists
  list-scheduled with these times (``stage_costs.pipeline_time``), as ``distribute`` orders the
  program; AMP's ``(k−1)·max(T, C) + Σ T + Σ C`` over the stages' times T for one stage and
  forward-only pipelines.
- **Layer assignment.** Unless the strategy pins a partition, the layers are cut by the optimal
  dynamic program of ``distir.search.layer_assignment`` (AMP's objective above, per-stage
  device kinds and memory limits), so a faster device takes more layers.
- **Batch shares.** With uneven data parallelism (``Strategy.shares``) replica r takes
  shares[r]/Σshares of every microbatch: its TP group is profiled at that size, and a stage's
  figures are the worst of its replicas' (the slowest replica sets the pace, the largest holds
  the most activations).
- **Sequence parallelism**: the layers leave the norms' and biases' gradients pending over tp
  (``LayerProfile.tp_pending_bytes``); each stage all-reduces them over a TP group once per
  step, with its gradient sync (``distribute``: Megatron-LM's ``_allreduce_layernorm_grads``).
- **Data-parallel sync.** Each stage all-reduces its gradients over its replicas (ZeRO-2/3
  and Megatron-LM's ZeRO-1: reduce-scatters; the collective model of
  ``distir.sim.collectives``, so the slowest link of the group governs) in buckets during its
  last backwards (``_reduced_by``); ZeRO-1/2 add an all-gather of the updated shards after the
  update, ZeRO-3 gathers every weight in each forward and backward; HSDP (``z3h<n>``) gathers within
  its shard group and reduce-scatters there, then all-reduces the accumulated shard across the
  groups once per step, after the last microbatch (as ``distribute`` and FSDP2 do); then the
  optimizer.
- **Context parallelism** (c > 1): a stage's d·c TP groups are laid out replica by replica, the
  c context ranks of a replica consecutive (Megatron-LM's ``tp-cp-dp-pp`` order); each layer's
  profile at the whole sequence becomes a context rank's (``distir.search.context_cost``:
  compute and activations ÷ c, the ring's K/V transfers where attention does not hide them);
  gradients are reduced over the d·c ranks (ZeRO shards over them too).
- **Memory per device**, as ``distribute``'s program holds it: weights and optimizer state
  (divided by d — HSDP: by its shard group — as the ZeRO stage says), then the worst moment of
  the stage's own action list (``stage_costs.holds``): per chunk the saved activations of the
  microbatches between forward and backward (input-gradient pass), what an input-gradient pass
  carries to its deferred weight-gradient pass (ZB-H1), the gradient accumulator from the
  chunk's first backward on (a shard from ZeRO-2; whole for ZeRO-2 under a pipeline:
  ``distir.parallel.grad_reduction``), and the working set of the pass running then
  (the forward's above what it leaves; a weight-gradient pass's gradients, with the
  accumulation's sum beside the accumulator once there is one). A backward follows the inlined
  program's liveness (``stage_costs._backward``): the running chunk's layers run last to first,
  each with its incoming gradient and its working set above what is live when it starts (its
  input, residuals and incoming gradient dying in it; ZeRO-3: its gathered weights too), the
  layers after it having freed their saved activations and left their weight gradients (later
  microbatches: added into the accumulators, the Add's sum beside both). Saved activations count
  each piece of storage once (a residual viewing another adds nothing). ZeRO-3 adds the running
  layer's gathered weights and the next one's (gathered one layer ahead).

- **As a trainer runs it** (``Problem.trainer``, ``distir search --trainer``): the profiles are
  of the trainer's kernels and model (``distir.search.profile.TrainerForm``), the model state
  is held as the trainer holds it (``StateForm``: fp32 gradient sums, FSDP's shards and kept
  root, early gathers, what ``torch.distributed.pipelining`` keeps per microbatch), its ZeRO-3
  collectives run as its FSDP runs them (``GatherForm``), its reductions move fp32 where
  its reductions do (Megatron-LM's ZeRO-1 by reduce-scatters) and its update reads (and, as
  torchtitan's, scales) the gradients for their norm (``trainer_clip``).

The screen ranks; the exact simulation (``distir.search.rerank``) decides.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from distir.autodiff.precision import MIXED, PURE
from distir.autodiff.train import Optimizer, update_traffic
from distir.hardware.cluster import Cluster
from distir.parallel.distribute import (
    DDP_BUCKET_MB,
    MEGATRON_BUCKET,
    MEGATRON_BUCKET_PER_RANK,
    uniform_counts,
)
from distir.parallel.grad_reduction import reduce_scatter_every_backward
from distir.parallel.pipeline.partition import Ends, block_counts
from distir.parallel.strategy import Strategy
from distir.parallel.trainers import TrainerSemantics, trainer_clip, trainer_semantics
from distir.search.context_cost import AttentionShape, Ring, attention_shapes, context_layer
from distir.search.layer_assignment import Assignment, assign_layers_unchecked
from distir.search.profile import LayerProfile, Profiler, model_ends
from distir.search.stage_costs import (
    NEUTRAL_GATHERS,
    NEUTRAL_REDUCTION,
    NEUTRAL_STATE,
    Figures,
    GatherForm,
    Gathers,
    Reduction,
    Stage,
    StageRows,
    StateForm,
    Tables,
    figures,
    frozen,
    new_tables,
)
from distir.sim import collectives as coll
from distir.sim.interference import share

# one layer profile per layer call (``Profiler.layers``)
ProfileList = list[LayerProfile]


@dataclass(frozen=True, slots=True)
class Problem:
    """What a search holds fixed: the global batch, training or inference, the optimizer, the
    precision (the profiles' dtype is the compute dtype)."""

    batch: int
    train: bool = True
    optimizer: str = "adam"
    mixed: bool = False  # mixed precision: fp32 master weights and optimizer state (training)
    trainer: str = "distir"  # whose semantics the plans run with (``distir.parallel.trainers``)

    @property
    def n_state(self) -> int:
        return 2 if self.train and self.optimizer == "adam" else 0


class Sync(NamedTuple):
    """A stage's gradient sync (``Screen._sync_of``): its reductions, which may run beside the
    stage's last backwards (``Screen._reduced_by``), and what follows them (HSDP's reductions
    after the last microbatch, ZeRO-1's gather of the updated shards, the optimizer)."""

    reduce: float
    after: float


def buckets_end(
    free: float, r: float, start: float, ready: float, buckets: Sequence[tuple[float, float]]
) -> float:
    """When a chunk's reduction of ``r`` seconds ends, run bucket by bucket on a stream free from
    ``free``, as its pass from ``start`` to ``ready`` fills them: per bucket (x, y), it closes
    when the pass has run x of its time, and it and the buckets after it hold y of the bytes
    (``stage_costs.grad_buckets``). Run one after another, the buckets end at the latest of
    ``free + r`` and, over the buckets, close_i + (what is left from bucket i on)."""
    span = ready - start
    end = free + r
    for x, y in buckets:
        t = start + x * span + y * r
        if t > end:
            end = t
    return end


@dataclass(frozen=True, slots=True)
class Estimate:
    """The screen's figures for one strategy (seconds, bytes; memory is the worst device's)."""

    strategy: Strategy
    step_time_s: float
    peak_memory_bytes: float
    capacity_bytes: float
    fits: bool
    bubble_fraction: float
    compute_s: float  # k × the slowest stage's per-microbatch time
    pipeline_comm_s: float  # stage-boundary transfers on the critical path
    sync_s: float  # what the gradient reductions and optimizer add past the pipeline's end
    memory_headroom: float  # min over stages of capacity − peak (negative: out of memory)

    def throughput(self, batch: int) -> float:
        return batch / self.step_time_s if self.step_time_s > 0 else float("inf")


def rank_key(e: Estimate) -> tuple[bool, float]:
    """The search's order of estimates: fitting ones first, the faster first; then the others,
    the nearer to fitting first."""
    return (not e.fits, e.step_time_s if e.fits else -e.memory_headroom)


class Screen:
    """Evaluates strategies of one problem analytically (module docstring)."""

    def __init__(self, profiler: Profiler, problem: Problem) -> None:
        self.profiler = profiler
        self.problem = problem
        self.cluster: Cluster = profiler.cluster
        # the embedding stays with the first chunk, head and loss with the last
        self.ends = model_ends(profiler.spec, profiler.dtype, problem.train)
        # memos of pure functions (the placement search asks the same questions many times)
        self._assignments: dict[bytes, Assignment | None] = {}  # ``_assign``
        self._rows: dict[tuple[object, ...], StageRows] = {}
        # ``_worst_rows``: by the ids of the profile lists (kept alive in the value) and capacity
        self._worst: dict[tuple[object, ...], tuple[ProfileList, list[ProfileList], StageRows]] = {}
        self._links: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[float, float]] = {}
        self._pairs: dict[tuple[int, int], tuple[float, float]] = {}
        self._gathers: dict[tuple[int, ...], Gathers] = {}
        self._syncs: dict[tuple[object, ...], Sync] = {}
        # ``_step``'s: the sync per (ids of tables and stage, weight bytes and count) and when it
        # ends per (id of figures, stage, reduction, GPU kind)
        self._stage_syncs: dict[tuple[int, int, float, int], Sync] = {}
        self._reduced: dict[tuple[int, int, float, str], float] = {}
        # (rows' ids, layers, pass kind) -> a chunk's gradient buckets (``stage_costs._chunk_buckets``)
        self._buckets: dict[tuple[object, ...], tuple[tuple[float, float], ...]] = {}
        # (collective, group) -> its time for one byte: a bucket's latency (``_sync_time``)
        self._latencies: dict[tuple[object, tuple[int, ...]], float] = {}
        self._tp_sums: dict[tuple[object, ...], float] = {}  # ``_tp_sum``
        self._node_parts: dict[tuple[int, ...], tuple[object, ...]] = {}  # ``_sync_group``
        # the update after the sync, per weight, as the program writes it (``_sync_time``)
        self._update = update_traffic(
            Optimizer(problem.optimizer, **trainer_clip(problem.trainer)),  # with the trainer's clipping
            profiler.dtype,
            problem.train and problem.mixed,
        )
        self._attn: dict[int, list[tuple[AttentionShape, ...]]] = {}  # ``_attention``
        self._group_keys: dict[tuple[int, ...], tuple[object, ...]] = {}
        self._row_ids: dict[tuple[object, ...], int] = {}  # ``_stage_rows``' keys, interned
        self._stages: dict[tuple[object, ...], Stage] = {}  # ``_stage``
        # per strategy without placement (``Tables``); estimates up to the gradient sync are
        # memoized there, keyed by everything they depend on (``estimate``): placements that put
        # the same kinds of stages behind the same links share one
        self._tables: dict[Strategy, Tables] = {}
        self._last: tuple[Strategy | None, Tables | None] = (None, None)  # the last strategy met
        self._kinds = tuple(self.cluster.kind_of(g) for g in range(self.cluster.num_devices))
        self._specs = {self._kinds[g]: self.cluster.device_spec(g) for g in range(self.cluster.num_devices)}
        caps = {kind: spec.tensor_capacity for kind, spec in self._specs.items()}
        # per GPU kind, the share of its compute a collective beside it takes, as the profiles'
        # cost model charges it (``distir.sim.interference``; none with comm_interference off)
        cost = self.profiler.cost_model or self.profiler.default_cost()
        self._stalls = {self._kinds[g]: share(cost, g) for g in range(self.cluster.num_devices)}
        self._caps = [caps[kind] for kind in self._kinds]  # each GPU's memory for tensors

    @property
    def kinds(self) -> tuple[str, ...]:
        """Each cluster GPU's kind (``Cluster.kind_of``), by index."""
        return self._kinds

    # -- pieces ------------------------------------------------------------------------------
    def stage_gpus(self, s: Strategy, placement: Sequence[int]) -> list[list[int]]:
        n = s.d * s.c * s.t
        return [[placement[j * n + i] for i in range(n)] for j in range(s.p)]

    def _group_key(self, group: tuple[int, ...]) -> tuple[object, ...]:
        got = self._group_keys.get(group)
        if got is None:
            got = self._group_keys[group] = self.profiler.group_key(group)
        return got

    def _stage_rows(self, s: Strategy, gpus: list[int], b: int) -> tuple[tuple[object, ...], StageRows]:
        """Per-layer figures of one stage on ``gpus``: each the worst of the stage's replicas (TP
        groups; their slowest decides), except the first replica's weight count and activation (of
        the largest replica's with batch shares); and the stage's memory capacity. ``b`` is the
        per-replica microbatch, or with batch shares (``s.shares``) the microbatch of one share:
        replica r then takes ``b·shares[r]`` samples. Returns them with their key, of which they
        are a pure function (the profiler's figures depend on a group only through its key);
        memoized on it. Without shares the key is (t, d, b, recompute, sp, the distinct group keys in
        order of appearance, capacity); with shares, (t, d, None, recompute, sp, the distinct (group
        key, replica microbatch) pairs in order of appearance, capacity)."""
        cap = min(map(self._caps.__getitem__, gpus))  # runtime memory held
        if s.shares is not None:
            return self._shared_stage_rows(s, gpus, b, s.shares, cap)
        gks: dict[tuple[object, ...], tuple[int, ...]] = {}
        for r in range(s.d * s.c):  # the TP groups: replica by replica, context rank by rank
            group = tuple(gpus[r * s.t : (r + 1) * s.t])
            gks.setdefault(self._group_key(group), group)
        ring = self._ring(s, gpus) if s.c > 1 else None
        key = (s.t, s.d, b, s.recompute, s.sp, tuple(gks), cap) + ((s.c, ring) if ring is not None else ())
        got = self._rows.get(key)
        if got is not None:
            return key, got
        profs = [self.profiler.layers(s.t, b, group, s.recompute, s.sp) for group in gks.values()]
        if ring is not None:
            attn = self._attention(b, len(profs[0]))
            profs = [
                [
                    context_layer(p, a, s.t, s.c, ring, s.recompute != "none")
                    for p, a in zip(ps, attn, strict=True)
                ]
                for ps in profs
            ]
        got = self._rows[key] = self._worst_rows(profs, profs[0], cap)
        return key, got

    def _ring(self, s: Strategy, gpus: list[int]) -> Ring:
        """The context-parallel ring of the stage on ``gpus``: its slowest hop (TP rank 0 of the
        first replica's c groups, consecutive blocks of t GPUs) and its GPUs' peak FLOP/s."""
        ranks = [gpus[i * s.t] for i in range(s.c)]
        hops = [self._pair(x, y) for x, y in zip(ranks, ranks[1:] + ranks[:1], strict=True)]
        lat = max(h[0] for h in hops)
        per_byte = (max(h[1] for h in hops) - lat) / 1e9
        peak = min(self._specs[self._kinds[g]].peak_flops(self.profiler.dtype) for g in ranks)
        slow = min(ranks, key=lambda g: self._specs[self._kinds[g]].peak_flops(self.profiler.dtype))
        cost = self.profiler.cost_model or self.profiler.default_cost()  # the profiles' model
        return Ring(lat, per_byte, peak, self._kinds[slow], slow, cost)

    def _attention(self, b: int, n: int) -> list[tuple[AttentionShape, ...]]:
        """The attention ops of each of the first ``n`` layer calls at microbatch ``b``, memoized."""
        got = self._attn.get(b)
        if got is None:
            reduced = self.profiler.model(b)
            kept = attention_shapes(reduced.model)
            got = self._attn[b] = [kept[r] for r in reduced.rep]
        return got[:n]

    def _shared_stage_rows(
        self, s: Strategy, gpus: list[int], unit: int, shares: tuple[int, ...], cap: float
    ) -> tuple[tuple[object, ...], StageRows]:
        """``_stage_rows`` with batch shares: replica r's TP group profiled at ``unit·shares[r]``."""
        pairs: dict[tuple[tuple[object, ...], int], tuple[int, ...]] = {}
        for r in range(s.d):
            group = tuple(gpus[r * s.t : (r + 1) * s.t])
            pairs.setdefault((self._group_key(group), unit * shares[r]), group)
        # None where the even key has its microbatch: the two kinds of keys never meet
        key = (s.t, s.d, None, s.recompute, s.sp, tuple(pairs), cap)
        got = self._rows.get(key)
        if got is not None:
            return key, got
        sizes = [b_r for _, b_r in pairs]
        profs = [
            self.profiler.layers(s.t, b_r, group, s.recompute, s.sp) for (_, b_r), group in pairs.items()
        ]
        # the largest replica's activation is the largest transfer between stages
        big = sizes.index(max(sizes))
        got = self._rows[key] = self._worst_rows(profs, profs[big], cap)
        return key, got

    def _worst_rows(self, profs: list[list[LayerProfile]], lead: list[LayerProfile], cap: float) -> StageRows:
        """``worst_rows`` memoized on the identity of the profile lists (the profiler's, kept
        alive here) and ``cap``: stages of other d, k or schedules on GPUs alike meet the same
        profiles again."""
        key = (*map(id, profs), -1, id(lead), cap)
        got = self._worst.get(key)
        if got is None or got[0] is not lead or any(a is not b for a, b in zip(got[1], profs, strict=True)):
            got = self._worst[key] = (lead, profs, worst_rows(profs, lead, cap, self.problem.train))
        return got[2]

    def _pair(self, x: int, y: int) -> tuple[float, float]:
        """``send_time`` of 0 bytes and of 1 GB from GPU ``x`` to ``y``, memoized."""
        got = self._pairs.get((x, y))
        if got is None:
            got = self._pairs[(x, y)] = (
                coll.send_time(self.cluster, 0.0, x, y),
                coll.send_time(self.cluster, 1e9, x, y),
            )
        return got

    def _link(self, a: Sequence[int], b: Sequence[int]) -> tuple[float, float]:
        """(latency, seconds per byte) of a transfer from stage GPUs ``a`` to ``b`` (the slowest
        pair at 0 bytes and at 1 GB), memoized."""
        key = (tuple(a), tuple(b))
        got = self._links.get(key)
        if got is None:
            pairs = [self._pair(x, y) for x, y in zip(a, b, strict=True)]
            lat = max(p[0] for p in pairs)
            got = self._links[key] = (lat, (max(p[1] for p in pairs) - lat) / 1e9)
        return got

    def _gather(self, group: tuple[int, ...]) -> Gathers:
        """(latency, seconds per byte) of an all-gather and a reduce-scatter over ``group``
        (ZeRO-3), memoized."""
        got = self._gathers.get(group)
        if got is None:
            lat = coll.allgather_time(self.cluster, 1.0, group)
            rs_lat = coll.reducescatter_time(self.cluster, 1.0, group)
            got = self._gathers[group] = Gathers(
                lat,
                coll.allgather_time(self.cluster, 1e9, group) / 1e9,
                rs_lat,
                coll.reducescatter_time(self.cluster, 1e9, group) / 1e9,
            )
        return got

    # -- the estimate ------------------------------------------------------------------------
    def estimate(self, s: Strategy, placement: Sequence[int] | None = None, balance: bool = True) -> Estimate:
        """The screen's figures for ``s`` on ``placement`` (default: the strategy's own, else the
        identity). With ``balance`` and no pinned partition, the layers are assigned optimally and
        the returned strategy carries the partition (``L…``) when it is not the uniform one.

        All but the gradient sync is memoized on everything it depends on: the strategy without
        its placement, ``balance``, and what the placement decides — each stage's figures
        (``_stage_rows``' key) and its first GPU's kind, the links between consecutive stages, the
        ZeRO-3 gathers (``distir.search.stage_costs``). The sync (``_sync_of``, memoized on its
        own) depends on the replica groups."""
        fig, pl, tb, step = self._step(s, placement, balance)
        pipe = fig.pipe_s
        busy = fig.compute_s
        return Estimate(
            strategy=self._with(s, fig.counts, pl, tb, self.ends),
            step_time_s=step,
            peak_memory_bytes=fig.peak_memory_bytes,
            capacity_bytes=fig.capacity_bytes,
            fits=fig.fits,
            bubble_fraction=max(0.0, 1.0 - fig.mean_busy_s / step) if step > 0 else 0.0,
            compute_s=busy,
            pipeline_comm_s=max(pipe - busy, 0.0),
            sync_s=step - pipe,
            memory_headroom=fig.memory_headroom,
        )

    def placement_cost(self, s: Strategy, placement: Sequence[int]) -> tuple[float, bool, float]:
        """``estimate(s, placement)``'s step time, whether it fits and its memory headroom alone
        (what the placement search weighs), without making its strategy."""
        fig, _, _, step = self._step(s, placement, True)
        return step, fig.fits, fig.memory_headroom

    def _step(
        self, s: Strategy, placement: Sequence[int] | None, balance: bool
    ) -> tuple[Figures, tuple[int, ...], Tables, float]:
        """``estimate``'s figures up to the gradient sync, the placement, the tables and the step
        time."""
        pr = self.problem
        if placement is None:
            placement = s.gpus
        tb = self._tables_of(s)
        pl = tuple(placement)
        n = s.d * s.c * s.t
        if len(pl) < s.p * n:
            self.stage_gpus(s, pl)  # raises the IndexError an index past the end does
        got = tb.stages.get
        stages = [got(g) or self._stage(s, tb, g) for g in [pl[j * n : (j + 1) * n] for j in range(s.p)]]
        n_layers = stages[0].rows.time.size
        stage_of = tb.stage_of
        chunks = len(stage_of)
        n_blocks = n_layers - self.ends.pre - self.ends.post
        if chunks > n_blocks:
            raise ValueError(f"{s}: {chunks} pipeline chunks but only {n_blocks} blocks")
        kinds = tuple([st.kind for st in stages])
        links = tuple(
            [
                None
                if stages[stage_of[c]].gpus == stages[stage_of[c + 1]].gpus
                else self._link(stages[stage_of[c]].gpus, stages[stage_of[c + 1]].gpus)
                for c in range(chunks - 1)
            ]
        )
        zero3 = tuple([st.gather for st in stages]) if tb.zero3 else ()
        key = (balance, tuple([st.rid for st in stages]), kinds, links, zero3)
        fig = tb.figures.get(key)
        if fig is None:
            fig = tb.figures[key] = figures(
                s,
                tb,
                stages,
                links,
                zero3,
                balance,
                train=pr.train,
                specs=self._specs,
                stalls=self._stalls,
                assign=self._assign,
                bucket_memo=self._buckets,
                ends=self.ends,
            )
        # the gradient sync and optimizer, per stage: the reductions beside its last backwards
        # (``before_send``: each delaying the drain, the stages' in turn)
        pipe = fig.pipe_s
        step = pipe
        if pr.train:
            pending = self._tp_pending(s, stages, fig.counts) if s.sp else [0.0] * s.p
            chained = 0.0
            syncs, reduced = self._stage_syncs, self._reduced
            for j in range(s.p):
                st = stages[j]
                # by identity: the tables and their stages and figures are kept for the search
                # (``_tables``), and a placement met again asks again (``_sync_of``, ``_reduced_by``)
                skey = (id(tb), id(st), fig.stage_w[j], fig.stage_nw[j])
                sync = syncs.get(skey)
                if sync is None:
                    sync = syncs[skey] = self._sync_of(s, tb, st, fig.stage_w[j], fig.stage_nw[j])
                after = sync.after
                if pending[j]:  # the step's sum over tp of what the layers left pending
                    after += self._tp_sum(st.gpus[: s.t], pending[j])
                if tb.reduction.before_send:
                    chained += sync.reduce
                    step = max(step, pipe + chained + after)
                else:
                    rkey = (id(fig), j, sync.reduce, st.kind)
                    done = reduced.get(rkey)
                    if done is None:
                        done = reduced[rkey] = self._reduced_by(
                            s, tb, fig, j, sync.reduce, self._stalls[st.kind]
                        )
                    step = max(step, done + after)
        return fig, pl, tb, step

    def _tables_of(self, s: Strategy) -> Tables:
        """The tables of ``s`` without its placement (``Tables``); raises ValueError when the
        batch does not split into d·k microbatches (with batch shares: when it does not split
        into k microbatches of Σshares equal parts)."""
        last, tb = self._last
        if s is last and tb is not None:  # the placement search asks about one strategy
            return tb
        bare = s if s.placement is None else replace(s, placement=None)
        tb = self._tables.get(bare)
        if tb is None:
            pr = self.problem
            if s.shares is None:
                b, rem = divmod(pr.batch, s.d * s.k)
                if rem or b < 1:
                    raise ValueError(f"{s}: batch {pr.batch} does not split into d·k = {s.d * s.k} parts")
            else:
                # the microbatch of one share: replica r takes b·shares[r] of every microbatch
                w = sum(s.shares)
                b, rem = divmod(pr.batch, s.k * w)
                if rem or b < 1:
                    raise ValueError(
                        f"{s}: batch {pr.batch} does not split into k = {s.k} microbatches of "
                        f"Σshares = {w} parts"
                    )
            mixed = pr.train and pr.mixed
            tb = self._tables[bare] = new_tables(s, b, pr.train, pr.n_state, mixed, *self._forms(s))
        self._last = (s, tb)
        return tb

    def _semantics(self, s: Strategy) -> TrainerSemantics:
        """What the problem's trainer runs for ``s`` (``trainer_semantics``; the search's space
        holds only strategies it runs)."""
        pr = self.problem
        prec = MIXED if pr.train and pr.mixed else PURE
        return trainer_semantics(pr.trainer, s, prec, self.profiler.dtype, None, pr.train)

    def _forms(self, s: Strategy) -> tuple[StateForm, GatherForm, Reduction]:
        """How the problem's trainer runs ``s``, from its switches as ``distribute`` applies them:
        how it holds the model state (``StateForm``), runs ZeRO-3's collectives (``GatherForm``;
        FSDP's one stream: not HSDP) and reduces the gradients (``Reduction``: fp32 where it
        reduces fp32 sums or ``reduce_fp32``, Megatron-LM's ZeRO-1 by reduce-scatters)."""
        pr = self.problem
        if pr.trainer == "distir":
            return NEUTRAL_STATE, NEUTRAL_GATHERS, NEUTRAL_REDUCTION
        sem = self._semantics(s)
        mixed = pr.train and pr.mixed
        fp32_sums = sem.grad_accum_fusion or sem.fp32_grad_accum
        wide = s.d * s.c > 1 and sem.reduce_fp32 and s.zero >= 2 and reduce_scatter_every_backward(s)
        state = StateForm(
            fp32_grads=fp32_sums or wide,
            no_half_shard=sem.gather_cast,
            root_kept=sem.fsdp2_root,
            early_gather=sem.overlap_param_gather,
            kept=sem.pipelining_kept,
        )
        # as ``distribute`` decides: buckets in the backward, Megatron's delayed chunks, the
        # reductions after the stage's last pass
        bucketed = pr.train and s.d * s.c > 1 and not sem.deepspeed_pipe
        megatron = sem.megatron_ddp and bucketed and not reduce_scatter_every_backward(s)
        late = bool(sem.pipelining_kept) and sem.grad_copy_in == "cast" and bucketed
        cap = DDP_BUCKET_MB * float(1 << 20)
        if megatron:  # its bucket in parameters, counted in the compute dtype's bytes
            cap = max(MEGATRON_BUCKET, MEGATRON_BUCKET_PER_RANK * s.d) * float(self.profiler.dtype.itemsize)
        reduction = Reduction(
            2.0 if mixed and (sem.reduce_fp32 or fp32_sums) else 1.0,
            s.zero == 1 and sem.megatron_ddp,
            delayed=megatron and s.schedule != "zb1",
            after_stage=sem.deepspeed_pipe,
            before_send=late and s.p > 1,
            bucket_bytes=cap,
        )
        gathers = NEUTRAL_GATHERS
        if s.zero == 3:
            gathers = GatherForm(
                one_stream=sem.one_dp_stream and s.zero_degree == s.d * s.c,
                reduce_f=reduction.reduce_f,
                cast=sem.gather_cast and mixed,
                copy_out=sem.gather_copy_out,
                copy_in=sem.grad_copy_in == "cast",
            )
        return state, gathers, reduction

    def _stage(self, s: Strategy, tb: Tables, gpus: tuple[int, ...]) -> Stage:
        """What the stage on ``gpus`` decides (``Stage``), memoized in ``tb`` and, across
        strategies, on everything of the strategy it depends on (the strategies of one shape share
        their stages on the identity placement)."""
        memo = (gpus, s.t, s.d, s.c, tb.b, s.recompute, s.sp, s.shares, tb.zero3, s.zero_degree)
        got = self._stages.get(memo)
        if got is None:
            got = self._stages[memo] = self._new_stage(s, tb, gpus)
        tb.stages[gpus] = got
        return got

    def _new_stage(self, s: Strategy, tb: Tables, gpus: tuple[int, ...]) -> Stage:
        key, rows = self._stage_rows(s, list(gpus), tb.b)
        rid = self._row_ids.get(key)
        if rid is None:
            rid = self._row_ids[key] = len(self._row_ids)
        group = tuple(gpus[:: s.t][: s.d * s.c])  # the gradients are reduced over dp × cp
        return Stage(
            gpus=gpus,
            rid=rid,
            rows=rows,
            kind=self._kinds[gpus[0]],
            group=group,
            sorted_group=tuple(sorted(group)),
            # ZeRO-3 gathers over its shard group: all d·c ranks, or HSDP's first group
            gather=self._gather(group[: s.zero_degree]) if tb.zero3 else None,
        )

    def _assign(
        self,
        time_c: np.ndarray,
        k: int,
        comm: np.ndarray | None,
        mem: np.ndarray | None = None,
        cap: np.ndarray | None = None,
    ) -> Assignment | None:
        """``assign_layers``, memoized on the exact bytes of its inputs: the placement search
        meets the same stage kinds, links and limits again and again under other GPU numbers.
        The key is a 160-bit digest of them (the inputs themselves would hold megabytes): SHA-1,
        twice as fast as BLAKE2b here (a few percent of GPT-3's screen), fed the arrays'
        buffers without copying them; not a security use."""
        h = hashlib.sha1(str(k).encode(), usedforsecurity=False)
        for a in (time_c, comm, mem, cap):
            if a is None:
                h.update(b"-")
            else:
                h.update(repr(a.shape).encode())
                h.update(np.ascontiguousarray(a).data)
        key = h.digest()
        if key in self._assignments:
            return self._assignments[key]
        got = self._assignments[key] = assign_layers_unchecked(time_c, k, comm, mem, cap)
        return got

    def _tp_pending(self, s: Strategy, stages: list[Stage], counts: tuple[int, ...]) -> list[float]:
        """Per stage, the bytes of weight gradients its layers leave pending over tp (sequence
        parallelism), by the partition's layer ``counts`` per chunk."""
        bounds = [0, *itertools.accumulate(counts)]
        out = [0.0] * s.p
        for c in range(len(counts)):
            rows = stages[c % s.p].rows.tp_pending
            if rows is not None:
                out[c % s.p] += float(rows[bounds[c] : bounds[c + 1]].sum())
        return out

    def _tp_sum(self, group: tuple[int, ...], nbytes: float) -> float:
        """The step's one all-reduce over a TP group of the gradients the layers left pending
        over tp (``distribute``'s ``_tp_sum``: Megatron-LM's ``_allreduce_layernorm_grads``)."""
        key = (tuple(sorted(group)), nbytes)
        got = self._tp_sums.get(key)
        if got is None:
            got = self._tp_sums[key] = coll.allreduce_time(self.cluster, nbytes, group)
        return got

    def _sync_of(self, s: Strategy, tb: Tables, st: Stage, w: float, n_w: int) -> Sync:
        """Gradient reduction over stage ``st``'s replicas (per TP rank, all ranks at once) and
        the optimizer on its GPUs' kind, for ``w`` weight bytes in ``n_w`` weights; memoized (a
        pure function of the arguments that matter)."""
        # the collectives collapse duplicates and order a group by GPU index
        # (``distir.sim.collectives``): its set is what matters, or less (``_sync_group``)
        group = self._sync_group(s, st.sorted_group)
        key = (s.d, s.c, s.zero, s.shard_group, group, st.kind, w, n_w, tb.reduction, tb.gathers)
        got = self._syncs.get(key)
        if got is None:
            got = self._syncs[key] = self._sync_time(s, tb, st.group, st.kind, w, n_w)
        return got

    def _sync_group(self, s: Strategy, group: tuple[int, ...]) -> tuple[object, ...]:
        """What of the sorted replica group ``group`` the sync's time depends on (``_sync_of``'s
        key): on a cluster without link matrices, its GPUs per node as (node, count) in node
        order — the collectives read a group only through ``_by_node``'s parts, each node's links,
        curves and network share by the node and its count, never which of its GPUs
        (``distir.sim.collectives``; a test compares the times on groups alike) — except under
        HSDP, whose reductions split the group by position; else the group itself. Placements
        that move a replica to another GPU of the same node share one sync (the placement search)."""
        if self.cluster.has_matrices or s.zero_degree < s.d * s.c:
            return group
        got = self._node_parts.get(group)
        if got is None:
            nodes = self.cluster.gpu_nodes
            got = self._node_parts[group] = (
                "by node",
                *((n, len(list(gs))) for n, gs in itertools.groupby(group, nodes.__getitem__)),
            )
        return got

    @staticmethod
    def _calls(w: float, n_w: int, cap: float) -> int:
        """Collective calls of a stage's gradient reduction of ``w`` bytes in ``n_w`` weights: one
        per bucket, buckets of whole layers' gradients closed once they hold the trainer's cap
        ``cap`` (``Reduction.bucket_bytes``; ``distribute``'s ``_Buckets``): at most one more
        than the cap fits, one per weight."""
        return min(n_w, int(w // cap) + 1)

    def _sync_time(
        self, s: Strategy, tb: Tables, group: tuple[int, ...], kind: str, w: float, n_w: int
    ) -> Sync:
        """The gradient sync of ``_sync_of``: ``w`` weight bytes reduced as the trainer reduces
        them (``tb.reduction``: fp32 reductions of half gradients move twice the bytes; ZeRO-1
        by reduce-scatters), then the optimizer."""
        red = after = 0.0
        wr = w * tb.reduction.reduce_f
        calls = self._calls(w, n_w, tb.reduction.bucket_bytes)
        h = s.zero_degree
        if s.d > 1 and n_w and h < s.d * s.c:
            # HSDP: reduce-scatter within the shard group, all-reduce the shard across groups,
            # once per step after the last microbatch (as FSDP2 does)
            inner, across = group[:h], group[::h]
            lat = self._latency(coll.reducescatter_time, inner) + self._latency(coll.allreduce_time, across)
            after += coll.reducescatter_time(self.cluster, wr, inner) + coll.allreduce_time(
                self.cluster, wr / h, across
            )
            after += (calls - 1) * lat
        elif s.d * s.c > 1 and n_w and (s.zero >= 2 or tb.reduction.scatter):
            # ZeRO-2/3 reduce-scatter the gradients (ZeRO-3's gathers are the layers':
            # ``_time_row``; on the gathers' stream its reduce-scatters are there too:
            # ``_fsdp_terms``), as Megatron-LM's ZeRO-1 does
            if not tb.gathers.one_stream:
                lat = self._latency(coll.reducescatter_time, group)
                red += coll.reducescatter_time(self.cluster, wr, group) + (calls - 1) * lat
            if s.zero in (1, 2):  # the updated shards gathered after the update
                after += coll.allgather_time(self.cluster, w, group)
        elif s.d * s.c > 1 and n_w:
            lat = self._latency(coll.allreduce_time, group)
            red += coll.allreduce_time(self.cluster, wr, group) + (calls - 1) * lat
            if s.zero == 1:
                after += coll.allgather_time(self.cluster, w, group)
        spec = self._specs[kind]
        params = w / (h if s.zero >= 1 else 1) / self.profiler.dtype.itemsize
        upd = self._update
        after += upd.bytes_per_param * params / (0.8 * spec.memory_bandwidth)
        return Sync(red, after + n_w * upd.kernels * spec.launch_overhead_s)

    def _reduced_by(self, s: Strategy, tb: Tables, fig: Figures, j: int, red: float, stall: float) -> float:
        """When stage ``j``'s gradient reductions (``red`` seconds on one stream for the last
        microbatch) end, and its passes too: each chunk's share (by its weight bytes) runs bucket
        by bucket as the chunk's last pass computing weight gradients fills them
        (``Figures.grad_pass_s``, ``Figures.buckets``: ``buckets_end``), the chunks in the order
        they finish; the stage's computation slowed by ``stall`` of the reductions beside it
        (the simulator's interference, ``distir.sim.interference``), in every microbatch where
        the trainer reduces in every backward (ZeRO-3, ZeRO-2 without a pipeline:
        ``reduce_scatter_every_backward``). Megatron-LM's delayed chunks (``distribute``'s
        ``delayed_sync``) reduce as one call after that pass (interleaved: after the rank's
        ``rank``-th backward after it, ``Figures.delayed_s``); DeepSpeed's pipeline engine after
        the stage's last pass (FSDP2 under ``torch.distributed.pipelining``: ``estimate``
        chains them through the drain)."""
        end = fig.stage_end_s[j]
        if red <= 0.0:
            return end
        if tb.reduction.after_stage:
            return end + red
        if reduce_scatter_every_backward(s):  # the earlier microbatches' reductions beside compute
            end += stall * red * (s.k - 1)
        chunks = sorted(range(j, len(fig.chunk_w), s.p), key=lambda c: fig.grad_pass_s[c][1])
        total = sum([fig.chunk_w[c] for c in chunks])
        free = beside = 0.0
        for c in chunks:
            r = red * fig.chunk_w[c] / total if total > 0 else red / len(chunks)
            start, ready = fig.grad_pass_s[c]
            if tb.reduction.delayed and c > 0:  # one call, after the rank's backward steps
                free = max(free, fig.delayed_s[c]) + r
            else:
                free = buckets_end(free, r, start, ready, fig.buckets[c])
            beside += max(0.0, min(free, end) - (free - r))
        return max(free, end + stall * beside)

    def _latency(
        self, collective: Callable[[Cluster, float, tuple[int, ...]], float], group: tuple[int, ...]
    ) -> float:
        """``collective``'s time for one byte over ``group`` on the cluster (a bucket's latency in
        ``_sync_time``), memoized: a pure function of the two, met again for every weight size."""
        key = (collective, group)
        got = self._latencies.get(key)
        if got is None:
            got = self._latencies[key] = collective(self.cluster, 1.0, group)
        return got

    @staticmethod
    def _with(
        s: Strategy, counts: tuple[int, ...], placement: tuple[int, ...], tb: Tables, ends: Ends
    ) -> Strategy:
        """``s`` with the partition of ``counts`` layer calls per chunk (as blocks per chunk,
        "uniform" when it is) and ``placement`` (None when it is the identity)."""
        part = tb.parts.get(counts)
        if part is None:
            blocks = block_counts(counts, ends)
            assert blocks is not None, f"{s}: the layer assignment split the model's ends: {counts}"
            part = tb.parts[counts] = (
                "uniform" if blocks == uniform_counts(sum(blocks), len(blocks)) else blocks
            )
        ident = tb.identity if len(placement) == len(tb.identity) else tuple(range(len(placement)))
        place = None if placement == ident else placement
        return Strategy(
            s.d,
            s.t,
            s.p,
            s.k,
            s.schedule,
            s.v,
            s.zero,
            s.recompute,
            part,
            place,
            s.sp,
            s.shares,
            s.shard_group,
            s.c,
        )


def worst_rows(profs: list[ProfileList], lead: ProfileList, cap: float, train: bool) -> StageRows:
    """Per layer the worst of ``profs`` (time, weight, saved, work); weight count and output
    activation from ``lead``; ``cap`` the stage's memory capacity."""
    fb = 1.0 if train else 0.0
    n = range(len(profs[0]))
    return StageRows(
        time=frozen([max(p[i].fwd_s + fb * p[i].bwd_s for p in profs) for i in n]),
        fwd=frozen([max(p[i].fwd_s for p in profs) for i in n]),
        ibwd=frozen([max(p[i].ibwd_s for p in profs) for i in n]),
        weight=frozen([max(p[i].weight_bytes for p in profs) for i in n]),
        n_w=frozen([lead[i].n_weights for i in n]),
        saved=frozen([max(p[i].saved_bytes for p in profs) for i in n]),
        out=frozen([lead[i].out_bytes for i in n]),
        work=frozen([max(p[i].work_bytes for p in profs) for i in n]),
        carried=frozen([max(p[i].carried_bytes for p in profs) for i in n]),
        fwd_work=frozen([max(p[i].fwd_work_bytes for p in profs) for i in n]),
        largest=frozen([max(p[i].largest_weight_bytes for p in profs) for i in n]),
        bwd_work=frozen([max(p[i].bwd_work_bytes for p in profs) for i in n]),
        ibwd_work=frozen([max(p[i].ibwd_work_bytes for p in profs) for i in n]),
        zbwd_work=frozen([max(p[i].zbwd_work_bytes for p in profs) for i in n]),
        cap=cap,
        tp_pending=frozen([max(p[i].tp_pending_bytes for p in profs) for i in n]),
    )


__all__ = ["Estimate", "Problem", "Screen", "buckets_end", "rank_key"]
