"""The analytic screen: a strategy's step time and peak memory per device in about a millisecond.

AMP's formulas, generalized (heterogeneous devices, uneven layers, memory, schedules, ZeRO):

- **Stage times.** Stage j runs its layers on its TP groups; a layer costs what its profile says
  (``distir.search.profile``: the simulator on that layer alone, on that kind of GPUs, so TP
  collectives are included); a stage mixing device kinds runs at its slowest group's pace.
- **Pipeline.** With T_j the per-microbatch time of stage j and C_j the transfer after it
  (activation forward, its gradient backward, over the slowest pair of the two stages' GPUs):
  ``(k−1)·max(T, C) + Σ T + Σ C`` for GPipe and 1F1B; the interleaved schedule divides the
  fill/drain part by v, the zero-bubble schedule (ZB-H1) by 3.
- **Layer assignment.** Unless the strategy pins a partition, the layers are cut by the optimal
  dynamic program of ``distir.search.layer_assignment`` (the same objective, per-stage device
  kinds and memory limits), so a faster device takes more layers.
- **Data-parallel sync.** After the last microbatch, each stage all-reduces its gradients over
  its replicas (the collective model of ``distir.sim.collectives``, so the slowest link of the
  group governs), one collective per weight; ZeRO-1 adds an all-gather of the updated shards,
  ZeRO-3 gathers every weight in each forward and backward; then the optimizer.
- **Memory per device.** Weights, gradients and their accumulator, optimizer state (divided by
  d as the ZeRO stage says), activations of the microbatches in flight (k for GPipe,
  min(k, p−j) for 1F1B, Megatron's warm-up count for interleaved), and the largest layer's
  transient working set.

The screen ranks; the exact simulation (``distir.search.rerank``) decides.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from distir.hardware.cluster import Cluster
from distir.parallel.distribute import uniform_counts
from distir.parallel.strategy import Strategy
from distir.search.layer_assignment import Assignment, assign_layers, objective
from distir.search.profile import Profiler
from distir.sim import collectives as coll

ADAM_BYTES = 12.0  # Adam reads w, g, m, v and writes w, m, v: ~12 tensor passes with its temporaries
SGD_BYTES = 3.0


@dataclass(frozen=True, slots=True)
class Problem:
    """What a search holds fixed: the global batch, training or inference, the optimizer."""

    batch: int
    train: bool = True
    optimizer: str = "adam"

    @property
    def n_state(self) -> int:
        return 2 if self.train and self.optimizer == "adam" else 0


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
    sync_s: float  # gradient reduction and optimizer after the last microbatch
    memory_headroom: float  # min over stages of capacity − peak (negative: out of memory)

    def throughput(self, batch: int) -> float:
        return batch / self.step_time_s if self.step_time_s > 0 else float("inf")


def _frozen(values: Sequence[float]) -> np.ndarray:
    a = np.array(values)
    a.flags.writeable = False  # shared by every estimate of the stage
    return a


@dataclass(frozen=True, slots=True)
class _StageRows:
    """One stage's per-layer figures (``Screen._stage_rows``), read-only arrays of length L."""

    time: np.ndarray  # forward + backward of one microbatch
    weight: np.ndarray
    n_w: np.ndarray
    saved: np.ndarray
    out: np.ndarray
    work: np.ndarray
    cap: float  # the smallest memory of the stage's GPUs


@dataclass(frozen=True, slots=True)
class _Figures:
    """What ``Screen.estimate`` computes before the gradient sync (its memo)."""

    counts: tuple[int, ...]
    pipe_s: float  # the pipeline's time (``Screen._pipeline``)
    compute_s: float  # k × the slowest stage's per-microbatch time
    mean_busy_s: float  # k × the mean stage's per-microbatch time
    stage_w: tuple[float, ...]  # weight bytes per stage
    stage_nw: tuple[int, ...]  # weights per stage
    peak_memory_bytes: float
    capacity_bytes: float
    fits: bool
    memory_headroom: float


