"""``search``: screen the whole space, anneal placements, simulate the best exactly, rank.

1. **Screen** every strategy of the space (``distir.search.space``) analytically
   (``distir.search.screen``), climbing each base's memory ladder only until it fits, with the
   Megatron placement (TP groups on consecutive GPUs, i.e. inside nodes). Without a pipeline the
   microbatch count is a rung too: a larger k is screened only on the rungs cheaper than the one
   the next smaller k fit on (``_p1_chains``).
2. **Placement** (heterogeneous clusters): the best screened strategies of the leading
   (d, t, p) shapes are annealed over placements that keep TP groups whole
   (``distir.search.placement``), the layer assignment re-optimized for each placement.
3. **Batch shares** (heterogeneous clusters): for the best screened strategies with d > 1, the
   screen proposes uneven batch shares of their replicas (``distir.search.shares``); the
   proposals it finds faster join the screened list.
4. **Exact re-rank**: the ``top`` best that the screen says fit (with pins: the best of each of
   the ``top`` best (d, t, p, k) shapes, so the best of every shape the pins leave is shown; with
   ``explain``, also the best pure-D, pure-T and pure-P strategies, which ``--explain`` compares
   the winner with) are
   distributed and simulated
   (``distir.search.rerank``), in parallel, streaming into the result store
   (``distir.search.store``) so an interrupted search resumes.
5. **Rank** by simulated throughput; out-of-memory strategies (by simulated peak) go last.

With ``workers > 1`` on the local executor, one process pool serves every phase; it starts once
this process has spent ``SearchRequest.pool_after_cpu_s`` CPU-seconds (``executor.LazyPool``: a
search over sooner is cheaper in one process, and workers forked later start with its caches).
From then on the layer profiles the screen will ask for go to it first (``Profiler.prefetch``),
then the exact simulations; the placement searches of the leading shapes run in this process, on
the screen's warm memos (``anneal`` can take a pool). Each worker runs the same code on the same
inputs, so the results are those of a single process, whenever the pool starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, overload

from distir.autodiff.precision import Precision
from distir.frontends.zoo.model import ModelError
from distir.frontends.zoo.registry import ModelSpec, build_model
from distir.gcpause import paused_gc
from distir.hardware.cluster import Cluster, parse_cluster
from distir.ir.dtensor import Placement
from distir.ir.types import DType
from distir.parallel.context_model import context_refusal
from distir.parallel.strategy import Strategy
from distir.parallel.trainers import TrainerError, trainer_allows, trainer_semantics
from distir.search import final
from distir.search.executor import POOL_AFTER_CPU_S, TASK_LOST, LazyPool, lazy_pool, run_all
from distir.search.executor import start as start_task
from distir.search.placement import anneal_placement, megatron_placement
from distir.search.profile import (
    LayerProfile,
    Profiler,
    TrainerForm,
    Wanted,
    allowed_tp,
    has_sequence,
    num_blocks,
    sequence_length,
    trainer_form,
    unit_model,
    unit_models,
)
from distir.search.rerank import ExactJob, Profiles, evaluate, evaluate_seeded
from distir.search.screen import Estimate, Problem, Screen, rank_key
from distir.search.shares import add_shares
from distir.search.space import Pins, Rung, Space, SpaceError
from distir.search.store import ResultStore, dumps, loads, search_key

Progress = Callable[[str, int, int], None]  # (phase, done, total)

STORE_VERSION = 23  # bump when the cost model or the result format changes: old results go stale


def cluster_digest(spec: str | Cluster) -> str:
    """A digest of every figure of the cluster ``spec`` resolves to (devices, links, runtime
    memory, GEMM profiles): equal for equal clusters whatever file or preset names them."""
    return hashlib.sha256(repr(parse_cluster(spec)).encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class SearchRequest:
    model: str = "gpt2-1.6b"
    cluster: str | Cluster = "dgx2-v100"  # a spec (``parse_cluster``) or a Cluster
    batch: int = 512
    train: bool = True
    optimizer: str = "adam"
    dtype: str = "f32"
    precision: str = "pure"  # mixed: compute in ``dtype``, fp32 master weights and optimizer state
    pins: Pins = field(default_factory=Pins)
    top: int = 8
    workers: int = 1
    executor: str = "local"
    store: Path | None = None
    anneal_iters: int = 400
    # a placement search ends early once this many steps in a row found no better placement
    # (``anneal_placement``'s ``patience``); None walks all ``anneal_iters``. Off by default: on
    # heterogeneous clusters a walk can improve 100-230 steps after its last improvement
    anneal_patience: int | None = None
    anneal_top: int = 4
    explain: bool = False
    # the model's tensor-parallel placements: declared, or auto (found by Automap, ``resolve_layout``)
    tp_layout: str = "declared"
    tp_found: tuple[tuple[str, Placement], ...] = ()  # auto: per weight, the placement found
    # plans with sequence parallelism costed with tensor-parallel collectives overlapping their
    # GEMMs, in the screen's layer profiles and the exact phase (Megatron-LM's
    # ``--tp-comm-overlap``, which requires sequence parallelism: ``RooflineCostModel.tp_comm_overlap``)
    tp_comm_overlap: bool = False
    # with ``workers`` > 1 on the local executor: the CPU-seconds this process spends before the
    # pool starts (``executor.POOL_AFTER_CPU_S``); the results are the same whenever it starts
    pool_after_cpu_s: float = POOL_AFTER_CPU_S
    # whose semantics the plans run with (``distir.parallel.trainers``): the space holds what the
    # trainer runs, the screen and the exact phase cost its switches, kernels and model options
    trainer: str = "distir"

    def spec(self) -> ModelSpec:
        """The model spec searched at t = 1: the model string's with the trainer's options
        (``trainer_form``) and the found placements (auto)."""
        return self.form(parse_cluster(self.cluster))[0]

    def form(self, cluster: Cluster) -> tuple[ModelSpec, TrainerForm]:
        """``trainer_form`` of the request on ``cluster`` (its resolved ``cluster``)."""
        return trainer_form(self.model, self.trainer, cluster, self.tp_found)

    def key_parts(self) -> dict[str, Any]:
        """What the search's results depend on, as the store's key: distir's version and the
        cost model's (``STORE_VERSION``), the request, the cluster's resolved figures (not the
        name of its file: a TOML file edited between two searches is a new search, and two files
        of equal figures are one), the contents of the files the model string reads
        (``content_digest``: an edited Hugging Face config is a new search) and, for an Automap
        search, the layout it found."""
        from distir import __version__ as distir_version
        from distir.frontends.torch_import.source import content_digest

        layout = (
            {"tp_layout": self.tp_layout, "tp_found": [[n, str(p)] for n, p in self.tp_found]}
            if self.tp_layout != "declared"
            else {}
        )
        return layout | {
            "version": STORE_VERSION,
            "distir": distir_version,
            "model": self.model,
            "model_files": content_digest(self.model),
            "cluster_figures": cluster_digest(self.cluster),
            "batch": self.batch,
            "train": self.train,
            "optimizer": self.optimizer,
            "dtype": self.dtype,
            "precision": self.precision,
            "tp_comm_overlap": self.tp_comm_overlap,
            "trainer": self.trainer,
        }


@dataclass
class SearchOutput:
    request: SearchRequest
    cluster: Cluster
    results: list[dict[str, Any]]  # exact, best first
    screened: list[Estimate]  # every screened strategy, best first
    n_screened: int
    timings: dict[str, float]
    n_cached: int = 0
    profiles: int = 0
    from_store: bool = False  # re-rendered from the store: ``timings`` are the original search's
    advice: list[str] = field(default_factory=list)  # when nothing fits: what would (``advice``)

    def best(self) -> dict[str, Any] | None:
        return self.results[0] if self.results else None


def heterogeneous(cluster: Cluster) -> bool:
    return cluster.has_matrices or len({n.name for n in cluster.nodes}) > 1


def build_space(req: SearchRequest, cluster: Cluster) -> Space:
    """The space ``req`` searches on ``cluster``."""
    spec = req.form(cluster)[0]
    dt = DType.parse(req.dtype)
    node = min(n.devices_per_node for n in cluster.nodes)
    return Space(
        cluster.num_devices,
        req.batch,
        num_blocks(spec, dt, req.train),
        # TP stays inside a node (its collectives run every layer; across a network they never
        # pay off), unless the user pins a larger --tp
        tuple(allowed_tp(spec, dt, req.pins.tp or node)),
        req.train,
        req.pins,
        node,  # HSDP shards within a node
        sequence_length(spec, dt),
        has_sequence(spec),
        context_refusal(unit_model(spec, dt)),
    )


def screen_space(
    req: SearchRequest,
    cluster: Cluster,
    progress: Progress | None = None,
    pool: Executor | LazyPool | None = None,
) -> tuple[list[Estimate], int, Screen]:
    """Every base strategy, each up its memory ladder until it fits (module docstring). With a
    ``pool``, the profiles of each rung are computed there (``Profiler.prefetch``) while this
    process screens; a ``LazyPool`` takes them from when it starts, first those of every rung
    queued and not screened yet. The estimates are the same."""
    spec, form = req.form(cluster)
    mixed = req.precision == "mixed"
    prof = Profiler(
        spec,
        cluster,
        DType.parse(req.dtype),
        req.train,
        mixed=mixed,
        tp_comm_overlap=req.tp_comm_overlap,
        form=form,
    )
    screen = Screen(prof, Problem(req.batch, req.train, req.optimizer, mixed, req.trainer))
    space = build_space(req, cluster)
    space.check()
    bases = list(space.bases())
    _check_tp_comm_overlap(req.tp_comm_overlap, bases)
    ident = megatron_placement(cluster.num_devices, 1, 1, cluster.num_devices)
    ladders = _trainer_ladders(req, space, bases)
    # rung by rung: the bases that did not fit climb together after the others, and the profiles
    # of a base's next rung go to the workers the moment it does not fit (rather than being
    # computed here, later, while they wait); the estimates are the same, listed in the order of
    # a base-by-base climb. Without a pipeline the microbatch is one more rung (``_p1_chains``).
    got: list[tuple[int, int, Estimate]] = []
    # a chain's next base (``_p1_chains``) and, once it starts, how many rungs it may climb
    after = {a: b for chain in _p1_chains(bases) for a, b in itertools.pairwise(chain)}
    waiting = set(after.values())
    climbing = [(i, len(ladder)) for i, ladder in enumerate(ladders) if ladder and i not in waiting]
    done = len(bases) - len(climbing) - len(waiting)
    blocks: dict[int, list[list[int]]] = {}  # ``_rung_profiles``' memo
    rung = {i: 0 for i, _ in climbing}
    queued: dict[int, None] = dict.fromkeys(i for i, _ in climbing)  # rungs to screen, in order
    handed = False  # whether the pool has taken the queued rungs' profiles

    def prefetch(bases_at: Iterable[int]) -> None:
        """Hand the profiles of the current rungs of ``bases_at`` to the pool, if it is up; the
        first time it is, those of every queued rung with them."""
        nonlocal handed
        now = pool.get() if isinstance(pool, LazyPool) else pool
        if now is None:
            return
        at = list(bases_at) if handed else [*queued, *bases_at]
        handed = True
        prof.prefetch(now, _rung_profiles(screen, [ladders[i][rung[i]] for i in at], req.batch, blocks))

    prefetch(())
    while climbing:
        still: list[tuple[int, int]] = []
        for i, limit in climbing:
            r = rung[i]
            queued.pop(i, None)
            prefetch(())  # a lazy pool may start here: then it takes every queued rung
            e = screen.estimate(ladders[i][r], ident)
            got.append((i, r, e))
            if not e.fits and r + 1 < limit:
                still.append((i, limit))
                rung[i] = r + 1
                queued[i] = None
                prefetch([i])
                continue
            done += 1
            j = after.get(i)
            limit = r if e.fits else limit  # the next k without a pipeline: the rungs below this one
            while j is not None:
                limit = min(limit, len(ladders[j]))
                if limit > 0:
                    still.append((j, limit))
                    rung[j] = 0
                    queued[j] = None
                    prefetch([j])
                    break
                done += 1  # nothing cheaper to try: neither for any larger k
                j = after.get(j)
            if progress is not None:
                progress("screen", done, len(bases))
        climbing = still
    got.sort(key=lambda x: x[:2])
    out = [e for *_, e in got]
    n = len(out)
    out.sort(key=rank_key)
    return out, n, screen


def _check_tp_comm_overlap(asked: bool, bases: list[Strategy]) -> None:
    """``--tp-comm-overlap`` over a space without sequence parallelism would change nothing:
    refused, not ignored."""
    if asked and not any(b.sp for b in bases):
        raise SpaceError(
            "--tp-comm-overlap pipelines sequence parallelism's AllGather/ReduceScatter with the GEMMs; "
            "no strategy searched has sequence parallelism (it needs t > 1 and a model with a sequence dim)"
        )


def _trainer_ladders(req: SearchRequest, space: Space, bases: list[Strategy]) -> Sequence[Sequence[Strategy]]:
    """Each base's memory ladder (``Space.ladder``) with the rungs ``req``'s trainer runs
    (``trainer_allows``). A space of which the trainer runs nothing is a ``SpaceError`` giving
    the reason it gives most often. distir's own trainer runs every rung: its ladders are the
    space's, each rung's strategy made when the screen climbs to it (``_Ladder``: most bases fit
    on their first rung, so most rungs are never made)."""
    if req.trainer == "distir":
        return [_Ladder(base, space.rungs(base)) for base in bases]
    prec, dt = Precision.parse(req.precision), DType.parse(req.dtype)
    full = [space.ladder(base) for base in bases]
    ladders = [[s for s in ladder if trainer_allows(req.trainer, s, prec, dt, req.train)] for ladder in full]
    if any(full) and not any(ladders):
        reasons: Counter[str] = Counter()
        for s in (s for ladder in full for s in ladder):
            try:
                trainer_semantics(req.trainer, s, prec, dt, None, req.train)
            except TrainerError as e:
                reasons[str(e).removeprefix(f"{s}: ")] += 1
        why = reasons.most_common(1)[0][0]
        raise SpaceError(f"--trainer {req.trainer} runs none of the strategies searched: {why}")
    return ladders


class _Ladder(Sequence[Strategy]):
    """``Space.ladder(base)`` whose strategies are made when first asked for (``Space.rungs``):
    the same strategies, in the same order."""

    def __init__(self, base: Strategy, rungs: list[Rung]) -> None:
        self._base = base
        self._rungs = rungs
        self._made: dict[int, Strategy] = {}

    def __len__(self) -> int:
        return len(self._rungs)

    @overload
    def __getitem__(self, r: int) -> Strategy: ...
    @overload
    def __getitem__(self, r: slice) -> list[Strategy]: ...
    def __getitem__(self, r: int | slice) -> Strategy | list[Strategy]:
        if isinstance(r, slice):
            return [self[i] for i in range(*r.indices(len(self._rungs)))]
        got = self._made.get(r)
        if got is None:
            got = self._made[r] = self._rungs[r].of(self._base)
        return got


def _p1_chains(bases: list[Strategy]) -> list[list[int]]:
    """The bases without a pipeline, by (d, t, sp, schedule), as indices in order of growing k.
    Without a pipeline, more microbatches only save memory (smaller GEMMs, more ZeRO-3 gathers
    and gradient additions per step): after a k fits on some rung of the ladder, a larger k is
    screened only on the cheaper rungs (``screen_space``)."""
    chains: dict[tuple[int, int, int, bool, str], list[int]] = {}
    for i, b in enumerate(bases):
        if b.p == 1:
            chains.setdefault((b.d, b.t, b.c, b.sp, b.schedule), []).append(i)
    for chain in chains.values():
        chain.sort(key=lambda i: bases[i].k)
    return list(chains.values())


def _rung_profiles(
    screen: Screen, rungs: list[Strategy], batch: int, kinds: dict[int, list[list[int]]]
) -> Iterator[Wanted]:
    """Every profile the strategies ``rungs`` ask for on the identity placement, in the order
    the screen asks: there a stage's TP groups are the aligned blocks of t GPUs, and the stages
    cover the cluster, so every kind of block is asked for (one block of each kind stands for it).
    ``kinds``: per t, those blocks (a memo the caller keeps across calls)."""
    for s in rungs:
        b, rem = divmod(batch, s.d * s.k)
        if rem or b < 1:
            continue
        if s.t not in kinds:
            reps: dict[tuple[object, ...], list[int]] = {}
            for g in range(0, screen.cluster.num_devices - s.t + 1, s.t):
                block = list(range(g, g + s.t))
                reps.setdefault(screen.profiler.group_key(block), block)
            kinds[s.t] = list(reps.values())
        for block in kinds[s.t]:
            yield Wanted(s.t, b, s.recompute, block, s.sp)


@dataclass(frozen=True)
class _AnnealTask:
    """One placement search, for a worker process (``_anneal_task``); picklable."""

    request: SearchRequest
    cluster: Cluster
    problem: Problem
    profiles: dict[tuple[object, ...], list[LayerProfile]]  # what the estimates need
    base: Strategy
    start: tuple[int, ...]
    seed: int


def _placement_cost(screen: Screen, base: Strategy) -> Callable[[tuple[int, ...]], float]:
    """What the placement search minimizes: the step time, out-of-memory placements far behind."""

    def cost(pl: tuple[int, ...]) -> float:
        step, fits, headroom = screen.placement_cost(base, pl)
        return step if fits else step * 10 - headroom

    return cost


def _anneal(
    screen: Screen, base: Strategy, start: tuple[int, ...], req: SearchRequest, seed: int
) -> tuple[tuple[int, ...], float]:
    cost = _placement_cost(screen, base)
    return anneal_placement(
        base.d,
        base.t,
        base.p,
        cost,
        start=start,
        iters=req.anneal_iters,
        seed=seed,
        patience=req.anneal_patience,
    )


def _anneal_task(task: _AnnealTask) -> tuple[tuple[int, ...], float]:
    """``_anneal`` in a worker, on a screen seeded with the main process's profiles."""
    req = task.request
    spec, form = req.form(task.cluster)
    prof = Profiler(
        spec,
        task.cluster,
        DType.parse(req.dtype),
        req.train,
        mixed=req.precision == "mixed",
        tp_comm_overlap=req.tp_comm_overlap,
        form=form,
    )
    prof.adopt(task.profiles)
    return _anneal(Screen(prof, task.problem), task.base, task.start, req, task.seed)


