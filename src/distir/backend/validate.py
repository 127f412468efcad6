"""``distir validate``: strategies run for real and simulated, side by side.

``candidates(nproc)`` lists strategies for ``nproc`` ranks: every (d, t, p) with d·t·p = nproc;
microbatches k ∈ {1, 2, 4} (k ≥ 2 with pipelining); every schedule with p > 1 (interleaved with
v = 2); ZeRO 0–3 with d > 1; sequence parallelism with t > 1; recomputation none, full,
selective. ``validate(...)`` draws ``samples`` of them (seeded; those that do not build for the
model are skipped and the next drawn), or takes exactly the ``strategies`` given (``distir
validate --strategy S``, e.g. a search's winner: each on ``nproc`` ranks, one that does not build
an error; ρ needs two), and for each:

- *real*: builds the distributed training step (``distir.backend.program.model_program``: f32,
  Adam), runs it ``steps`` times on one process per rank (``distir.backend.launch``, as ``distir
  run`` does, unverified) and takes its step time (per step the slowest rank's; the fastest step
  after the warm-up, since on a shared machine other processes only ever add time, as
  ``distir calibrate`` times its benchmarks) and peak memory (the largest rank's: the CUDA
  allocator's peak, or on CPU the tracked bytes of live tensors, the step's inputs included);
- *simulated*: the same explicit program on the cluster (the calibrated profile), one kernel
  per op as eager PyTorch runs it (``RooflineCostModel(fuse=False)``), same two figures.

On a CPU both sides run inside ``distir.backend.idle.poll_idle`` (unless ``poll_idle=False``),
as ``distir calibrate`` measures: a rank waiting for its peer then wakes as fast at any load.

The report: Spearman's ρ of throughput (samples/s), and the median and max absolute relative
error of step time and of peak memory (``distir.report.fidelity``); ``scatter_png`` draws
simulated against real step time and memory.
"""

from __future__ import annotations

import io
import itertools
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from distir.backend.launch import LaunchOptions, launch
from distir.backend.program import model_program, rank_programs
from distir.files import write_atomically
from distir.hardware.cluster import Cluster
from distir.parallel.strategy import Strategy
from distir.report.fidelity import ErrorStats, errors, spearman
from distir.sim.cost import RooflineCostModel
from distir.sim.simulate import simulate


class ValidateError(RuntimeError):
    """Validation could not run (names why)."""


class Point(NamedTuple):
    """One strategy, measured and simulated: step time (s) and peak memory (bytes) of each."""

    strategy: str
    real_step_s: float
    sim_step_s: float
    real_peak_bytes: int
    sim_peak_bytes: float


class Fidelity(NamedTuple):
    """The points and their statistics (see the module docstring)."""

    model: str
    batch: int
    nproc: int
    cluster: str
    memory_source: str
    points: list[Point]
    rho_throughput: float
    step_time: ErrorStats
    peak_memory: ErrorStats


def candidates(nproc: int) -> list[Strategy]:
    """Every strategy of the module docstring for ``nproc`` ranks, in a fixed order."""
    out: list[Strategy] = []
    for d, t in itertools.product(range(1, nproc + 1), repeat=2):
        if nproc % (d * t):
            continue
        p = nproc // (d * t)
        schedules = ("gpipe", "1f1b", "interleaved", "zb1") if p > 1 else ("1f1b",)
        for sched, k, zero, sp, rec in itertools.product(
            schedules,
            (1, 2, 4),
            range(4) if d > 1 else (0,),
            (False, True) if t > 1 else (False,),
            ("none", "full", "selective"),
        ):
            if p > 1 and k < 2:
                continue
            v = 2 if sched == "interleaved" else 1
            out.append(Strategy(d=d, t=t, p=p, k=k, schedule=sched, v=v, zero=zero, sp=sp, recompute=rec))
    return out


def _measure(
    model: str, st: Strategy, batch: int, cluster: Cluster, steps: int, timeout_s: float
) -> tuple[Point, str]:
    prog = model_program(model, str(st), batch)
    jobs = rank_programs(prog, steps, False)
    results = [g[0] for g in launch([[j] for j in jobs], LaunchOptions(timeout_s=timeout_s))]
    per_step = [max(ts) for ts in zip(*(r.step_times for r in results), strict=True)]
    sim = simulate(prog.module, cluster, None, RooflineCostModel(cluster, fuse=False), batch=batch)
    point = Point(
        str(st),
        min(per_step[1:] or per_step),
        sim.step_time_s,
        max(r.peak_memory_bytes for r in results),
        max(sim.peak_memory.values()),
    )
    return point, results[0].memory_source


