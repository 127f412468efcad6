"""A search on a process pool says exactly what it says in one process: profiles computed by
workers (``Profiler.prefetch``), placement searches run side by side, exact simulations started
early; and the pool machinery of ``run_all`` (a shared pool, tasks started ahead)."""

from __future__ import annotations

import contextlib
import functools
import pickle
from collections import Counter
from concurrent.futures import CancelledError, Executor, Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import astuple
from pathlib import Path
from typing import Any

import pytest

from distir.frontends.zoo.registry import parse_model_string
from distir.hardware.cluster import parse_cluster
from distir.ir.types import DType
from distir.search import executor, run
from distir.search.executor import lazy_pool, local_pool, run_all, start
from distir.search.profile import Profiler, Wanted, allowed_tp, num_layers
from distir.search.run import SearchOutput, SearchRequest, screen_space, search
from distir.search.screen import Estimate, Problem, Screen
from distir.search.space import Space

from ._store_tasks import logged, pure

GPT = "gpt:layers=4,hidden=64,heads=4,seq=16,vocab=128"
# seq 64 for the search below: at seq 16 every kernel is launch-bound, no GPU placement is better
# than another, and the placement search it exercises has nothing to move; hidden 128: a pure
# best (d8.t1.p1) of a shape the placement search leaves alone, so it is started early
GPT_PLACED = "gpt:layers=4,hidden=128,heads=4,seq=64,vocab=128"
HETERO = "p3.8xlarge:1+g4dn.12xlarge:1"


def _screened(out: SearchOutput) -> list[tuple[Any, ...]]:
    return [astuple(e) for e in out.screened]


@pytest.mark.slow
def test_two_workers_search_exactly_as_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Screen (prefetched profiles), placement searches (on workers) and exact re-ranking (with
    ``explain``, the pure bests started during the placement search) give the same figures, with
    and without a store."""
    req = SearchRequest(model=GPT_PLACED, cluster=HETERO, batch=16, top=3, anneal_iters=60, explain=True)
    serial = search(req)
    early: list[str] = []
    real_start = run.start_task
    monkeypatch.setattr(
        run, "start_task", lambda pool, fn, task: (early.append(task), real_start(pool, fn, task))[1]
    )
    # the pool from the start (a search this small would not start one: ``POOL_AFTER_CPU_S``)
    pooled = {**req.__dict__, "workers": 2, "pool_after_cpu_s": 0.0}
    parallel = search(SearchRequest(**pooled))
    assert early and set(early) <= {r["strategy"] for r in parallel.results}  # started early, and wanted
    stored = search(SearchRequest(**{**pooled, "store": tmp_path / "s.sqlite"}))
    assert _screened(parallel) == _screened(serial)
    assert parallel.results == serial.results
    assert _screened(stored) == _screened(serial)
    assert stored.results == serial.results
    # no layer profile is computed twice: the workers' profile tasks run what the screen asks for
    # (an exact simulation started during the placement search shares its worker's profiler for
    # its program order, ``chunk_times``, so a task that follows may find profiles already there)
    assert 0 < parallel.profiles <= serial.profiles
    assert parallel.timings["screen_worker_cpu_s"] > 0 and serial.timings["screen_worker_cpu_s"] == 0
    # the placement search did move something: the parallel path is exercised, not skipped
    assert any(e.strategy.placement is not None for e in serial.screened)
    # rerun on the store: nothing left to simulate
    again = search(SearchRequest(**{**pooled, "store": tmp_path / "s.sqlite"}))
    assert again.n_cached == len(again.results)
    assert again.results == serial.results


@pytest.mark.slow
def test_prefetched_profiles_equal_local_ones() -> None:
    spec, cluster = parse_model_string(GPT), parse_cluster(HETERO)
    wanted = [
        Wanted(t, b, rc, list(range(g, g + t)), sp)
        for t in (1, 2)
        for b in (1, 4)
        for rc in ("none", "full")
        for sp in ((False, True) if t > 1 else (False,))
        for g in (0, 4)
    ]
    local = Profiler(spec, cluster)
    expected = [local.layers(t, b, gpus, rc, sp) for t, b, rc, gpus, sp in wanted]
    with local_pool(2) as pool:
        remote = Profiler(spec, cluster)
        # one task per microbatch size: every (t, recompute, sp) and both GPU kinds in it
        assert remote.prefetch(pool, wanted) == 2
        assert remote.prefetch(pool, wanted) == 0  # pending already
        got = [remote.layers(t, b, gpus, rc, sp) for t, b, rc, gpus, sp in wanted]
    assert got == expected
    assert remote.probes == local.probes
    assert remote.worker_cpu_s > 0


class _FailingPool(Executor):
    """A pool whose every task fails with ``error`` (by default as when its worker died)."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error if error is not None else BrokenProcessPool("worker died")
        self.submitted = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.submitted += 1
        fut: Future[Any] = Future()
        fut.set_exception(self.error)
        return fut


