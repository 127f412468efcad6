"""Processes and rendezvous: one process per rank, locally or under ``torchrun``.

``launch(jobs)`` runs ``jobs[r]`` (rank r's programs) in ``len(jobs)`` spawned worker processes
(one torch thread each) that meet at ``tcp://127.0.0.1:<a free port>`` with gloo (NCCL when CUDA
is present: one GPU per rank) and returns each rank's ``RankResult``s.

Each rank's programs go to it in a file of the run's temporary directory, not through the spawn:
multiprocessing writes a spawned process's arguments into a pipe whose reading end the parent
holds until the write ends, so a rank that died while starting, before reading arguments larger
than the pipe's buffer, would block the parent in ``Process.start`` for ever.

Fail-stop: the parent watches every worker (results and failures arrive on a queue; exit codes
are polled every ``POLL_S``). When a rank fails — an op raised, or the process died (a signal,
the OOM killer) — the parent waits ``SETTLE_S`` for the other ranks' reports (to tell the rank
that failed first from peers whose communication broke because of it), then terminates every
worker, and kills those still alive ``GRACE_S`` later: every rank is gone within
``FAIL_STOP_BOUND_S`` of the first failure. ``RunFailed`` then names the failing rank, its
device, the op it was at (printed as in the IR) and why. Workers also die with their parent
(``PR_SET_PDEATHSIG`` on Linux), and gloo's timeout (``timeout_s``) bounds any wait on a peer.

``torchrun_rank()`` runs this process's rank when started by ``torchrun`` (it reads RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT): the results are gathered on rank 0, which returns them;
other ranks return None. torchrun's agent stops the other workers when one fails.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distir.backend import require_torch
from distir.backend.worker import RankFailure, RankProgram, RankResult, RankSetup, Stage, run_programs
from distir.ir.ops import Op
from distir.ir.printer import print_op
from distir.ir.rewrite import inline_calls
from distir.limits import max_local_ranks

POLL_S = 0.05
SETTLE_S = 0.5
GRACE_S = 2.0
FAIL_STOP_BOUND_S = POLL_S + SETTLE_S + GRACE_S + 0.5  # 3 s: every rank gone after a failure


class RunFailed(RuntimeError):
    """A rank failed; the message names it, its op and why. ``rank`` is the global rank."""

    def __init__(self, message: str, rank: int | None) -> None:
        super().__init__(message)
        self.rank = rank


@dataclass(frozen=True, slots=True)
class LaunchOptions:
    timeout_s: float = 300.0  # gloo/NCCL timeout of any one collective or transfer
    backend: str | None = None  # default: nccl if CUDA is present, else gloo
    # set (``.set()``, e.g. a threading.Event) once every rank is running its ops: for watchers
    running: Any = None


def default_backend() -> str:
    torch = require_torch()
    return "nccl" if torch.cuda.is_available() else "gloo"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """Ask Linux to kill this worker when its parent dies (no orphan if the launcher is killed)."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _worker_main(setup: RankSetup, jobs_file: str, results: Any, progress: Any) -> None:
    """A spawned rank: read its programs, run, report on ``results`` (a queue), exit."""
    _die_with_parent()
    os.environ["OMP_NUM_THREADS"] = "1"
    jobs: list[RankProgram] = pickle.loads(Path(jobs_file).read_bytes())
    progress[2] = Stage.JOINING
    try:
        out = run_programs(setup, jobs, progress)
    except RankFailure as e:
        _report_and_exit(results, ("error", setup.rank, str(e), e.secondary))
    except BaseException as e:
        _report_and_exit(results, ("error", setup.rank, f"rank {setup.rank}: {type(e).__name__}: {e}", True))
    results.put(("ok", setup.rank, out))
    results.close()
    results.join_thread()
    require_torch().distributed.destroy_process_group()


def _report_and_exit(results: Any, message: tuple[Any, ...]) -> None:
    results.put(message)
    results.close()
    results.join_thread()
    os._exit(1)  # skip torch.distributed's exit handlers, which may wait for dead peers


def launch(
    jobs: Sequence[Sequence[RankProgram]], options: LaunchOptions | None = None
) -> list[list[RankResult]]:
    """Run rank r's programs ``jobs[r]`` in one spawned process per rank (module docstring)."""
    import multiprocessing as mp

    opts = options or LaunchOptions()
    backend = opts.backend or default_backend()
    world = len(jobs)
    if world > max_local_ranks():
        raise RunFailed(
            f"the program has {world:,} ranks; a local run starts one process per rank, at most "
            f"{max_local_ranks()} here (this machine's CPUs, at least 8; more: torchrun on a cluster)",
            None,
        )
    ctx = mp.get_context("spawn")
    results: Any = ctx.Queue()
    port = free_port()
    progress = [ctx.Array("i", [0, -1, Stage.STARTING], lock=False) for _ in range(world)]
    procs = []
    with tempfile.TemporaryDirectory(prefix="distir-run-") as tmp:
        for r in range(world):
            setup = RankSetup(r, world, backend, f"tcp://127.0.0.1:{port}", opts.timeout_s)
            jobs_file = Path(tmp) / f"rank{r}.pickle"
            jobs_file.write_bytes(pickle.dumps(list(jobs[r]), protocol=pickle.HIGHEST_PROTOCOL))
            p = ctx.Process(
                target=_worker_main,
                args=(setup, str(jobs_file), results, progress[r]),
                name=f"distir-rank-{r}",
                daemon=True,
            )
            procs.append(p)
        try:
            for p in procs:
                p.start()
            return _monitor(procs, results, jobs, progress, opts.running)
        finally:
            _stop(procs)