def validate(
    model: str,
    samples: int,
    nproc: int,
    cluster: Cluster,
    batch: int = 8,
    steps: int = 4,
    seed: int = 0,
    timeout_s: float = 120.0,
    tick: Callable[[str], None] | None = None,
    poll_idle: bool = True,
    strategies: Sequence[str] = (),
) -> Fidelity:
    """Run and simulate ``samples`` strategies (see the module docstring), or exactly
    ``strategies`` when given (``chosen``; e.g. a search's winner); with ``poll_idle`` (on a
    CPU), inside ``distir.backend.idle.poll_idle``, as ``distir calibrate`` measures."""
    from distir.backend import idle, require_torch

    pool = chosen(strategies, nproc) if strategies else None
    args = (model, samples, nproc, cluster, batch, steps, seed, timeout_s, tick, pool)
    if not poll_idle or require_torch().cuda.is_available():
        return _validate(*args)
    with idle.poll_idle():
        return _validate(*args)


def chosen(strategies: Sequence[str], nproc: int) -> list[Strategy]:
    """The strategies asked for, each on exactly ``nproc`` ranks (a ``ValidateError`` naming the
    first that is not)."""
    from distir.parallel.strategy import StrategyError, parse_strategy

    out: list[Strategy] = []
    for text in strategies:
        try:
            st = parse_strategy(text)
        except StrategyError as e:
            raise ValidateError(str(e)) from None
        if st.devices != nproc:
            raise ValidateError(f"strategy {st} runs on {st.devices} ranks, not --nproc {nproc}")
        out.append(st)
    return out


def _validate(
    model: str,
    samples: int,
    nproc: int,
    cluster: Cluster,
    batch: int,
    steps: int,
    seed: int,
    timeout_s: float,
    tick: Callable[[str], None] | None,
    asked: list[Strategy] | None = None,
) -> Fidelity:
    from distir.frontends.zoo.model import ModelError
    from distir.parallel.strategy import StrategyError

    if cluster.num_devices < nproc:
        raise ValidateError(f"the cluster has {cluster.num_devices} devices, fewer than --nproc {nproc}")
    pool = asked if asked is not None else candidates(nproc)
    if asked is None:
        random.Random(seed).shuffle(pool)
    else:
        samples = len(asked)
    points: list[Point] = []
    source = ""
    for st in pool:
        if len(points) == samples:
            break
        try:
            point, source = _measure(model, st, batch, cluster, steps, timeout_s)
        except (StrategyError, ModelError, ValueError) as e:
            if asked is not None:  # the user's own strategy: its reason, not a silent skip
                raise ValidateError(str(e) if str(st) in str(e) else f"{st}: {e}") from None
            continue  # does not build for this model and batch: draw the next
        points.append(point)
        if tick is not None:
            tick(str(st))
    if len(points) < 2 and asked is None:
        raise ValidateError(f"only {len(points)} strategies of {model} build on {nproc} ranks; need 2")
    real_tp = [batch / p.real_step_s for p in points]
    sim_tp = [batch / p.sim_step_s for p in points]
    return Fidelity(
        model,
        batch,
        nproc,
        cluster.name,
        source,
        points,
        spearman(sim_tp, real_tp) if len(points) >= 2 else float("nan"),
        errors([p.sim_step_s for p in points], [p.real_step_s for p in points]),
        errors([p.sim_peak_bytes for p in points], [p.real_peak_bytes for p in points]),
    )


def fidelity_dict(f: Fidelity) -> dict[str, Any]:
    """``--json``: the statistics and every point (``spearman_rho_throughput`` null for one)."""
    rho = f.rho_throughput
    return {
        "model": f.model,
        "batch": f.batch,
        "nproc": f.nproc,
        "cluster": f.cluster,
        "memory_source": f.memory_source,
        "samples": len(f.points),
        "spearman_rho_throughput": None if math.isnan(rho) else rho,
        "step_time_error": {"median": f.step_time.median, "max": f.step_time.max},
        "peak_memory_error": {"median": f.peak_memory.median, "max": f.peak_memory.max},
        "points": [p._asdict() for p in f.points],
    }


def scatter_png(f: Fidelity, path: Path) -> None:
    """Simulated against real step time and peak memory, with the y = x line (matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ValidateError("the scatter plot needs matplotlib (pip install matplotlib)") from e
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    pairs = [
        (
            "step time (ms)",
            [p.real_step_s * 1e3 for p in f.points],
            [p.sim_step_s * 1e3 for p in f.points],
            f.step_time,
        ),
        (
            "peak memory (MiB)",
            [p.real_peak_bytes / 2**20 for p in f.points],
            [p.sim_peak_bytes / 2**20 for p in f.points],
            f.peak_memory,
        ),
    ]
    for ax, (what, real, sim, err) in zip(axes, pairs, strict=True):
        ax.scatter(real, sim, s=18)
        lo, hi = min(real + sim), max(real + sim)
        ax.plot([lo, hi], [lo, hi], color="grey", linewidth=0.8)
        ax.set_xlabel(f"real {what}")
        ax.set_ylabel(f"simulated {what}")
        ax.set_title(f"{what}: median error {100 * err.median:.1f}%, max {100 * err.max:.1f}%", fontsize=9)
    fig.suptitle(
        f"{f.model}, batch {f.batch}, {f.nproc} ranks, {len(f.points)} strategies on {f.cluster}: "
        f"Spearman ρ of throughput {f.rho_throughput:.3f}",
        fontsize=9,
    )
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    write_atomically(path, buf.getvalue())