@pytest.mark.parametrize(
    "error",
    [BrokenProcessPool("worker died"), CancelledError(), pickle.PicklingError("cannot pickle the task")],
)
def test_failed_prefetch_is_computed_locally(error: BaseException) -> None:
    spec, cluster = parse_model_string(GPT), parse_cluster(HETERO)
    prof = Profiler(spec, cluster)
    prof.prefetch(_FailingPool(error), [Wanted(2, 4, "none", [0, 1])])
    assert prof.layers(2, 4, [0, 1]) == Profiler(spec, cluster).layers(2, 4, [0, 1])
    assert prof.worker_cpu_s == 0


def test_a_bug_in_a_prefetch_task_is_not_hidden() -> None:
    """Only the pool's failures fall back to computing here: an error of the task's own code
    (a bug) propagates."""
    spec, cluster = parse_model_string(GPT), parse_cluster(HETERO)
    prof = Profiler(spec, cluster)
    prof.prefetch(_FailingPool(ZeroDivisionError("a bug")), [Wanted(2, 4, "none", [0, 1])])
    with pytest.raises(ZeroDivisionError, match="a bug"):
        prof.layers(2, 4, [0, 1])


def _anneal_with(pool: Executor | None) -> list[tuple[Any, ...]]:
    """The screened estimates after the placement searches (on ``pool``, else here)."""
    req = SearchRequest(model=GPT, cluster="p3.8xlarge:1", batch=8, top=3, anneal_iters=5)
    screened, _, screen = screen_space(req, parse_cluster(req.cluster))
    picks = run.anneal_picks(req, screened)
    assert len(picks) > 1  # so that a pool gets the searches
    run.anneal(req, screen, screened, None, pool, picks)
    return [astuple(e) for e in screened]


@pytest.mark.slow
def test_placement_searches_lost_by_the_pool_run_here() -> None:
    assert _anneal_with(_FailingPool()) == _anneal_with(None)


def test_a_bug_in_a_placement_search_task_is_not_hidden() -> None:
    with pytest.raises(ZeroDivisionError, match="a bug"):
        _anneal_with(_FailingPool(ZeroDivisionError("a bug")))


def test_run_all_on_a_shared_pool_with_a_task_started_ahead(tmp_path: Path) -> None:
    log = tmp_path / "eval.log"
    fn = functools.partial(logged, str(log))
    order = ["a", "b", "c", "d"]
    with local_pool(2) as pool:
        early = {"a": start(pool, fn, "a"), "z": start(pool, fn, "z")}  # z: not asked for after all
        got = run_all(order, fn, None, workers=2, pool=pool, started=early)
        # the pool is still usable: its owner shuts it down
        assert run_all(["e"], pure, None, workers=2, pool=pool) == {"e": pure("e")}
    assert list(got) == order
    assert {t: r["task"] for t, r in got.items()} == {t: t for t in order}
    evaluated = Counter(line.split()[0] for line in log.read_text().splitlines())
    assert all(evaluated[t] == 1 for t in order)  # "a" was not submitted twice
    assert evaluated["z"] <= 1