def anneal_picks(req: SearchRequest, screened: list[Estimate]) -> list[int]:
    """Indices of the estimates the placement search improves: the best fitting one of each of the
    ``req.anneal_top`` leading (d, t, p) shapes."""
    seen: set[tuple[int, int, int]] = set()
    picks: list[int] = []
    for i, e in enumerate(screened):
        s = e.strategy
        if (s.d, s.t, s.p) not in seen and e.fits and s.c == 1:  # the annealer places d·t·p GPUs
            seen.add((s.d, s.t, s.p))
            picks.append(i)
        if len(picks) >= req.anneal_top:
            break
    return picks


def anneal(
    req: SearchRequest,
    screen: Screen,
    screened: list[Estimate],
    progress: Progress | None,
    pool: Executor | None = None,
    picks: list[int] | None = None,
    then: Callable[[], object] | None = None,
) -> None:
    """Replace the estimates of ``picks`` (default ``anneal_picks``) by annealed placements, in
    place, and re-sort. With a ``pool``, the searches run there side by side, the longest (most
    pipeline stages) first; each is deterministic, so the results are the same. ``then`` is called
    once the searches are under way (e.g. to queue other work on the pool behind them)."""
    if picks is None:
        picks = anneal_picks(req, screened)
    jobs: list[tuple[int, Strategy, tuple[int, ...]]] = []
    for i in picks:
        s = screened[i].strategy
        jobs.append((i, replace(s, partition="uniform", placement=None), s.gpus))
    futures: dict[int, Future[tuple[tuple[int, ...], float]]] = {}
    if pool is not None and len(jobs) > 1:
        for n in sorted(range(len(jobs)), key=lambda n: -jobs[n][1].p):
            _, base, start = jobs[n]
            b = req.batch // (base.d * base.k)
            profiles = screen.profiler.known(base.t, b, base.recompute, base.sp)
            task = _AnnealTask(req, screen.cluster, screen.problem, profiles, base, start, n)
            futures[n] = pool.submit(_anneal_task, task)
    if then is not None:
        then()
    for n, (i, base, start) in enumerate(jobs):
        got = None
        if n in futures:
            try:
                got = futures[n].result()
            except TASK_LOST:  # a dead worker or a stopped pool: search here instead
                got = None
        pl, c = got if got is not None else _anneal(screen, base, start, req, n)
        if c < screened[i].step_time_s:
            screened[i] = screen.estimate(base, pl)
        if progress is not None:
            progress("placement", n + 1, len(jobs))
    screened.sort(key=rank_key)


