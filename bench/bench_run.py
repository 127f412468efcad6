"""Real step times of a small GPT training step on 4 CPU ranks (``distir run``: gloo, spawned
processes, one torch thread each) under several strategies, each verified against the reference
executor. On a machine with fewer than 4 cores the ranks are oversubscribed (this is printed), so
the figures are the machine's, not a cluster's: they measure the backend, not the strategies.

    .venv/bin/python bench/bench_run.py [--model gpt:...] [--steps 5] [--ranks 4]

Prints, per strategy: verified, max abs error, median step time after the warm-up (the slowest
rank per step), and the largest per-rank peak of tracked live tensor bytes.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from distir.backend.launch import LaunchOptions, launch
from distir.backend.program import model_program, rank_programs
from distir.backend.verify import compare, reference_outputs

GPT = "gpt:layers=8,hidden=64,heads=4,seq=32,vocab=256"
STRATEGIES = {
    4: [
        "d4",
        "d4.z3",
        "t4.sp",
        "p4.k4.1f1b",
        "p4.k8.interleaved.v2",
        "p4.k4.zb1",
        "d2.t2.sp",
        "d2.p2.k4.1f1b",
        "t2.p2.k2.1f1b",
    ],
    2: ["d2", "d2.z3", "t2.sp", "p2.k2.1f1b", "p2.k4.interleaved.v2", "p2.k2.zb1"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=GPT)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=4, choices=sorted(STRATEGIES))
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    note = f"oversubscribed: {args.ranks} ranks on {cores} cores" if args.ranks > cores else f"{cores} cores"
    print(f"{args.model}, global batch {args.batch}, {args.ranks} gloo ranks ({note}), {args.steps} steps")
    strategies = STRATEGIES[args.ranks]
    progs = [model_program(args.model, s, args.batch) for s in strategies]
    jobs = [rank_programs(p, args.steps) for p in progs]
    t0 = time.perf_counter()
    results = launch([[j[r] for j in jobs] for r in range(args.ranks)], LaunchOptions(timeout_s=600))
    wall = time.perf_counter() - t0
    print(f"{'strategy':<24} {'verified':>8} {'max abs err':>12} {'step ms':>9} {'peak KiB':>9}")
    for k, (s, p) in enumerate(zip(strategies, progs, strict=True)):
        mine = [rank[k] for rank in results]
        v = compare(p.module, reference_outputs(p.module, p.args), {r.device: r.outputs for r in mine})
        per_step = [max(ts) for ts in zip(*(r.step_times for r in mine), strict=True)]
        steady = sorted(per_step[1:] or per_step)
        median = steady[len(steady) // 2]
        peak = max(r.peak_memory_bytes for r in mine)
        print(f"{s:<24} {v.verified!s:>8} {v.max_abs_error:>12.2e} {median * 1e3:>9.2f} {peak / 1024:>9.1f}")
    print(f"launch wall time (spawn, all strategies, all steps): {wall:.1f} s")


if __name__ == "__main__":
    main()
