"""Run a search's evaluations, in process, on a local process pool or on Ray, storing each result as
it arrives.

``run_all`` is what makes a search resumable: it evaluates only what the store does not hold yet,
and the parent process stores every result the moment it arrives, so a kill (Ctrl-C, ``kill -9``, a
lost node) loses at most the evaluations in flight, and rerunning repeats none that finished.

Only exceptions raised by the evaluation function become results (``{"error": "<type>:
<message>"}``, stored like any other so a failing strategy is not retried forever). Failures of the
machinery around it (a worker process that died, an ``fn`` that cannot be pickled, a Ray error)
raise ``ExecutorError`` and store nothing for the tasks affected, so a rerun retries them; results
stored before the failure are kept. Those failures are named (``PICKLING_ERRORS``,
``BrokenProcessPool``, Ray's ``RayError``): anything else raised around the evaluation function is a
bug of distir's and propagates as it is.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import multiprocessing
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.context import BaseContext
from multiprocessing.reduction import ForkingPickler
from typing import Any, Final

from distir.search.store import DuplicateResult, ResultStore, dumps, loads

__all__ = [
    "EXECUTORS",
    "PICKLING_ERRORS",
    "POOL_AFTER_CPU_S",
    "TASK_LOST",
    "ExecutorError",
    "LazyPool",
    "lazy_pool",
    "local_pool",
    "new_pool",
    "run_all",
    "start",
    "stop_pool",
]

EXECUTORS: Final = ("local", "ray")

# Evaluations run side by side, one per core: a BLAS/OpenMP pool per worker would oversubscribe.
_THREAD_ENV: Final = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
_PR_SET_PDEATHSIG: Final = 1  # from <linux/prctl.h>

Result = dict[str, Any]

# What pickling an object that cannot be pickled raises: ``PicklingError``, or ``TypeError`` (a
# lock, a generator: "cannot pickle ..."), or ``AttributeError`` (a lambda or a local function:
# "Can't pickle local object ..."). A pool's feeder thread sets them on the task's future.
PICKLING_ERRORS: Final = (pickle.PicklingError, TypeError, AttributeError)
# What the future of a task on a pool raises when the pool failed it rather than the task: a
# worker died (``BrokenProcessPool``), the pool was stopped before it ran (``CancelledError``), or
# the task or its result could not be pickled. A caller that can compute the task itself does so.
TASK_LOST: Final = (BrokenProcessPool, CancelledError, *PICKLING_ERRORS)
_OnResult = Callable[[str, Result], None]


class ExecutorError(Exception):
    """The evaluations cannot be run: bad arguments, a missing optional dependency, or a failure
    outside the evaluation function. Results stored before it was raised are kept."""


def _evaluate(fn: Callable[[str], Result], task: str) -> Result:
    """``fn(task)`` as the result to store: exactly what the store will give back, or an error result
    if ``fn`` raises an ``Exception`` or returns something that is not a storable dict.

    Runs where the evaluation runs (worker process or Ray worker), so an unstorable result becomes
    an error result of its task instead of failing the whole search in the parent. ``BaseException``
    (``KeyboardInterrupt``, ``SystemExit``) propagates: it stops the run rather than becoming a result.
    """
    try:
        result = fn(task)
    except Exception as exc:  # the evaluation's own failure is its task's result (module docstring)
        return {"error": f"{type(exc).__name__}: {exc}"}
    if not isinstance(result, Mapping):
        return {"error": f"TypeError: evaluation returned {type(result).__name__}, not a dict"}
    try:
        # Round-tripped so that a fresh result is identical to the same result read back from the
        # store later: a resumed search then renders exactly like an uninterrupted one.
        stored: Result = loads(dumps(result))
    except TypeError as exc:
        return {"error": f"TypeError: result is not storable: {exc}"}
    return stored


def _die_with_parent(parent_pid: int) -> None:
    """Have the kernel kill this worker when its parent dies (Linux; best effort elsewhere).

    Without it, ``kill -9`` of a search leaves its pool workers orphaned: they finish their task,
    then take queued ones whose results go nowhere, then block forever on a queue nobody feeds.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    # The parent may have died before prctl took effect; then we are already an orphan.
    if os.getppid() != parent_pid:
        os._exit(1)


