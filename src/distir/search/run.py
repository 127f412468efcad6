"""``search``: screen the whole space, anneal placements, simulate the best exactly, rank.

1. **Screen** every strategy of the space (``distir.search.space``) analytically
   (``distir.search.screen``), climbing each base's memory ladder only until it fits, with the
   Megatron placement (TP groups on consecutive GPUs, i.e. inside nodes).
2. **Placement** (heterogeneous clusters): the best screened strategies of the leading
   (d, t, p) shapes are annealed over placements that keep TP groups whole
   (``distir.search.placement``), the layer assignment re-optimized for each placement.
3. **Exact re-rank**: the ``top`` best that the screen says fit, plus the best pure-D, pure-T and
   pure-P strategies (for ``--explain``), are distributed and simulated
   (``distir.search.rerank``), in parallel, streaming into the result store
   (``distir.search.store``) so an interrupted search resumes.
4. **Rank** by simulated throughput; out-of-memory strategies (by simulated peak) go last.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from distir.frontends.zoo.registry import parse_model_string
from distir.hardware.cluster import Cluster, parse_cluster
from distir.ir.types import DType
from distir.parallel.strategy import Strategy
from distir.search.executor import run_all
from distir.search.placement import anneal_placement, megatron_placement
from distir.search.profile import Profiler, allowed_tp, num_layers
from distir.search.rerank import ExactJob, evaluate
from distir.search.screen import Estimate, Problem, Screen
from distir.search.space import Pins, Space
from distir.search.store import ResultStore, search_key

Progress = Callable[[str, int, int], None]  # (phase, done, total)

STORE_VERSION = 1  # bump when the cost model or the result format changes: old results go stale


@dataclass(frozen=True)
class SearchRequest:
    model: str = "gpt2-1.6b"
    cluster: str = "dgx2-v100"
    batch: int = 512
    train: bool = True
    optimizer: str = "adam"
    dtype: str = "f32"
    pins: Pins = field(default_factory=Pins)
    top: int = 8
    workers: int = 1
    executor: str = "local"
    store: Path | None = None
    anneal_iters: int = 400
    anneal_top: int = 4
    explain: bool = False

    def key_parts(self) -> dict[str, Any]:
        return {
            "version": STORE_VERSION,
            "model": self.model,
            "cluster": self.cluster,
            "batch": self.batch,
            "train": self.train,
            "optimizer": self.optimizer,
            "dtype": self.dtype,
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

    def best(self) -> dict[str, Any] | None:
        return self.results[0] if self.results else None


def heterogeneous(cluster: Cluster) -> bool:
    return cluster.has_matrices or len({n.name for n in cluster.nodes}) > 1


def _rank_key(e: Estimate) -> tuple[bool, float]:
    return (not e.fits, e.step_time_s if e.fits else -e.memory_headroom)


def screen_space(
    req: SearchRequest, cluster: Cluster, progress: Progress | None = None
) -> tuple[list[Estimate], int, Screen]:
    """Every base strategy, each up its memory ladder until it fits (module docstring)."""
    spec = parse_model_string(req.model)
    dt = DType.parse(req.dtype)
    prof = Profiler(spec, cluster, dt, req.train)
    screen = Screen(prof, Problem(req.batch, req.train, req.optimizer))
    space = Space(
        cluster.num_devices,
        req.batch,
        num_layers(spec, dt, req.train),
        # TP stays inside a node (its collectives run every layer; across a network they never
        # pay off), unless the user pins a larger --tp
        tuple(allowed_tp(spec, dt, req.pins.tp or min(n.devices_per_node for n in cluster.nodes))),
        req.train,
        req.pins,
    )
    space.check()
    bases = list(space.bases())
    out: list[Estimate] = []
    n = 0
    ident = megatron_placement(cluster.num_devices, 1, 1, cluster.num_devices)
    for i, base in enumerate(bases):
        for s in space.ladder(base):
            n += 1
            e = screen.estimate(s, ident)
            out.append(e)
            if e.fits:
                break
        if progress is not None:
            progress("screen", i + 1, len(bases))
    out.sort(key=_rank_key)
    return out, n, screen


def anneal(req: SearchRequest, screen: Screen, screened: list[Estimate], progress: Progress | None) -> None:
    """Replace the leading shapes' best estimates by annealed placements (in place)."""
    seen: set[tuple[int, int, int]] = set()
    picks: list[int] = []
    for i, e in enumerate(screened):
        s = e.strategy
        if (s.d, s.t, s.p) not in seen and e.fits:
            seen.add((s.d, s.t, s.p))
            picks.append(i)
        if len(picks) >= req.anneal_top:
            break
    for n, i in enumerate(picks):
        s = screened[i].strategy
        base = replace(s, partition="uniform", placement=None)

        def cost(pl: tuple[int, ...], base: Strategy = base) -> float:
            e = screen.estimate(base, pl)
            return e.step_time_s if e.fits else e.step_time_s * 10 - e.memory_headroom

        start = s.placement or tuple(range(s.devices))
        pl, c = anneal_placement(s.d, s.t, s.p, cost, start=start, iters=req.anneal_iters, seed=n)
        if c < screened[i].step_time_s:
            screened[i] = screen.estimate(base, pl)
        if progress is not None:
            progress("placement", n + 1, len(picks))
    screened.sort(key=_rank_key)