def is_pure(d: int, t: int, p: int, axis: str) -> bool:
    """Whether (d, t, p) uses only the parallelism ``axis`` ("d", "t" or "p")."""
    return {"d": (t, p), "t": (d, p), "p": (d, t)}[axis] == (1, 1)


def pure_bests(screened: list[Estimate]) -> list[Strategy]:
    """The best pure-D, pure-T and pure-P strategies (the best fitting one, else the best), in that
    order, where the space has them."""
    out: list[Strategy] = []
    for axis in ("d", "t", "p"):
        cands = [
            e
            for e in screened
            if e.strategy.c == 1 and is_pure(e.strategy.d, e.strategy.t, e.strategy.p, axis)
        ]
        best = next((e for e in cands if e.fits), cands[0] if cands else None)
        if best is not None:
            out.append(best.strategy)
    return out


def pick_exact(
    screened: list[Estimate], top: int, pure: bool = False, by_shape: bool = False
) -> list[Strategy]:
    """The ``top`` best fitting estimates (the best ones if none fits); with ``by_shape`` (a
    pinned search), the best of each of the ``top`` best (d, t, p, k) shapes instead, so that
    every microbatch size the pins leave is simulated, not only the screen's favourite; with
    ``pure``, also the best pure-D, pure-T and pure-P ones."""
    fitting = [e for e in screened if e.fits] or screened
    chosen: list[Strategy] = []
    shapes: set[tuple[int, int, int, int]] = set()
    for e in fitting:
        if len(chosen) >= top:
            break
        s = e.strategy
        if by_shape and (s.d, s.t, s.p, s.k) in shapes:
            continue
        shapes.add((s.d, s.t, s.p, s.k))
        chosen.append(s)
    for s in pure_bests(screened) if pure else ():
        if s not in chosen:
            chosen.append(s)
    return chosen


