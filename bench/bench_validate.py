"""Fidelity on this machine: calibrate, then run ≥ 20 strategies of a small GPT training step for
real on 2 local ranks (gloo, one thread each) and simulate each on the calibrated profile;
report Spearman's ρ of throughput and the median/max error of step time and of peak memory
(memory: tracked bytes of live tensors on CPU). Targets (issue 18): ρ ≥ 0.9, median step-time
error ≤ 15%, median peak-memory error ≤ 10%. Run:

    .venv/bin/python bench/bench_validate.py [--profile profile.toml] [--samples 20] [--nproc 2]
        [--model gpt:layers=4,hidden=128,heads=4,seq=64,vocab=256] [--plot validate.png] [--realtime]

Without --profile it first runs `distir calibrate` (full sizes) into a temporary file. With
--nproc 4 on a machine with fewer cores the ranks are oversubscribed (stated in the output).
The load average is printed before and after: other processes on a shared machine slow the real
runs (both sides take the fastest step / batch, which only partly shields them). Two ranks that
meet at every collective on two cores lose the most: at load 1-2 (another process busy on a
core) the comm-heavy strategies' real steps came out 1.5-2.5x their time on an idle machine.
``--realtime`` runs this process and every rank it starts at SCHED_FIFO priority 1 (Linux;
needs root or CAP_SYS_NICE), so other processes do not preempt them (the kernel's real-time
throttling still leaves them 5% of the CPU); calibration and validation both run so.

Calibration and validation both hold the CPUs in their polling idle state
(``distir.backend.idle.poll_idle``: /dev/cpu_dma_latency held at 0; needs root), so that a rank
waiting in a collective wakes as fast on a quiet machine as on a busy one: on this VM an idle
virtual CPU halts at once (cpuidle-haltpoll, guest_halt_poll_ns=0) and its wake-up is an exit
to the host, which made the same collectives 2-4x slower on a quiet machine than on a loaded
one. ``--allow-idle`` leaves the idle states to the kernel (the old behaviour). The line
"CPU idle" says which held; give a --profile calibrated the same way.

``--passes N`` (default 2) runs the 20 strategies N times, one after the other, and takes each
strategy's fastest real step over the passes (each pass's figures are printed too): a burst of
load from another process then slows one pass of a strategy, not its figure. A run on this
2-core machine takes about 2.5 minutes (calibration 40 s, each pass of 20 strategies 60 s).
The command for the issue-18 figures, on a quiet machine:

    PYTHONPATH=src OMP_NUM_THREADS=1 .venv/bin/python bench/bench_validate.py --realtime --json validate.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from distir.backend.calibrate import CalibrateOptions, calibrate
from distir.backend.idle import idle_driver, poll_idle
from distir.backend.validate import Fidelity, fidelity_dict, scatter_png, validate
from distir.hardware.cluster import load_cluster_file
from distir.hardware.profile import profile_toml
from distir.report.fidelity import errors, spearman


def fastest(passes: list[Fidelity]) -> Fidelity:
    """The passes' points, each strategy's fastest real step (its simulation is the same in
    every pass), and their statistics."""
    points = [min(ps, key=lambda p: p.real_step_s) for ps in zip(*(f.points for f in passes), strict=True)]
    real = [p.real_step_s for p in points]
    sim = [p.sim_step_s for p in points]
    return passes[0]._replace(
        points=points,
        rho_throughput=spearman([1 / t for t in sim], [1 / t for t in real]),
        step_time=errors(sim, real),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", type=Path, default=None)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--model", default="gpt:layers=4,hidden=128,heads=4,seq=64,vocab=256")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--plot", type=Path, default=Path("validate.png"))
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--realtime", action="store_true", help="run at SCHED_FIFO priority 1 (see above)")
    ap.add_argument("--allow-idle", action="store_true", help="do not hold the CPUs' polling idle state")
    ap.add_argument("--passes", type=int, default=2, help="run every strategy this often (see above)")
    a = ap.parse_args()
    if a.realtime:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except (AttributeError, PermissionError, OSError) as e:
            raise SystemExit(f"bench_validate: --realtime: cannot set SCHED_FIFO ({e})") from None
        print("real-time: SCHED_FIFO priority 1 (this process and the ranks it starts)", flush=True)
    cpus = os.cpu_count() or 1
    print(f"load average before: {os.getloadavg()[0]:.2f} on {cpus} CPUs", flush=True)
    if a.allow_idle:
        print(f"CPU idle: as the kernel chooses ({idle_driver() or 'no cpuidle'})", flush=True)
    else:
        with poll_idle() as why:
            held = "polling (cpu_dma_latency 0 held)" if why is None else f"NOT held: {why}"
        print(f"CPU idle: {held} ({idle_driver() or 'no cpuidle'})", flush=True)
    profile = a.profile
    if profile is None:
        t0 = time.perf_counter()
        cal = calibrate(CalibrateOptions(nproc=a.nproc, poll_idle=not a.allow_idle))
        profile = Path(tempfile.mkdtemp(prefix="distir-bench-")) / "profile.toml"
        profile.write_text(profile_toml(cal), encoding="utf-8")
        print(f"calibrated in {time.perf_counter() - t0:.0f} s: {profile}", flush=True)
    cluster = load_cluster_file(profile)
    if a.nproc > cpus:
        print(f"oversubscribed: {a.nproc} ranks on {cpus} CPUs", flush=True)
    t0 = time.perf_counter()
    passes = []
    for i in range(max(1, a.passes)):
        passes.append(
            validate(
                a.model,
                a.samples,
                a.nproc,
                cluster,
                a.batch,
                a.steps,
                tick=lambda s: print(f"  {time.perf_counter() - t0:6.0f} s  ran {s}", flush=True),
                poll_idle=not a.allow_idle,
            )
        )
        g = passes[-1]
        print(
            f"pass {i + 1}: rho {g.rho_throughput:.3f}, step time error median "
            f"{100 * g.step_time.median:.1f}%, max {100 * g.step_time.max:.1f}% "
            f"(load average {os.getloadavg()[0]:.2f})",
            flush=True,
        )
    f = fastest(passes)
    scatter_png(f, a.plot)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(f"{'strategy':34} {'real ms':>9} {'sim ms':>9} {'real MiB':>9} {'sim MiB':>9}")
    for p in f.points:
        print(
            f"{p.strategy:34} {p.real_step_s * 1e3:9.1f} {p.sim_step_s * 1e3:9.1f} "
            f"{p.real_peak_bytes / 2**20:9.2f} {p.sim_peak_bytes / 2**20:9.2f}"
        )
    print(
        f"{len(f.points)} strategies of {f.model} (batch {f.batch}) on {f.nproc} ranks: "
        f"Spearman rho of throughput {f.rho_throughput:.3f}; step time error median "
        f"{100 * f.step_time.median:.1f}%, max {100 * f.step_time.max:.1f}%; peak memory error "
        f"median {100 * f.peak_memory.median:.1f}%, max {100 * f.peak_memory.max:.1f}% ({f.memory_source}); "
        f"plot {a.plot}"
    )
    if a.json is not None:
        a.json.write_text(json.dumps(fidelity_dict(f), indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
