"""``distir calibrate``: measure this machine and fit the cost model to it.

``calibrate(options)`` runs the compute microbenchmarks (``distir.backend.microbench``) in this
process with ``threads`` threads, then the communication benchmarks
(``distir.backend.commbench``) across ``nproc`` spawned processes of one thread each, and fits
(``distir.hardware.fit``):

1. the launch overhead: the time of a 1-element Add (every op is timed as a step runs it: on
   operands cycled through a pool larger than the core's private cache, with fresh results;
   ``distir.backend.microbench``);
2. the GEMM curve and the peak FLOP/s per dtype (matrix products);
3. the memory bandwidth: the highest bytes per second of the Adds of the first dtype that take at
   least twice the launch overhead (bytes over time less the launch overhead; the highest, since
   other processes only ever slow a sample);
4. per op family (elementwise, nn, grad, reduce, loss, attention): FLOP and memory efficiencies
   and a launch time, against those peaks and that bandwidth; and the same per op measured at
   ``OP_FIT_SAMPLES`` points or more, written under the op's name: one family's ops do not cost
   alike (a LayerNormalizationGrad's torch implementation runs several kernels where a GeluGrad
   runs one, so per byte it takes several times as long), which one family fit averages away;
5. per collective and for point-to-point: the link (B, α) of its alpha-beta formula. A
   collective whose times do not fit (they do not grow with the message size: noise swamped
   them) is left out of the profile, with the reason in ``Calibration.skipped`` and in the file;
   it then runs on the point-to-point link. Point-to-point itself must fit;
6. the rank loop (``distir.backend.dispatch``, unless ``insitu=False``): synthetic chains run
   through the real worker loop measure what an op, a collective call and a send cost there
   beyond their tight-loop times; ``distir.backend.insitu.apply`` adds them to the launch
   times and link latencies;
7. the in-situ check (with step 6): small training steps, on one and on two ranks, run for real
   and simulated on the profile; listed in the profile's comments, nothing fitted to them.

The result is a ``distir.hardware.profile.Calibration``; ``profile_toml`` writes it as a cluster
file. ``--quick`` uses tiny sizes and short timings (under a minute; figures for smoke tests, not
for decisions). On a machine with CUDA the compute benchmarks run on GPU 0 and the
communication on NCCL over the first ``nproc`` GPUs (one profile per run; a node with several GPU
types is profiled once per type with ``CUDA_VISIBLE_DEVICES`` selecting it). This path is written
for CUDA but only the CPU path has run (there is no GPU here).

``progress(total)`` returns a callback ``tick(label)``; the CLI draws a rich progress bar with it.
"""

from __future__ import annotations

import datetime
import os
import platform
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from distir.backend import commbench as cb
from distir.backend import dispatch, idle, insitu, require_torch
from distir.backend import microbench as mb
from distir.hardware.cluster import Cluster
from distir.hardware.fit import (
    FamilyFit,
    FitError,
    LinkFit,
    LinkSample,
    OpSample,
    fit_family,
    fit_gemm,
    fit_link,
)
from distir.hardware.profile import QUICK, Calibration, Measurements
from distir.ir.types import DType
from distir.sim import collectives as coll


class CalibrationError(RuntimeError):
    """Calibration could not run or fit (names the step and the reason)."""


@dataclass(frozen=True, slots=True)
class CalibrateOptions:
    """``dtypes``: compute dtypes (f32 must be one); ``nproc``: processes for communication;
    ``quick``: tiny sizes; ``threads``: compute threads; ``comm_sizes``: message bytes;
    ``insitu``: measure the rank interpreter's overheads and check on real training steps;
    ``poll_idle``: on a CPU, hold the CPUs in their polling idle state while measuring
    (``distir.backend.idle``: a waiting rank's wake-up then costs the same at any load)."""

    dtypes: tuple[DType, ...] = (DType.f32, DType.bf16)
    nproc: int = 2
    quick: bool = False
    threads: int = 1
    comm_sizes: tuple[int, ...] | None = None
    insitu: bool = True
    poll_idle: bool = True

    def sizes(self) -> tuple[int, ...]:
        if self.comm_sizes is not None:
            return self.comm_sizes
        if self.quick:
            return (1 << 10, 1 << 15, 1 << 19, 1 << 21)
        return (1 << 10, 1 << 13, 1 << 16, 1 << 19, 1 << 21, 1 << 23)