class Screen:
    """Evaluates strategies of one problem analytically (module docstring)."""

    def __init__(self, profiler: Profiler, problem: Problem) -> None:
        self.profiler = profiler
        self.problem = problem
        self.cluster: Cluster = profiler.cluster
        # memos of pure functions (the placement search asks the same questions many times)
        self._assignments: dict[bytes, Assignment | None] = {}
        self._rows: dict[tuple[object, ...], _StageRows] = {}
        self._links: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[float, float]] = {}
        self._pairs: dict[tuple[int, int], tuple[float, float]] = {}
        self._gathers: dict[tuple[int, ...], tuple[float, float]] = {}
        self._syncs: dict[tuple[object, ...], float] = {}
        self._group_keys: dict[tuple[int, ...], tuple[object, ...]] = {}
        # estimates up to the gradient sync, keyed by everything they depend on (``estimate``):
        # placements that put the same kinds of stages behind the same links share one
        self._figures: dict[tuple[object, ...], _Figures] = {}
        self._kinds = tuple(self.cluster.kind_of(g) for g in range(self.cluster.num_devices))
        self._specs = {self._kinds[g]: self.cluster.device_spec(g) for g in range(self.cluster.num_devices)}

    # -- pieces ------------------------------------------------------------------------------
    def stage_gpus(self, s: Strategy, placement: Sequence[int]) -> list[list[int]]:
        n = s.d * s.t
        return [[placement[j * n + i] for i in range(n)] for j in range(s.p)]

    def _group_key(self, group: tuple[int, ...]) -> tuple[object, ...]:
        got = self._group_keys.get(group)
        if got is None:
            got = self._group_keys[group] = self.profiler.group_key(group)
        return got

    def _stage_rows(self, s: Strategy, gpus: list[int], b: int) -> tuple[tuple[object, ...], _StageRows]:
        """Per-layer figures of one stage on ``gpus``: each the worst of the stage's distinct TP
        groups (their slowest decides), except the first group's weight count and activation;
        and the stage's memory capacity. Returns them with their key: (t, d, b, recompute, the
        distinct group keys in order of appearance, capacity), of which they are a pure function
        (the profiler's figures depend on a group only through its key); memoized on it."""
        gks: dict[tuple[object, ...], tuple[int, ...]] = {}
        for r in range(s.d):
            group = tuple(gpus[r * s.t : (r + 1) * s.t])
            gks.setdefault(self._group_key(group), group)
        cap = min(self._specs[self._kinds[g]].memory_bytes for g in gpus)
        key = (s.t, s.d, b, s.recompute, tuple(gks), cap)
        got = self._rows.get(key)
        if got is not None:
            return key, got
        profs = [self.profiler.layers(s.t, b, group, s.recompute) for group in gks.values()]
        fb = 1.0 if self.problem.train else 0.0
        n = range(len(profs[0]))
        got = self._rows[key] = _StageRows(
            time=_frozen([max(p[i].fwd_s + fb * p[i].bwd_s for p in profs) for i in n]),
            weight=_frozen([max(p[i].weight_bytes for p in profs) for i in n]),
            n_w=_frozen([profs[0][i].n_weights for i in n]),
            saved=_frozen([max(p[i].saved_bytes for p in profs) for i in n]),
            out=_frozen([profs[0][i].out_bytes for i in n]),
            work=_frozen([max(p[i].work_bytes for p in profs) for i in n]),
            cap=cap,
        )
        return key, got

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

    def _gather(self, group: tuple[int, ...]) -> tuple[float, float]:
        """(latency, seconds per byte) of an all-gather over ``group`` (ZeRO-3), memoized."""
        got = self._gathers.get(group)
        if got is None:
            lat = coll.allgather_time(self.cluster, 1.0, group)
            got = self._gathers[group] = (lat, coll.allgather_time(self.cluster, 1e9, group) / 1e9)
        return got

    # -- the estimate ------------------------------------------------------------------------
    def estimate(self, s: Strategy, placement: Sequence[int] | None = None, balance: bool = True) -> Estimate:
        """The screen's figures for ``s`` on ``placement`` (default: the strategy's own, else the
        identity). With ``balance`` and no pinned partition, the layers are assigned optimally and
        the returned strategy carries the partition (``L…``) when it is not the uniform one.

        All but the gradient sync is memoized on everything it depends on: the strategy without
        its placement, ``balance``, and what the placement decides — each stage's figures
        (``_stage_rows``' key) and its first GPU's kind, the links between consecutive stages, the
        ZeRO-3 gathers. The sync (``_sync``, memoized on its own) depends on the replica groups."""
        pr = self.problem
        if placement is None:
            placement = s.placement or tuple(range(s.devices))
        b, rem = divmod(pr.batch, s.d * s.k)
        if rem or b < 1:
            raise ValueError(f"{s}: batch {pr.batch} does not split into d·k = {s.d * s.k} parts")
        stages = self.stage_gpus(s, placement)
        keyed = [self._stage_rows(s, g, b) for g in stages]
        rows = [r for _, r in keyed]
        n_layers = rows[0].time.size
        chunks = s.p * s.v
        if chunks > n_layers:
            raise ValueError(f"{s}: {chunks} pipeline chunks but only {n_layers} layers")
        stage_of = [c % s.p for c in range(chunks)]
        kinds = tuple(self._kinds[g[0]] for g in stages)
        links = tuple(
            None
            if stages[stage_of[c]] == stages[stage_of[c + 1]]
            else self._link(stages[stage_of[c]], stages[stage_of[c + 1]])
            for c in range(chunks - 1)
        )
        # the replicas' collectives: one GPU of each replica (the first of its TP group)
        groups = tuple(tuple(g[:: s.t][: s.d]) for g in stages)
        zero3 = tuple(self._gather(grp) for grp in groups) if pr.train and s.zero == 3 and s.d > 1 else ()
        key = (
            s if s.placement is None else replace(s, placement=None),
            balance,
            tuple(k for k, _ in keyed),
            kinds,
            links,
            zero3,
        )
        fig = self._figures.get(key)
        if fig is None:
            fig = self._figures[key] = self._figures_of(s, rows, stage_of, kinds, links, zero3, balance)
        # the gradient sync and optimizer, per stage (stages in parallel)
        sync = 0.0
        if pr.train:
            for j in range(s.p):
                sync = max(sync, self._sync(s, groups[j], kinds[j], fig.stage_w[j], fig.stage_nw[j]))
        pipe = fig.pipe_s
        step = pipe + sync
        busy = fig.compute_s
        return Estimate(
            strategy=self._with(s, fig.counts, placement),
            step_time_s=step,
            peak_memory_bytes=fig.peak_memory_bytes,
            capacity_bytes=fig.capacity_bytes,
            fits=fig.fits,
            bubble_fraction=max(0.0, 1.0 - fig.mean_busy_s / step) if step > 0 else 0.0,
            compute_s=busy,
            pipeline_comm_s=max(pipe - busy, 0.0),
            sync_s=sync,
            memory_headroom=fig.memory_headroom,
        )

    def _figures_of(
        self,
        s: Strategy,
        rows: list[_StageRows],
        stage_of: list[int],
        kinds: tuple[str, ...],
        links: tuple[tuple[float, float] | None, ...],
        zero3: tuple[tuple[float, float], ...],
        balance: bool,
    ) -> _Figures:
        """``estimate``'s figures up to the gradient sync, from what the placement decides for
        them (see there)."""
        pr = self.problem
        chunks = len(stage_of)
        n_layers = rows[0].time.size
        fb = 1.0 if pr.train else 0.0
        lt = np.array([r.time for r in rows])  # a fresh array: the terms below add into it
        w_bytes = rows[0].weight
        n_w = rows[0].n_w
        saved = rows[0].saved * fb
        out_b = rows[0].out
        work = np.max([r.work for r in rows], axis=0)
        # ZeRO-3 gathers every weight before its forward and its backward, in every microbatch
        for j, (lat, per_byte) in enumerate(zero3):
            lt[j] += 2 * (w_bytes * per_byte + n_w * lat)
        # gradient accumulation: microbatches after the first add into the accumulators
        if pr.train and s.k > 1:
            for j in range(s.p):
                spec = self._specs[kinds[j]]
                per = 3 * w_bytes / (0.8 * spec.memory_bandwidth) + n_w * spec.launch_overhead_s
                lt[j] += (s.k - 1) / s.k * per
        time_c = lt[stage_of]
        # transfer after chunk c when the cut follows layer i: forward activation (+ gradient back)
        trips = 2.0 if pr.train else 1.0
        comm = np.zeros((max(chunks - 1, 0), max(n_layers - 1, 0)))
        for c, link in enumerate(links):
            if link is not None:
                lat, per_byte = link
                comm[c] = trips * (lat + out_b[:-1] * per_byte)
        # memory per device: static (weights, grads, state) + activations in flight + transient
        d = s.d
        wf = 1.0 / d if s.zero == 3 else 1.0
        static_f = wf
        if pr.train:
            static_f += 1.0 + (1.0 if s.k > 1 else 0.0)  # gradient + its accumulator
            static_f += pr.n_state / (d if s.zero >= 1 else 1)
        inflight = [self._inflight(s, j) for j in range(s.p)]
        mem = np.array([static_f * w_bytes + inflight[j] * saved for j in range(s.p)])
        caps = np.array([r.cap for r in rows], float)
        counts: tuple[int, ...]
        if isinstance(s.partition, tuple):
            counts = s.partition
        elif balance and s.v == 1 and s.p > 1:
            got = self._assign(time_c, s.k, comm if chunks > 1 else None, mem, caps - work.max())
            if got is None:  # nothing fits: balance time alone, report the memory honestly
                got = self._assign(time_c, s.k, comm if chunks > 1 else None)
            assert got is not None
            counts = got.counts
            # equal time: keep the uniform split (the simpler strategy string)
            uni = uniform_counts(n_layers, chunks)
            if counts != uni and objective(uni, time_c, s.k, comm) <= got.time * (1 + 1e-6):
                cut = np.concatenate([[0], np.cumsum(uni)])
                if all(mem[j, cut[j] : cut[j + 1]].sum() <= caps[j] - work.max() for j in range(s.p)):
                    counts = uni
        else:
            counts = uniform_counts(n_layers, chunks)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        t_chunk = [float(time_c[c, bounds[c] : bounds[c + 1]].sum()) for c in range(chunks)]
        c_cut = [float(comm[c, bounds[c + 1] - 1]) for c in range(chunks - 1)]
        t_stage = [sum(t_chunk[c] for c in range(chunks) if stage_of[c] == j) for j in range(s.p)]
        pipe = self._pipeline(s, t_stage, c_cut)
        peaks: list[float] = []
        stage_w: list[float] = []
        stage_nw: list[int] = []
        for j in range(s.p):
            layers = [i for c in range(chunks) if stage_of[c] == j for i in range(bounds[c], bounds[c + 1])]
            wj = float(w_bytes[layers].sum())
            nwj = int(n_w[layers].sum())
            act = inflight[j] * float(saved[layers].sum()) / s.v
            peaks.append(static_f * wj + act + float(work[layers].max(initial=0.0)))
            stage_w.append(wj)
            stage_nw.append(nwj)
        headroom = [float(c) - p for c, p in zip(caps, peaks, strict=True)]
        worst = int(np.argmin(headroom))
        return _Figures(
            counts=tuple(counts),
            pipe_s=pipe,
            compute_s=s.k * max(t_stage),
            mean_busy_s=s.k * sum(t_stage) / s.p,
            stage_w=tuple(stage_w),
            stage_nw=tuple(stage_nw),
            peak_memory_bytes=max(peaks),
            capacity_bytes=float(caps[worst]) if peaks[worst] > caps[worst] else float(caps.min()),
            fits=min(headroom) >= 0,
            memory_headroom=min(headroom),
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
        The key is a 128-bit digest of them (the inputs themselves would hold megabytes)."""
        h = hashlib.blake2b(str(k).encode(), digest_size=16)
        for a in (time_c, comm, mem, cap):
            h.update(b"-" if a is None else repr(a.shape).encode() + np.ascontiguousarray(a).tobytes())
        key = h.digest()
        if key in self._assignments:
            return self._assignments[key]
        got = self._assignments[key] = assign_layers(time_c, k, comm, mem, cap)
        return got

    def _inflight(self, s: Strategy, j: int) -> float:
        """Microbatches whose activations stage j holds at its peak (in whole-stage units)."""
        if not self.problem.train:
            return 1.0
        if s.schedule == "gpipe":
            return float(s.k)
        if s.schedule == "interleaved" and s.v > 1:
            # Megatron's warm-up: 2(p−j−1) + (v−1)p + 1 chunk-microbatches, capped by k·v
            return float(min(s.k * s.v, 2 * (s.p - j - 1) + (s.v - 1) * s.p + 1))
        return float(min(s.k, s.p - j))

    def _pipeline(self, s: Strategy, t_stage: list[float], c_cut: list[float]) -> float:
        m = max([*t_stage, *c_cut])
        total = sum(t_stage)
        fill = total - max(t_stage)  # what the fill and drain add to k × the slowest stage
        if s.schedule == "interleaved" and s.v > 1:
            fill /= s.v
        elif s.schedule == "zb1" and s.p > 1:
            # ZB-H1 fills the bubble with deferred weight gradients: a third remains once
            # there are enough microbatches (k ≥ p), none is saved with a single one
            fill *= 1.0 - (2.0 / 3.0) * min(1.0, (s.k - 1) / (s.p - 1))
        return (s.k - 1) * m + max(t_stage) + fill + sum(c_cut)

    def _sync(self, s: Strategy, group: tuple[int, ...], kind: str, w: float, n_w: int) -> float:
        """Gradient reduction over the replicas ``group`` (per TP rank, all ranks at once) and the
        optimizer on GPUs of ``kind``; memoized (a pure function of the arguments that matter)."""
        # the collectives collapse duplicates and order a group by GPU index
        # (``distir.sim.collectives``): its set is what matters
        key = (s.d, s.zero, tuple(sorted(group)), kind, w, n_w)
        got = self._syncs.get(key)
        if got is None:
            got = self._syncs[key] = self._sync_time(s, group, kind, w, n_w)
        return got

    def _sync_time(self, s: Strategy, group: tuple[int, ...], kind: str, w: float, n_w: int) -> float:
        pr = self.problem
        t = 0.0
        if s.d > 1 and n_w:
            lat = coll.allreduce_time(self.cluster, 1.0, group)
            t += coll.allreduce_time(self.cluster, w, group) + (n_w - 1) * lat
            if s.zero == 1:
                t += coll.allgather_time(self.cluster, w, group)
        spec = self._specs[kind]
        share = w / (s.d if s.zero >= 1 else 1)
        passes = ADAM_BYTES if pr.optimizer == "adam" else SGD_BYTES
        t += passes * share / (0.8 * spec.memory_bandwidth) + n_w * spec.launch_overhead_s
        return t

    @staticmethod
    def _with(s: Strategy, counts: tuple[int, ...], placement: Sequence[int]) -> Strategy:
        part: tuple[int, ...] | str = (
            "uniform" if counts == uniform_counts(sum(counts), len(counts)) else counts
        )
        place = None if tuple(placement) == tuple(range(len(placement))) else tuple(placement)
        return Strategy(s.d, s.t, s.p, s.k, s.schedule, s.v, s.zero, s.recompute, part, place)


__all__ = ["Estimate", "Problem", "Screen"]