def _exact_profiles(screen: Screen, strategies: list[Strategy], batch: int) -> Profiles:
    """The layer profiles the screen holds that the exact simulations of ``strategies`` time
    their chunks with (``chunk_times``: at the even per-replica microbatch), for the processes
    that run them (``evaluate_seeded``): none is profiled twice."""
    out: Profiles = {}
    for s in strategies:
        out.update(screen.profiler.known(s.t, max(1, batch // (s.d * s.k)), s.recompute, s.sp))
    return out


def _exact_order(strategies: list[Strategy]) -> list[str]:
    """The exact simulations, longest first (more microbatch chunks: a longer program), so that the
    workers finish together."""
    return [str(s) for s in sorted(strategies, key=lambda s: (-s.k * s.v, -s.p))]


def search(req: SearchRequest, progress: Progress | None = None) -> SearchOutput:
    """Run a search (module docstring); a finished one with the same view comes from the store
    (``distir.search.final``), nothing screened or simulated (``SearchOutput.from_store``)."""
    req = resolve_layout(req)
    _check_splittable(req)
    if req.store is not None:
        stored = _stored_output(req)
        if stored is not None:
            return stored
    parallel = req.workers > 1 and req.executor == "local"
    # a search allocates caches (layer shardings, plans, op records, screen memos) that live until
    # it ends and makes almost no cyclic garbage: the collector only walks them, again and again
    # (10-15% of AMP's searches); its pool's workers likewise (``executor.new_pool``)
    # the model at one sample is built once (``unit_models``), before the pool's workers fork
    # the pool starts once this process has spent ``req.pool_after_cpu_s`` CPU-seconds: a small
    # search is cheaper in one process (``executor.POOL_AFTER_CPU_S``)
    pooled = lazy_pool(req.workers, req.pool_after_cpu_s) if parallel else contextlib.nullcontext()
    with paused_gc(promote=True), unit_models(), pooled as pool:
        return _search(req, progress, pool)


def _check_splittable(req: SearchRequest) -> None:
    """A model file whose layers fix the batch (``Model.fixed_batch``) cannot be searched: the
    screen costs each replica's share of the batch, which such layers do not run."""
    from distir.frontends.files import is_model_file

    if not is_model_file(req.model):
        return
    model = build_model(req.model, batch=req.batch, dtype=DType.parse(req.dtype))
    if model.fixed_batch is not None:
        raise ModelError(
            f"{req.model}: its layers fix the batch at {model.fixed_batch} ({model.fixed_by}), so the "
            f"search cannot split it over replicas or microbatches ({model.fixed_advice}); simulate a "
            "strategy with k=1 instead (distir simulate)"
        )


def resolve_layout(req: SearchRequest) -> SearchRequest:
    """``req`` with ``tp_layout`` auto resolved: the placements Automap finds for the model (as
    the trainer runs it under tensor parallelism) on one tensor-parallel group
    (``distir.search.automap.command.search_layout``), which every
    strategy of the search then declares; ``req`` itself when declared or already resolved."""
    if req.tp_layout == "declared" or req.tp_found:
        return req
    from distir.search.automap.command import search_layout

    cluster = parse_cluster(req.cluster)
    one, form = trainer_form(req.model, req.trainer, cluster)  # the model the trainer shards
    found = search_layout(
        form.spec_at(one, 2),
        req.tp_layout,
        cluster,
        batch=req.batch,
        dtype=DType.parse(req.dtype),
        tp=req.pins.tp,
        optimizer=req.optimizer,
    )
    return replace(req, tp_found=found)


def _search(req: SearchRequest, progress: Progress | None, pool: LazyPool | None) -> SearchOutput:
    from distir.frontends.torch_import.source import content_digest

    t0, c0 = time.perf_counter(), time.process_time()
    cluster = parse_cluster(req.cluster)
    screened, n, screen = screen_space(req, cluster, progress, pool)
    t1, c1 = time.perf_counter(), time.process_time()
    profiled = (screen.profiler.cpu_s, screen.profiler.shard_cpu_s)  # the screen's share
    picks = anneal_picks(req, screened) if heterogeneous(cluster) and req.anneal_iters > 0 else []
    # the resolved cluster, not its spec: a worker or a later search in this process never reads
    # a file edited since (``rerank`` caches by the job's fields)
    job = ExactJob(
        req.model,
        cluster,
        req.batch,
        req.train,
        req.optimizer,
        req.dtype,
        req.precision,
        tp=req.tp_found,
        model_files=content_digest(req.model),
        tp_comm_overlap=req.tp_comm_overlap,
        trainer=req.trainer,
    )
    fn = functools.partial(evaluate, job)
    store_cm = (
        ResultStore(req.store, search_key(req.key_parts()), req.key_parts())
        if req.store is not None
        else contextlib.nullcontext()
    )
    with store_cm as store:
        done = set(store.done()) if store is not None else set()
        started: dict[str, Future[dict[str, Any]]] = {}

        def start_early() -> None:
            """The best pure strategies of shapes the placement search leaves alone are simulated
            whatever it finds (``pick_exact`` with ``explain``): start them now, beside (behind) it."""
            moved = {(screened[i].strategy.d, screened[i].strategy.t, screened[i].strategy.p) for i in picks}
            now = pool.get() if pool is not None else None
            for s in pure_bests(screened) if req.explain else ():
                if now is not None and (s.d, s.t, s.p) not in moved and str(s) not in done:
                    started[str(s)] = start_task(now, fn, str(s))

        if picks:
            # here, not on the workers: a worker's screen starts cold and rebuilds the stage
            # rows this one holds from screening (AMP's heterogeneous search: 0.26 CPU-s there
            # against 0.18 here for its four placement searches)
            anneal(req, screen, screened, progress, None, picks, then=start_early)
        c_anneal = time.process_time()
        if heterogeneous(cluster) and req.trainer == "distir":  # no trainer runs uneven shares
            # the proposals count as screened
            n += add_shares(screen, screened, pool=pool.get() if pool is not None else None)
        t2, c2 = time.perf_counter(), time.process_time()
        chosen = pick_exact(screened, req.top, pure=req.explain, by_shape=req.pins.pinned)
        tasks = [str(s) for s in chosen]
        cached = len(done & set(tasks))
        # in the store or not, in parallel on the requested workers (a lazy pool: from when it starts)
        results = _run_exact(
            req,
            _exact_order(chosen),
            functools.partial(evaluate_seeded, job, _exact_profiles(screen, chosen, req.batch)),
            store,
            pool,
            progress,
            started,
        )
        t3, c3 = time.perf_counter(), time.process_time()
        for task in tasks:  # a stored one may have been edited by hand
            final.check_result(
                results[task], f"{req.store}: search {store.key if store else ''}: result of {task!r}"
            )
        out = _output(req, cluster, tasks, results, screened, n, screen.profiler.probes, cached)
        failed = [r for r in out.results if "error" in r]
        if failed and len(failed) == len(out.results):  # no memory to advise on: say why
            out.advice = [
                f"every exact simulation failed; the first, {failed[0]['strategy']}: {failed[0]['error']}"
            ]
        elif not any(r.get("fits") for r in out.results):
            out.advice = _advice(req, screen, screened)
        out.timings.update(_timings((t0, t1, t2, t3), (c0, c1, c_anneal, c2, c3), profiled, screen))
        if store is not None:
            store.put_final(_final_payload(req, out))
    return out


def _timings(
    wall: tuple[float, float, float, float],
    cpu: tuple[float, float, float, float, float],
    profiled: tuple[float, float],
    screen: Screen,
) -> dict[str, float]:
    """A search's timings: ``wall`` clock at its start and at the end of its screen, of its
    placement search and batch shares, and of its exact phase; this process's ``cpu`` time at its
    start, at the end of the screen, of the placement search, of the batch shares and of the
    exact phase; what the screen's profiler spent (``profiled``: all, sharding)."""
    t0, t1, t2, t3 = wall
    c0, c1, c_anneal, c2, c3 = cpu
    return {
        "screen_s": t1 - t0,
        "screen_cpu_s": c1 - c0,  # this process's CPU time: a busy machine inflates only screen_s
        "screen_worker_cpu_s": screen.profiler.worker_cpu_s,  # profiles computed by workers
        # this process's CPU time by part: the layer profiles it computed in the screen (the
        # sharding among them), the placement search, the batch shares (their profiles
        # included) and the exact phase (not the workers' share of it)
        "screen_profile_cpu_s": profiled[0],
        "screen_shard_cpu_s": profiled[1],
        "anneal_cpu_s": c_anneal - c1,
        "shares_cpu_s": c2 - c_anneal,
        "exact_cpu_s": c3 - c2,
        "placement_s": t2 - t1,
        "simulate_s": t3 - t2,
        "total_s": t3 - t0,
    }


def _run_exact(
    req: SearchRequest,
    tasks: list[str],
    fn: Callable[[str], dict[str, Any]],
    store: ResultStore | None,
    pool: LazyPool | None,
    progress: Progress | None,
    started: dict[str, Future[dict[str, Any]]],
) -> dict[str, dict[str, Any]]:
    """``run_all`` of the exact simulations ``tasks``: on ``req``'s executor and workers, or with
    a lazy pool, here one by one until the pool starts (``LazyPool.get``), then on it. The
    results are the same."""
    total = len(dict.fromkeys(tasks))

    def report(base: int) -> Callable[[int, int], None] | None:
        return (lambda d, _t: progress("simulate", base + d, total)) if progress is not None else None

    if pool is None:
        return run_all(
            tasks, fn, store, workers=req.workers, executor=req.executor, progress=report(0), started=started
        )
    results: dict[str, dict[str, Any]] = {}
    rest = list(dict.fromkeys(tasks))
    while rest:
        now = pool.get()
        if now is not None:
            results |= run_all(
                rest, fn, store, workers=req.workers, progress=report(len(results)), pool=now, started=started
            )
            break
        results |= run_all(rest[:1], fn, store, progress=report(len(results)))
        rest = rest[1:]
    return {task: results[task] for task in tasks}


def _advice(req: SearchRequest, screen: Screen, screened: list[Estimate]) -> list[str]:
    """Nothing fits: the smallest changes that would, in words (``distir.search.advice``)."""
    from distir.search.advice import advice_lines, advise

    p = req.pins
    pinned = {
        o
        for o, v in (("--zero", p.zero), ("--recompute", p.recompute), ("--microbatches", p.k))
        if v is not None
    }
    return advice_lines(screened, advise(req.cluster, screen, screened), pinned)


def _output(
    req: SearchRequest,
    cluster: Cluster,
    tasks: list[str],
    results: dict[str, dict[str, Any]],
    screened: list[Estimate],
    n: int,
    profiles: int,
    cached: int,
) -> SearchOutput:
    """The exact results of ``tasks`` with their screen figures, ranked (module docstring, 4)."""
    est = {str(e.strategy): e for e in screened}
    rows: list[dict[str, Any]] = []
    for task in tasks:
        r = dict(results[task])
        e = est.get(task)
        if e is not None:
            r["screen_step_time_s"] = e.step_time_s
            r["screen_peak_memory_bytes"] = e.peak_memory_bytes
        rows.append(r)
    ok = [r for r in rows if "error" not in r]
    ok.sort(key=lambda r: (not r["fits"], -r["throughput"]))
    errors = [r | {"strategy": t} for t, r in zip(tasks, rows, strict=True) if "error" in r]
    return SearchOutput(req, cluster, ok + errors, screened, n, {}, n_cached=cached, profiles=profiles)


def view_of(req: SearchRequest) -> dict[str, Any]:
    """What of the request, beyond the store's key, decides the output (``distir.search.final``),
    as it reads back from the store (JSON: tuples as lists)."""
    view = {
        "pins": dataclasses.asdict(req.pins),
        "top": req.top,
        "explain": req.explain,
        "anneal_iters": req.anneal_iters,
        "anneal_patience": req.anneal_patience,
        "anneal_top": req.anneal_top,
    }
    plain: dict[str, Any] = loads(dumps(view))
    return plain


def _final_payload(req: SearchRequest, out: SearchOutput) -> dict[str, Any]:
    return {
        "format": final.FORMAT,
        "view": view_of(req),
        "results": out.results,
        "screened": final.estimates_plain(out.screened),
        "n_screened": out.n_screened,
        "timings": out.timings,
        "profiles": out.profiles,
        "advice": out.advice,
    }


def _stored_output(req: SearchRequest) -> SearchOutput | None:
    """The stored output of this very search, if finished with the same view."""
    assert req.store is not None
    t0 = time.perf_counter()
    with ResultStore(req.store, search_key(req.key_parts()), req.key_parts()) as store:
        payload = store.final()
    if payload is None or not final.view_matches(payload, view_of(req)):
        return None
    got = final.output_from_plain(payload, f"{req.store}: search {search_key(req.key_parts())}")
    timings = dict(got.timings, render_s=time.perf_counter() - t0)
    cluster = parse_cluster(req.cluster)
    return SearchOutput(
        req,
        cluster,
        got.results,
        got.screened,
        got.n_screened,
        timings,
        n_cached=len(got.results),
        profiles=got.profiles,
        from_store=True,
        advice=got.advice,
    )


__all__ = [
    "SearchOutput",
    "SearchRequest",
    "anneal_picks",
    "build_space",
    "heterogeneous",
    "pick_exact",
    "pure_bests",
    "screen_space",
    "search",
    "view_of",
]