Progress = Callable[[int], Callable[[str], None]]


def _memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 16 << 30


def _send(cluster: Cluster, nbytes: float, gpus: Sequence[int]) -> float:
    """A point-to-point send from the group's first GPU to its last."""
    return coll.send_time(cluster, nbytes, gpus[0], gpus[-1])


_COSTS: dict[str, Callable[..., float]] = {
    "allreduce": coll.allreduce_time,
    "allgather": coll.allgather_time,
    "reducescatter": coll.reducescatter_time,
    "broadcast": coll.broadcast_time,
    "p2p": _send,
}


def _measure(
    options: CalibrateOptions, device: str, progress: Progress | None
) -> tuple[mb.Timing, list[LinkSample]]:
    """The compute timings (this process, ``options.threads`` threads) and the communication
    timings (``options.nproc`` spawned ranks)."""
    torch = require_torch()
    work = mb.plan(mb.QUICK if options.quick else mb.FULL, options.dtypes)
    comm = cb.comm_plan(options.nproc, options.sizes())
    tick = progress(len(work) + len(comm)) if progress is not None else None
    threads = torch.get_num_threads()
    torch.set_num_threads(options.threads)
    try:
        timing = mb.run_cases(
            work,
            device,
            batch_s=0.005 if options.quick else 0.002,
            repeats=3 if options.quick else 15,
            tick=tick,
        )
    finally:
        torch.set_num_threads(threads)
    try:
        links = cb.run_comm(
            options.nproc,
            options.sizes(),
            device,
            0.01 if options.quick else 0.02,
            tick,
            rounds=3 if options.quick else 7,
        )
    except cb.CommBenchError as e:
        raise CalibrationError(f"calibrate: {e}") from None
    return timing, links


OP_FIT_SAMPLES = 4  # an op measured at this many (size, dtype) points is fitted on its own too


def _bandwidth(adds: Sequence[OpSample], launch_s: float) -> float:
    """The memory bandwidth (B/s): the highest bytes per second of the Adds that take at least
    twice the launch overhead (bytes over time less the launch), so that a sample whose time is
    mostly its launch cannot divide by a near-zero remainder; without such an Add, the largest
    one's bytes over its whole time."""
    if not adds:
        raise CalibrationError("calibrate: no Add was timed, so the memory bandwidth is unknown")
    slow = [s for s in adds if s.seconds >= 2 * launch_s]
    if not slow:
        big = max(adds, key=lambda s: s.nbytes)
        return big.nbytes / big.seconds
    return max(s.nbytes / (s.seconds - launch_s) for s in slow)


def _fit_families(
    samples: Sequence[OpSample], peak: Callable[[str], float], bandwidth: float
) -> dict[str, FamilyFit]:
    """Rates per cost class, then per op measured at ``OP_FIT_SAMPLES`` points or more (keyed
    by the op's name; the cost model takes an op's own rates before its class's)."""
    out: dict[str, FamilyFit] = {}
    for fam in sorted({s.family for s in samples}):
        out[fam] = fit_family([s for s in samples if s.family == fam], peak, bandwidth)
    for op in sorted({s.op for s in samples}):
        mine = [s for s in samples if s.op == op]
        if len(mine) >= OP_FIT_SAMPLES and op not in out:
            out[op] = fit_family(mine, peak, bandwidth)
    return out


def _fit_links(samples: list[LinkSample]) -> tuple[dict[str, LinkFit], dict[str, str]]:
    """The fitted link of every collective and of p2p; those that do not fit, and why."""
    links: dict[str, LinkFit] = {}
    skipped: dict[str, str] = {}
    for name in cb.COLLECTIVES:
        try:
            links[name] = fit_link([s for s in samples if s.collective == name], _COSTS[name])
        except FitError as e:
            if name == "p2p":
                raise CalibrationError(f"calibrate: {e}") from None
            skipped[name] = str(e)
    return links, skipped