@pytest.mark.slow
def test_the_screen_climbs_rung_by_rung_as_base_by_base() -> None:
    """``screen_space`` climbs the memory ladders round by round (the next rung's profiles go to the
    workers as soon as a base does not fit); what it returns is what climbing each base's ladder
    in turn until it fits gives, in the same order — without a pipeline, a larger k only up to the
    rung below the one the next smaller k fit on. A tight memory makes bases climb."""

    req = SearchRequest(
        model="gpt:layers=4,hidden=1024,heads=16,seq=1024", cluster="g4dn.12xlarge:1", batch=64
    )
    cluster = parse_cluster(req.cluster)
    spec = parse_model_string(req.model)
    screen = Screen(Profiler(spec, cluster), Problem(req.batch, True, req.optimizer))
    space = Space(
        cluster.num_devices,
        req.batch,
        num_layers(spec, DType.f32, True),
        tuple(allowed_tp(spec, DType.f32, 4)),
        True,
        req.pins,
    )
    want: list[Estimate] = []
    limit: dict[tuple[int, int, bool, str], int] = {}  # without a pipeline: the rung the last k fit on
    for base in space.bases():
        key = (base.d, base.t, base.sp, base.schedule)
        ladder = space.ladder(base)
        if base.p == 1:  # a larger k only on cheaper rungs (k ascending)
            ladder = ladder[: limit.get(key, len(ladder))]
        for r, s in enumerate(ladder):
            want.append(screen.estimate(s, tuple(range(cluster.num_devices))))
            if want[-1].fits:
                if base.p == 1:
                    limit[key] = r
                break
    climbed = sum(1 for e in want if e.strategy.zero or e.strategy.recompute != "none")
    assert climbed > 0  # the case exercises the later rounds
    want.sort(key=lambda e: (not e.fits, e.step_time_s if e.fits else -e.memory_headroom))
    for workers in (1, 2):
        with local_pool(2) if workers == 2 else contextlib.nullcontext() as pool:
            got, n, _ = screen_space(req, cluster, pool=pool)
        assert n == len(want)
        assert [astuple(e) for e in got] == [astuple(e) for e in want]


def _counting_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """``LazyPool``'s clock: one "CPU-second" more at every reading."""
    ticks = iter(range(1_000_000))
    monkeypatch.setattr(executor, "_clock", lambda: float(next(ticks)))


def test_a_lazy_pool_starts_once_the_cpu_time_is_spent(monkeypatch: pytest.MonkeyPatch) -> None:
    _counting_clock(monkeypatch)
    with lazy_pool(2, after_cpu_s=3) as lazy:  # made at 0; asked at 1, 2, then 3: started
        assert lazy.get() is None and lazy.get() is None
        pool = lazy.get()
        assert pool is not None and lazy.get() is pool
        assert run_all(["a"], pure, None, workers=2, pool=pool) == {"a": pure("a")}
    with lazy_pool(2, after_cpu_s=1e9) as never:
        assert never.get() is None
    assert never.pool is None


@pytest.mark.slow
# the clock ticks once per ``LazyPool.get``: this search asks 127 times in the screen, once to start
# the pure bests early, once for the batch shares, then once per exact simulation left
@pytest.mark.parametrize("after", [0, 6, 128, 131, 1e9])
def test_a_pool_started_at_any_point_gives_the_same_search(
    monkeypatch: pytest.MonkeyPatch, after: float
) -> None:
    """With the pool started at once, after some rungs of the screen (their queued profiles
    handed over), for the pure bests started early, after one exact simulation, or never (a
    search this small: the default), the screen and the exact results are those of one process."""
    req = SearchRequest(model=GPT_PLACED, cluster=HETERO, batch=16, top=3, anneal_iters=60, explain=True)
    serial = search(req)
    started: list[int] = []
    real_new_pool = executor.new_pool
    monkeypatch.setattr(executor, "new_pool", lambda n: (started.append(n), real_new_pool(n))[1])
    _counting_clock(monkeypatch)
    got = search(SearchRequest(**{**req.__dict__, "workers": 2, "pool_after_cpu_s": after}))
    assert _screened(got) == _screened(serial)
    assert got.results == serial.results
    assert started == ([] if after == 1e9 else [2])