def _monitor(
    procs: list[Any], results: Any, jobs: Sequence[Sequence[RankProgram]], progress: list[Any], running: Any
) -> list[list[RankResult]]:
    done: dict[int, list[RankResult]] = {}
    failures: dict[int, tuple[str, bool]] = {}  # rank -> (message, secondary)
    first_failure: float | None = None
    exited: dict[int, float] = {}  # rank -> when it was first seen to have exited, without a result
    while len(done) < len(procs):
        with contextlib.suppress(queue.Empty):
            msg = results.get(timeout=POLL_S)
            if msg[0] == "ok":
                done[msg[1]] = msg[2]
            else:
                failures[msg[1]] = (msg[2], msg[3])
        now = time.monotonic()
        if running is not None and all(p[1] >= 0 for p in progress):
            running.set()
            running = None
        for r, p in enumerate(procs):
            code = p.exitcode
            if code is None or r in failures or r in done:
                continue
            if code < 0:
                failures[r] = (_death(r, -code, jobs[r], progress[r]), False)
                exited.setdefault(r, now)
            # exited (any status, 0 included) without a result or a report: its queued message,
            # if any, arrives within SETTLE_S; a rank that died starting up never sends one
            elif now - exited.setdefault(r, now) >= SETTLE_S:
                failures[r] = (_exit_message(r, code, jobs[r], progress[r]), False)
        if failures and first_failure is None:  # counted from the exit, when a rank exited
            first_failure = min([now, *(exited[r] for r in failures if r in exited)])
        if first_failure is not None and time.monotonic() - first_failure >= SETTLE_S:
            break
    if failures:
        _stop(procs)
        primary = [r for r, (_, sec) in failures.items() if not sec]
        r = min(primary) if primary else min(failures)
        raise RunFailed(failures[r][0], r)
    return [done[r] for r in range(len(procs))]


def _exit_message(rank: int, code: int, jobs: Sequence[RankProgram], progress: Any) -> str:
    """The message for a rank that exited with status ``code`` without reporting."""
    where = _where(jobs, progress)
    return f"rank {rank} ({jobs[0].device}) exited with status {code}{where}"


def _death(rank: int, signum: int, jobs: Sequence[RankProgram], progress: Any) -> str:
    """The message for a rank killed by signal ``signum``: which op it was running."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    i = int(progress[0])
    job = jobs[i] if 0 <= i < len(jobs) else jobs[0]
    return f"rank {rank} ({job.device}) was killed by {name}{_where(jobs, progress)}"


def _where(jobs: Sequence[RankProgram], progress: Any) -> str:
    """Where a rank was when it died: starting (before it joined the process group), joining,
    at an op (printed as in the IR), or between steps."""
    stage = int(progress[2])
    if stage == Stage.STARTING:
        return " while starting (importing, unpickling its programs), before it joined the process group"
    if stage == Stage.JOINING:
        return " while joining the process group, before its first op"
    i, k = int(progress[0]), int(progress[1])
    job = jobs[i] if 0 <= i < len(jobs) else jobs[0]
    ops = [x for x in inline_calls(job.program).body if isinstance(x, Op)]
    if 0 <= k < len(ops):
        return f" at `{print_op(ops[k])}`"
    if ops and k >= len(ops):  # the step's last transfers, or the barrier before the next step
        return f" after its last op `{print_op(ops[-1])}`, between steps"
    return " before its first op"


def _stop(procs: list[Any]) -> None:
    """Terminate every live worker; kill those still alive ``GRACE_S`` later."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        if p.pid is None:
            continue
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(1.0)


def under_torchrun() -> bool:
    """Whether this process was started by torchrun (or any launcher setting RANK/WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def torchrun_rank(
    jobs_by_rank: Sequence[Sequence[RankProgram]], options: LaunchOptions | None = None
) -> list[list[RankResult]] | None:
    """Run this process's rank (RANK) of ``jobs_by_rank`` under torchrun; rank 0 gets everyone's
    results (None elsewhere). A failure raises ``RankFailure`` on the failing rank."""
    opts = options or LaunchOptions()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != len(jobs_by_rank):
        raise RunFailed(
            f"the program has {len(jobs_by_rank)} ranks but torchrun started {world} (WORLD_SIZE)", None
        )
    local = int(os.environ.get("LOCAL_RANK", rank))
    setup = RankSetup(rank, world, opts.backend or default_backend(), "env://", opts.timeout_s, local)
    out = run_programs(setup, jobs_by_rank[rank])
    dist = require_torch().distributed
    gathered: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(out, gathered, dst=0)
    dist.destroy_process_group()
    return [list(g) for g in gathered] if gathered is not None else None
