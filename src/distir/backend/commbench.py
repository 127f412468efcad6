"""Communication microbenchmarks for ``distir calibrate``: collectives and point-to-point sends
timed on ``torch.distributed`` across local processes.

``run_comm(nproc, ...)`` spawns ``nproc`` processes (one thread each) that join one process group
(gloo on CPU, NCCL when ``device`` is CUDA: rank r uses GPU r) through a file store in a temporary
directory. For every collective of ``COLLECTIVES``, group size 2..nproc (the group of ranks
0..size-1) and message size, every rank runs one warm-up call, the ranks agree on a repetition
count (the slowest rank's warm-up decides), run it back to back in ``rounds`` rounds and take the
fastest round's time per call of the slowest rank. The rounds are spread over the whole run —
round 1 of every measurement, then round 2 of every one, ... — so that a burst of load from other
processes slows one round of several measurements, not every round of one (whose fastest round
would then be slow too). ``p2p`` is a ping-pong between ranks 0 and 1: half the round trip.

Message sizes are stated as the cost functions of ``distir.sim.collectives`` read them: the
buffer for all-reduce and broadcast, the full gathered (scattered) size for all-gather
(reduce-scatter), the message for p2p. The tensors are float32.

Progress and results travel to the parent over a multiprocessing queue; a rank that raises sends
its error and exits, and the parent stops the others and raises ``CommBenchError`` naming the
rank. The parent gives up after ``timeout_s``.
"""

from __future__ import annotations

import math
import os
import queue
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from distir.backend import require_torch
from distir.hardware.fit import LinkSample

COLLECTIVES = ("allreduce", "allgather", "reducescatter", "broadcast", "p2p")


class CommBenchError(RuntimeError):
    """A benchmark process failed or the benchmark timed out (names the rank and the cause)."""


def comm_plan(nproc: int, sizes: Sequence[int]) -> list[tuple[str, int, int]]:
    """Every (collective, group size, bytes) measured, in order."""
    out = []
    for name in COLLECTIVES:
        groups = (2,) if name == "p2p" else tuple(range(2, nproc + 1))
        for g in groups:
            for m in sizes:
                out.append((name, g, m))
    return out