def _init_worker(parent_pid: int) -> None:
    """Pool worker initializer: one thread per numeric library, no cyclic garbage collector, and
    die with the parent.

    The thread variables only reach libraries that read them after this point: with the fork start
    method a library the parent has already loaded and initialised keeps its thread count. A
    worker lives as long as its pool (one search, one ``run_all``) and keeps what it computes
    (layer shardings, plans, op records) to the end, making almost no cyclic garbage: the
    collector would only walk those again and again (``distir.gcpause``).
    """
    for name in _THREAD_ENV:
        os.environ[name] = "1"
    gc.disable()
    _die_with_parent(parent_pid)


def _mp_context() -> BaseContext:
    # fork is fast (no re-import of the parent's modules per worker) and is the safe default only on
    # Linux; macOS and Windows get spawn, which needs fn importable by the worker.
    if sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _run_local(todo: Sequence[str], fn: Callable[[str], Result], on_result: _OnResult) -> None:
    for task in todo:
        on_result(task, _evaluate(fn, task))


def new_pool(workers: int) -> ProcessPoolExecutor:
    """A local process pool as ``run_all`` makes one (fork on Linux, one thread per numeric
    library, workers die with this process). With fork, all workers start at the first submit."""
    return ProcessPoolExecutor(
        max_workers=workers, mp_context=_mp_context(), initializer=_init_worker, initargs=(os.getpid(),)
    )


def stop_pool(pool: ProcessPoolExecutor) -> None:
    """End ``pool`` now: cancel what waits, terminate what runs (its results cannot be stored)."""
    # The pool has no public way to do that before Python 3.14, hence the private process table.
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    # a process already ended and closed by the pool raises ValueError; one that cannot be
    # signalled, OSError
    for process in processes:
        with contextlib.suppress(ValueError, OSError):
            process.terminate()
    for process in processes:
        with contextlib.suppress(ValueError, OSError):
            process.join(timeout=5.0)


@contextlib.contextmanager
def local_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """``new_pool(workers)`` for the block: shut down (waiting) when it ends normally, stopped
    (``stop_pool``) when it raises. A search runs all its phases on one such pool."""
    pool = new_pool(workers)
    try:
        yield pool
    except BaseException:
        stop_pool(pool)
        raise
    pool.shutdown(wait=True)


# A search starts its pool once its own process has spent this many CPU-seconds (``LazyPool``).
# The pool costs CPU and saves none — forking, each worker's first touch of the pages it shares,
# results pickled both ways, and what a worker builds again (models, differentiations, layer
# shardings): 0.13-0.29 CPU-s on AMP's searches (1.3-2.4 CPU-s in one process) — it only halves
# the wall time of what is left on two cores. A search over by then runs in one process, at most
# this much / 2 seconds later; a longer one pays at most ~10% of its CPU for the pool.
POOL_AFTER_CPU_S: Final = 3.0
_clock = time.process_time  # this process's CPU-seconds (a test replaces it)


class LazyPool:
    """A local pool (``new_pool``) started the first time ``get`` is called once this process has
    spent ``after_cpu_s`` CPU-seconds since the ``LazyPool`` was made (``POOL_AFTER_CPU_S``): the
    caller asks each time it has work a pool could take, does that work itself while ``get`` says
    None, and hands it over from then on. Forked late, the workers start with this process's
    caches (models, differentiations, layer shardings) instead of building their own."""

    def __init__(self, workers: int, after_cpu_s: float = POOL_AFTER_CPU_S) -> None:
        self.workers = workers
        self.after_cpu_s = after_cpu_s
        self._since = _clock()
        self.pool: ProcessPoolExecutor | None = None

    def get(self) -> ProcessPoolExecutor | None:
        """The pool, started now if it is time; None before."""
        if self.pool is None and _clock() - self._since >= self.after_cpu_s:
            self.pool = new_pool(self.workers)
        return self.pool


@contextlib.contextmanager
def lazy_pool(workers: int, after_cpu_s: float = POOL_AFTER_CPU_S) -> Iterator[LazyPool]:
    """A ``LazyPool`` for the block: its pool, if it started, shut down (waiting) when the block
    ends normally, stopped (``stop_pool``) when it raises."""
    lazy = LazyPool(workers, after_cpu_s)
    try:
        yield lazy
    except BaseException:
        if lazy.pool is not None:
            stop_pool(lazy.pool)
        raise
    if lazy.pool is not None:
        lazy.pool.shutdown(wait=True)