def _pool_note(device: str) -> str:
    """How the ops were timed (``microbench``: operands cycled through a pool, fresh results)."""
    pool = mb.default_pool(device)
    if pool <= 0:
        return ""
    return f", ops on operands cycled through {pool / 2**20:.3g} MiB with fresh results (as a step runs them)"


def calibrate(options: CalibrateOptions, progress: Progress | None = None) -> Calibration:
    """Measure and fit (see the module docstring); on a CPU with ``options.poll_idle``, inside
    ``distir.backend.idle.poll_idle`` (the profile's setup says whether it held)."""
    torch = require_torch()
    if torch.cuda.is_available() or not options.poll_idle:
        return _calibrate(options, progress, "")
    with idle.poll_idle() as why:
        note = (
            ", CPU idle: polling (cpu_dma_latency 0)"
            if why is None
            else f", CPU idle states not held ({why})"
        )
        return _calibrate(options, progress, note)


def _calibrate(options: CalibrateOptions, progress: Progress | None, idle_note: str) -> Calibration:
    if DType.f32 not in options.dtypes:
        raise CalibrationError("calibrate: --dtypes must include f32 (the device's base peak)")
    torch = require_torch()
    cuda = bool(torch.cuda.is_available())
    if cuda and options.nproc > torch.cuda.device_count():
        raise CalibrationError(
            f"calibrate: --nproc {options.nproc} needs as many GPUs; "
            f"this node has {torch.cuda.device_count()}"
        )
    timing, links_raw = _measure(options, "cuda" if cuda else "cpu", progress)
    gemm = fit_gemm(timing.gemm, timing.launch_s)
    first = options.dtypes[0].name
    adds = [s for s in timing.ops if s.op == mb.BANDWIDTH_OP and s.dtype == first]
    bandwidth = _bandwidth(adds, timing.launch_s)
    peak = gemm.peak
    families = _fit_families(timing.ops, lambda dt: peak.get(dt, peak["f32"]), bandwidth)
    links, skipped = _fit_links(links_raw)
    name = torch.cuda.get_device_name(0) if cuda else (platform.processor() or platform.machine() or "cpu")
    setup = (
        f"torch {torch.__version__}, {'nccl' if cuda else 'gloo'}, {options.nproc} ranks x 1 thread, "
        f"compute on {options.threads} thread{'s' if options.threads > 1 else ''}"
        f"{', ' + QUICK if options.quick else ''}{_pool_note('cuda' if cuda else 'cpu')}{idle_note}"
    )
    cal = Calibration(
        socket.gethostname(),
        datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        setup,
        f"{'GPU' if cuda else 'CPU'} {name}",
        options.nproc,
        int(torch.cuda.get_device_properties(0).total_memory) if cuda else _memory_bytes(),
        timing.launch_s,
        bandwidth,
        gemm,
        families,
        links,
        skipped,
        Measurements(tuple(timing.gemm), tuple(timing.ops), tuple(links_raw)),
    )
    return _in_situ(cal, options, progress) if options.insitu else cal


def _in_situ(cal: Calibration, options: CalibrateOptions, progress: Progress | None) -> Calibration:
    """``cal`` with the rank loop's overheads, and the in-situ check (steps 6 and 7 of the
    module docstring)."""
    programs = insitu.QUICK if options.quick else insitu.PROGRAMS
    tick = progress(len(programs) + 5) if progress is not None else None
    d = dispatch.measure(cal, n=40 if options.quick else 200, steps=3 if options.quick else 8, tick=tick)
    out = insitu.apply(cal, insitu.Overheads(d.op_s, d.collective_s, d.p2p_s, d.arrival_s))
    samples = insitu.measure(out, steps=3 if options.quick else 6, tick=tick, programs=programs)
    return out._replace(measurements=out.measurements._replace(insitu=tuple(samples)))