def elements(nbytes: int, g: int) -> int:
    """float32 elements of a ``nbytes`` message, rounded down to a multiple of the group size
    (at least one per rank): its true size is 4 × this."""
    return max(g, (nbytes // 4) // g * g)


def _op(
    dist: Any, torch: Any, name: str, group: Any, g: int, nbytes: int, dev: Any, rank: int
) -> Callable[[], None]:
    """A closure running collective ``name`` once on ``elements(nbytes, g)`` float32s."""
    n = elements(nbytes, g)
    x = torch.ones(n, device=dev)
    if name == "allreduce":
        return lambda: dist.all_reduce(x, group=group)
    if name == "broadcast":
        return lambda: dist.broadcast(x, 0, group=group)
    if name == "allgather":
        part, full = torch.ones(n // g, device=dev), torch.empty(n, device=dev)
        return lambda: dist.all_gather_into_tensor(full, part, group=group)
    if name == "reducescatter":
        part = torch.empty(n // g, device=dev)
        return lambda: dist.reduce_scatter_tensor(part, x, group=group)
    if name == "p2p":
        peer = 1 - rank

        def ping() -> None:
            if rank == 0:
                dist.send(x, peer)
                dist.recv(x, peer)
            else:
                dist.recv(x, peer)
                dist.send(x, peer)

        return ping
    raise ValueError(f"unknown collective {name!r}")


def _worker(
    rank: int,
    nproc: int,
    store: str,
    device: str,
    work: list[tuple[str, int, int]],
    target_s: float,
    rounds: int,
    q: Any,
) -> None:
    try:
        import warnings

        warnings.filterwarnings("ignore", category=FutureWarning)  # the *_tensor collectives' renames
        torch = require_torch()
        torch.set_num_threads(1)
        dist = torch.distributed
        cuda = device == "cuda"
        dev = torch.device(f"cuda:{rank}" if cuda else "cpu")
        if cuda:
            torch.cuda.set_device(dev)
        dist.init_process_group(
            "nccl" if cuda else "gloo", init_method=f"file://{store}", rank=rank, world_size=nproc
        )
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        groups = {g: (dist.new_group(list(range(g))) if g < nproc else None) for g in range(2, nproc + 1)}
        fns, reps = [], []
        for name, g, nbytes in work:  # a warm-up call each; the ranks agree on the repetitions
            fn = _op(dist, torch, name, groups[g], g, nbytes, dev, rank) if rank < g else None
            t0 = time.perf_counter()
            if fn is not None:
                fn()
                sync()
            first = torch.tensor([time.perf_counter() - t0 if fn is not None else 0.0])
            dist.all_reduce(first, op=dist.ReduceOp.MAX)
            fns.append(fn)
            reps.append(max(1, min(200, math.ceil(target_s / max(float(first), 1e-6)))))
        best = [math.inf] * len(work)
        for r in range(rounds):  # round r of every measurement, then round r + 1: spread in time
            for i, ((name, g, nbytes), fn) in enumerate(zip(work, fns, strict=True)):
                dist.barrier()
                t0 = time.perf_counter()
                if fn is not None:
                    for _ in range(reps[i]):
                        fn()
                    sync()
                per = torch.tensor([(time.perf_counter() - t0) / reps[i] if fn is not None else 0.0])
                dist.all_reduce(per, op=dist.ReduceOp.MAX)
                best[i] = min(best[i], float(per))
                if rank == 0 and r == rounds - 1:
                    q.put(("tick", f"{name} {g} ranks {nbytes} B"))
        out = [
            (name, g, 4 * elements(nbytes, g), b / (2 if name == "p2p" else 1))
            for (name, g, nbytes), b in zip(work, best, strict=True)
        ]
        dist.barrier()
        dist.destroy_process_group()
        if rank == 0:
            q.put(("result", out))
    except BaseException as e:  # report any failure, a KeyboardInterrupt included, then exit
        q.put(("error", rank, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"))
        raise SystemExit(1) from None


def run_comm(
    nproc: int,
    sizes: Sequence[int],
    device: str = "cpu",
    target_s: float = 0.05,
    tick: Callable[[str], None] | None = None,
    timeout_s: float = 600.0,
    rounds: int = 3,
) -> list[LinkSample]:
    """Time ``comm_plan(nproc, sizes)`` (see the module docstring); ``tick(label)`` after each."""
    import multiprocessing as mp

    if nproc < 2:
        raise CommBenchError(f"communication needs at least 2 processes, got --nproc {nproc}")
    work = comm_plan(nproc, sizes)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="distir-calibrate-") as tmp:
        store = str(Path(tmp) / "store")
        env = {"OMP_NUM_THREADS": "1"}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            procs = [
                ctx.Process(
                    target=_worker, args=(r, nproc, store, device, work, target_s, rounds, q), daemon=True
                )
                for r in range(nproc)
            ]
            for p in procs:
                p.start()
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        try:
            result = _collect(procs, q, tick, timeout_s)
        finally:
            for p in procs:
                if p.is_alive():
                    p.terminate()
                p.join(5)
    return [LinkSample(name, g, float(m), s) for name, g, m, s in result]


def _collect(procs: Sequence[Any], q: Any, tick: Callable[[str], None] | None, timeout_s: float) -> list[Any]:
    """Read the queue until rank 0's result; a failed or silent rank is a ``CommBenchError``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            msg = q.get(timeout=0.2)
        except queue.Empty:
            dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead:
                r, code = dead[0]
                raise CommBenchError(f"benchmark rank {r} exited with status {code}") from None
            continue
        if msg[0] == "tick":
            if tick is not None:
                tick(msg[1])
        elif msg[0] == "error":
            raise CommBenchError(f"benchmark rank {msg[1]} failed: {msg[2].splitlines()[0]}")
        else:
            return list(msg[1])
    raise CommBenchError(f"communication benchmark timed out after {timeout_s:g} s")