def start(pool: ProcessPoolExecutor, fn: Callable[[str], Result], task: str) -> Future[Result]:
    """Start evaluating ``task`` on ``pool`` ahead of ``run_all`` (which takes the future in
    ``started`` and stores its result like any other)."""
    return pool.submit(_evaluate, fn, task)


def _run_pool(
    todo: Sequence[str],
    fn: Callable[[str], Result],
    workers: int,
    on_result: _OnResult,
    shared: ProcessPoolExecutor | None = None,
    started: Mapping[str, Future[Result]] | None = None,
) -> None:
    # Checked up front (with the pickler the pool uses) for a clear error: the pool would only report
    # it from a background thread, task by task.
    try:
        ForkingPickler.dumps(fn)
    except PICKLING_ERRORS as exc:
        raise ExecutorError(
            f"--workers > 1 needs a picklable evaluation function (a module-level function or a "
            f"functools.partial of one), got {fn!r}: {type(exc).__name__}: {exc}"
        ) from exc
    pool = shared if shared is not None else new_pool(min(workers, len(todo)))
    finished = False
    futures: dict[Future[Result], str] = {}
    try:
        early = started or {}
        futures.update(
            {early[task] if task in early else pool.submit(_evaluate, fn, task): task for task in todo}
        )
        for future in as_completed(futures):
            task = futures[future]
            try:
                result = future.result()
            except BrokenProcessPool as exc:
                raise ExecutorError(
                    f"a worker process died (killed, out of memory, or unable to import the evaluation "
                    f"function), last waiting on {task!r}; finished results are stored, rerun to resume"
                ) from exc
            except PICKLING_ERRORS as exc:  # ``_evaluate`` turns the function's own exceptions into results
                raise ExecutorError(
                    f"evaluating {task!r} failed outside the evaluation function ({type(exc).__name__}: "
                    f"{exc}); the function and its arguments must be picklable"
                ) from exc
            on_result(task, result)
        finished = True
    finally:
        if shared is not None:
            if not finished:  # the pool's owner stops it (``local_pool``); drop what waits here
                for future in futures:
                    future.cancel()
        elif finished:
            pool.shutdown(wait=True)
        else:
            # Stopping (Ctrl-C, a store error, a dead worker): what is still running cannot be
            # stored, so end it now rather than let the interpreter wait for it at exit.
            stop_pool(pool)


def _run_ray(todo: Sequence[str], fn: Callable[[str], Result], workers: int, on_result: _OnResult) -> None:
    try:
        ray: Any = importlib.import_module("ray")
    except ImportError as exc:
        raise ExecutorError(
            "--executor ray needs Ray, which is not installed: pip install 'distir[ray]'"
        ) from exc
    # An explicit RAY_ADDRESS (e.g. ray://head:10001 or auto) joins that cluster; without it Ray
    # joins a cluster started on this machine by `ray start`, or else starts a local one.
    ray.init(address=os.environ.get("RAY_ADDRESS") or None, ignore_reinit_error=True)
    # Ray sets OMP_NUM_THREADS to a task's num_cpus, so one CPU per task also means one thread.
    remote = ray.remote(num_cpus=1)(_evaluate)
    ray_error: type[Exception] = ray.exceptions.RayError  # the base of every error Ray raises
    try:
        fn_ref = ray.put(fn)  # shipped once, not once per task
    except (*PICKLING_ERRORS, ray_error) as exc:
        raise ExecutorError(
            f"Ray cannot ship the evaluation function {fn!r}: {type(exc).__name__}: {exc}"
        ) from exc
    queue = iter(todo)
    pending: dict[Any, str] = {}

    def submit_next() -> None:
        task = next(queue, None)
        if task is not None:
            pending[remote.remote(fn_ref, task)] = task

    try:
        # At most `workers` tasks in flight: the rest wait here, not in Ray's queue, so a kill
        # leaves nothing half-scheduled on the cluster.
        for _ in range(workers):
            submit_next()
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                task = pending.pop(ref)
                try:
                    result: Result = ray.get(ref)
                except ray_error as exc:  # a lost worker or node, an object Ray cannot fetch
                    raise ExecutorError(
                        f"Ray failed evaluating {task!r} outside the evaluation function "
                        f"({type(exc).__name__}: {exc}); finished results are stored, rerun to resume"
                    ) from exc
                on_result(task, result)
                submit_next()
    finally:
        for ref in pending:
            with contextlib.suppress(ray_error):
                ray.cancel(ref, force=True)


