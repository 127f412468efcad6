"""Where a strategy's real step and its simulation differ: one strategy of the validation GPT run
for real on local ranks with per-op traces (as ``distir run --trace``) and simulated with a trace
on a calibrated profile (as ``distir simulate --trace``), each rank's time summed by op (compute
ops by name, communication by pattern; a rank's batched point-to-point operations are one real
slice, counted under the first): the real op's wall and CPU time against the simulated.
"between ops" is the real step's time outside any op slice (the rank loop's bookkeeping, and
time preempted); the simulation counts the rank loop in each op's launch time. Run:

    .venv/bin/python bench/bench_validate_gap.py --profile profile.toml [--strategy d1.t2.p1.k4.1f1b.rfull]
        [--model gpt:layers=4,hidden=128,heads=4,seq=64,vocab=256] [--batch 8] [--steps 4]

The real figures are the last step's (steps before it warm up); on a shared machine other
processes inflate the wall times (the CPU times less so): state the load average with them.

"arrivals" (when every rank issued the same collectives): per collective call, how far apart
the ranks entered it (their step clocks aligned on the calls' ends, which a collective makes
simultaneous) and how long it took past the last arrival, for calls the ranks entered together
(within 20 µs) and apart (over 100 µs, one rank waiting asleep): what a call costs as a step
meets it, against the simulated time per call.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

from distir.backend.idle import poll_idle
from distir.backend.launch import LaunchOptions, launch
from distir.backend.program import model_program, rank_programs
from distir.hardware.cluster import load_cluster_file
from distir.sim.cost import RooflineCostModel
from distir.sim.simulate import simulate


def _key(name: str, comm: bool) -> str:
    return f"comm {name.removeprefix('rank.')}" if comm else name


def _arrivals(results: list[Any], sim_per_call: float) -> None:
    """The "arrivals" lines of the module docstring (nothing when the ranks' calls differ)."""
    calls = [
        [x for x in r.slices if x.category == "comm" and "Send" not in x.name and "Recv" not in x.name]
        for r in results
    ]
    if len(calls) < 2 or not calls[0] or any(len(c) != len(calls[0]) for c in calls):
        return
    offsets = [statistics.median(a.end - b.end for a, b in zip(calls[0], c, strict=True)) for c in calls]
    skew, past = [], []
    for parts in zip(*calls, strict=True):
        starts = [x.start + off for x, off in zip(parts, offsets, strict=True)]
        ends = [x.end + off for x, off in zip(parts, offsets, strict=True)]
        skew.append(max(starts) - min(starts))
        past.append(statistics.median(ends) - max(starts))
    print(f"arrivals: {len(skew)} calls, skew median {statistics.median(skew) * 1e6:.0f} µs, ", end="")
    print(f"{sum(k < 20e-6 for k in skew)} within 20 µs; simulated {sim_per_call * 1e6:.0f} µs per call")
    for lo, hi in ((0.0, 20e-6), (100e-6, math.inf)):
        sel = [p for k, p in zip(skew, past, strict=True) if lo <= k < hi]
        if sel:
            print(
                f"  skew {'< 20' if lo == 0 else '> 100'} µs: {len(sel)} calls, past the last arrival ",
                end="",
            )
            print(f"median {statistics.median(sel) * 1e6:.0f} µs, mean {statistics.mean(sel) * 1e6:.0f} µs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", type=Path, required=True)
    ap.add_argument("--strategy", default="d1.t2.p1.k4.1f1b.rfull")
    ap.add_argument("--model", default="gpt:layers=4,hidden=128,heads=4,seq=64,vocab=256")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--allow-idle", action="store_true", help="do not hold the CPUs' polling idle state")
    a = ap.parse_args()
    cluster = load_cluster_file(a.profile)
    prog = model_program(a.model, a.strategy, a.batch)
    jobs = [[j] for j in rank_programs(prog, a.steps, True)]
    if a.allow_idle:  # as calibrate and validate measure: the CPUs polling when idle, unless told
        results = [g[0] for g in launch(jobs, LaunchOptions())]
    else:
        with poll_idle() as why:
            print(f"CPU idle: {'polling (cpu_dma_latency 0 held)' if why is None else f'NOT held: {why}'}")
            results = [g[0] for g in launch(jobs, LaunchOptions())]
    cost = RooflineCostModel(cluster, fuse=False)
    sim = simulate(prog.module, cluster, None, cost, batch=a.batch, trace=True)
    per_step = [max(ts) for ts in zip(*(r.step_times for r in results), strict=True)]
    print(f"load average {os.getloadavg()[0]:.2f}; {a.strategy}: real steps (ms, slowest rank)", end=" ")
    print([round(t * 1e3, 1) for t in per_step], f"simulated {sim.step_time_s * 1e3:.1f} ms")
    assert sim.slices is not None
    sim_calls = [t1 - t0 for name, t0, t1, slot, comm in sim.slices if comm and slot == 0]
    _arrivals(results, statistics.median(sim_calls) if sim_calls else 0.0)
    for rank, r in enumerate(results):
        real: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        for s in r.slices:
            row = real[_key(s.name.split("+")[0], s.category == "comm")]
            row[0] += 1
            row[1] += s.end - s.start
            row[2] += s.cpu
        simd: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for name, t0, t1, slot, comm in sim.slices:
            if slot == rank:
                row = simd[_key(name, comm)]
                row[0] += 1
                row[1] += t1 - t0
        inside = sum(v[1] for v in real.values())
        step = r.step_times[-1]
        print(f"rank {rank}: real step {step * 1e3:.1f} ms, in ops {inside * 1e3:.1f}, between ops ", end="")
        busy_ms, comm_ms = sim.busy_s[rank] * 1e3, sim.comm_s[rank] * 1e3
        print(f"{(step - inside) * 1e3:.1f}; simulated busy {busy_ms:.1f}, comm {comm_ms:.1f}")
        head = ("op", "real n", "wall ms", "cpu ms", "sim n", "sim ms", "real-sim")
        widths = (6, 8, 8, 6, 8, 9)
        print(f"  {head[0]:30} " + " ".join(f"{h:>{w}}" for h, w in zip(head[1:], widths, strict=True)))
        for k in sorted(set(real) | set(simd), key=lambda k: -abs(real[k][1] - simd[k][1])):
            rr, ss = real[k], simd[k]
            print(
                f"  {k[:30]:30} {rr[0]:6.0f} {rr[1] * 1e3:8.2f} {rr[2] * 1e3:8.2f} {ss[0]:6.0f} "
                f"{ss[1] * 1e3:8.2f} {(rr[1] - ss[1]) * 1e3:9.2f}"
            )


if __name__ == "__main__":
    main()