def is_pure(d: int, t: int, p: int, axis: str) -> bool:
    """Whether (d, t, p) uses only the parallelism ``axis`` ("d", "t" or "p")."""
    return {"d": (t, p), "t": (d, p), "p": (d, t)}[axis] == (1, 1)


def pick_exact(screened: list[Estimate], top: int) -> list[Strategy]:
    """The ``top`` best fitting estimates, and the best pure-D, pure-T and pure-P ones."""
    fitting = [e for e in screened if e.fits] or screened
    chosen: list[Strategy] = [e.strategy for e in fitting[:top]]
    for axis in ("d", "t", "p"):
        cands = [e for e in screened if is_pure(e.strategy.d, e.strategy.t, e.strategy.p, axis)]
        best = next((e for e in cands if e.fits), cands[0] if cands else None)
        if best is not None and best.strategy not in chosen:
            chosen.append(best.strategy)
    return chosen


def search(req: SearchRequest, progress: Progress | None = None) -> SearchOutput:
    """Run a search (module docstring)."""
    t0, c0 = time.perf_counter(), time.process_time()
    cluster = parse_cluster(req.cluster)
    screened, n, screen = screen_space(req, cluster, progress)
    t1, c1 = time.perf_counter(), time.process_time()
    if heterogeneous(cluster) and req.anneal_iters > 0:
        anneal(req, screen, screened, progress)
    t2 = time.perf_counter()
    chosen = pick_exact(screened, req.top)
    job = ExactJob(req.model, req.cluster, req.batch, req.train, req.optimizer, req.dtype)
    fn = functools.partial(evaluate, job)
    tasks = [str(s) for s in chosen]
    cached = 0

    def run(store: ResultStore | None) -> dict[str, dict[str, Any]]:
        return run_all(
            tasks,
            fn,
            store,
            workers=req.workers,
            executor=req.executor,
            progress=(lambda d, t: progress("simulate", d, t)) if progress else None,
        )

    if req.store is not None:
        with ResultStore(req.store, search_key(req.key_parts()), req.key_parts()) as store:
            cached = len(set(store.done()) & set(tasks))
            results = run(store)
    else:  # no store: still in parallel on the requested workers, nothing to resume
        results = run(None)
    t3 = time.perf_counter()
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
    return SearchOutput(
        req,
        cluster,
        ok + errors,
        screened,
        n,
        {
            "screen_s": t1 - t0,
            "screen_cpu_s": c1 - c0,  # this process's CPU time: a busy machine inflates only screen_s
            "placement_s": t2 - t1,
            "simulate_s": t3 - t2,
            "total_s": t3 - t0,
        },
        n_cached=cached,
        profiles=screen.profiler.probes,
    )


__all__ = ["SearchOutput", "SearchRequest", "heterogeneous", "pick_exact", "screen_space", "search"]