def run_all(
    tasks: Sequence[str],
    fn: Callable[[str], dict[str, Any]],
    store: ResultStore | None,
    *,
    workers: int = 1,
    executor: str = "local",
    progress: Callable[[int, int], None] | None = None,
    pool: ProcessPoolExecutor | None = None,
    started: Mapping[str, Future[Result]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Every task's result, in ``tasks`` order: the stored ones from ``store``, the others from
    ``fn(task)``, each stored (``store.put``) by this process the moment it arrives. Without a
    store (None) nothing is stored or resumed; everything else is the same.

    - A task already in ``store.done()`` is never evaluated again; a repeated task is evaluated
      once. An ``Exception`` raised by ``fn`` is stored and returned as ``{"error": "<type>:
      <message>"}``; ``KeyboardInterrupt`` stops the run (results stored so far are kept).
    - ``executor="local"``: ``workers == 1`` evaluates in this process, in order; ``workers > 1``
      uses a process pool (fork start method on Linux, spawn elsewhere), in completion order. ``fn``
      and its results must be picklable: a module-level function or a ``functools.partial`` of
      one, not a lambda or closure (with spawn, its module must also be importable by a fresh
      interpreter). Each worker sets ``OMP_NUM_THREADS`` and friends to 1, and is killed by the
      kernel if this process dies (Linux). With fork, avoid calling this while other threads of the
      process hold locks ``fn`` needs (a forked child inherits them held).
    - ``executor="ray"``: evaluates on Ray (even with ``workers == 1``), at most ``workers`` tasks at
      once, one CPU each. Ray is imported only when there is something to evaluate; its cluster is
      ``RAY_ADDRESS`` if set (else a local one). ``fn`` is pickled by Ray, and the workers must be
      able to import ``distir`` and ``fn``'s module.
    - ``pool``: with ``executor="local"`` and ``workers > 1``, evaluate on this pool (``new_pool``,
      ``local_pool``) instead of a new one, and leave it running (its owner shuts it down);
      ``started`` holds tasks already submitted to it (``start``): they are not submitted again,
      and those the store already holds are cancelled.
    - ``progress(done, total)`` is called once at the start with the stored count, then after each
      newly stored result; ``total`` counts distinct tasks, stored ones included.

    Raises ``ExecutorError`` for an unknown ``executor``, ``workers < 1``, a missing Ray, or a
    failure outside ``fn``; ``StoreError`` if a result cannot be stored.
    """
    if executor not in EXECUTORS:
        raise ExecutorError(f"unknown executor {executor!r}; choose one of {', '.join(EXECUTORS)}")
    if workers < 1:
        raise ExecutorError(f"workers must be at least 1, got {workers}")
    unique = list(dict.fromkeys(tasks))
    stored = store.done() if store is not None else {}
    results: dict[str, Result] = {task: stored[task] for task in unique if task in stored}
    todo = [task for task in unique if task not in stored]
    pooled = executor == "local" and workers > 1 and pool is not None
    for task, future in (started or {}).items():
        if task not in todo or not pooled:
            future.cancel()
    total = len(unique)
    if progress is not None:
        progress(len(results), total)

    def on_result(task: str, result: Result) -> None:
        if store is not None:
            try:
                store.put(task, result)
            except DuplicateResult:
                # another process running the same search stored it first: theirs stands (the
                # same inputs give the same result), this search goes on
                result = store.done()[task]
        results[task] = result
        if progress is not None:
            progress(len(results), total)

    if todo:
        if executor == "ray":
            _run_ray(todo, fn, workers, on_result)
        elif workers == 1:
            _run_local(todo, fn, on_result)
        else:
            _run_pool(todo, fn, workers, on_result, pool, started)
    return {task: results[task] for task in tasks}
