"""Context parallelism inside ``distribute``: the ring against the all-gather form, and the
screen against the exact simulation (issue 17). Prints figures; asserts nothing
(``tests/search/test_trends.py`` holds the 128K-token trend, ``tests/sim/test_ring.py`` the ring's
times).

For Llama-3 8B at a 128K sequence (bf16, mixed precision, Adam) on 16 and 64 H100s, the search
(top 8) and, for every exactly simulated plan with c > 1: the screen's step time, the exact
step time with attention as a ring (K/V passed rank to rank on ``cp``, each transfer overlapped
with a step's blocks: ``distir.sim.ring``), and the exact step time of the same plan built with
K/V all-gathered over cp (``distribute(..., cp_ring=False)``: the gather, then the attention of
the rank's queries over all keys, then dK/dV reduce-scattered — nothing overlapped); with each
its exposed communication (mean over the compute streams). Then the screen's error over the CP
plans and the ring's speed-up over the gather.

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python bench/bench_context_ring.py [--cases 0 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from distir.autodiff.precision import Precision
from distir.ir.types import DType
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.parallel.trainers import trainer_semantics
from distir.search.chunk_times import chunk_times
from distir.search.rerank import ExactJob, _cluster, _model
from distir.search.run import SearchRequest, search
from distir.sim.simulate import SimResult, simulate

CASES = [
    ("llama3-8b:seq=131072", "h100:2", 16),  # 16 H100s
    ("llama3-8b:seq=131072", "h100:8", 64),  # 64 H100s
]


def exact(job: ExactJob, strategy: str, cp_ring: bool) -> SimResult:
    """``distir.search.rerank.evaluate``'s program and simulation, with the ring or the gather."""
    s = parse_strategy(strategy)
    model, cluster = _model(job, s.t), _cluster(job.cluster)
    spec, form = job.form()
    dt = DType.parse(job.dtype)
    times = chunk_times(model, spec, cluster, dt, True, s, True, False, form)
    sem = trainer_semantics(job.trainer, s, Precision.parse(job.precision), dt, cluster.nodes[0].device, True)
    prog = distribute(
        model,
        s,
        sem.optimizer(job.optimizer),
        comm_streams=True,
        precision=job.precision,
        chunk_times=times,
        cp_ring=cp_ring,
        sac_eager=sem.kernels == "eager",
        **sem.switches(),
    )
    return simulate(prog, cluster, device_map(s, True), batch=job.batch)


def exposed_comm(r: SimResult) -> float:
    compute = [i for i, slot in enumerate(r.slots) if slot.stream == "compute"]
    return sum(r.comm_s[i] for i in compute) / max(len(compute), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, nargs="*", default=list(range(len(CASES))))
    ap.add_argument("--top", type=int, default=8)
    a = ap.parse_args()
    errors: list[float] = []
    speedups: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in a.cases:
            model, cluster, batch = CASES[i]
            t0 = time.perf_counter()
            req = SearchRequest(
                model=model,
                cluster=cluster,
                batch=batch,
                dtype="bf16",
                precision="mixed",
                top=a.top,
                store=Path(tmp) / f"s{i}.sqlite",
            )
            out = search(req)
            job = ExactJob(model, cluster, batch, True, "adam", "bf16", "mixed")
            plain = next((e for e in out.screened if e.fits and e.strategy.c == 1), None)
            print(f"\n{model} on {cluster}, batch {batch} (search {time.perf_counter() - t0:.0f} s)")
            if plain is not None:
                print(f"  best screened plan without CP: {plain.strategy} {plain.step_time_s:.1f} s (screen)")
            print(
                f"  {'strategy':44} {'screen':>8} {'ring':>8} {'exposed':>8} {'gather':>8} {'exposed':>8}"
                f" {'screen/ring':>11} {'gather/ring':>11}"
            )
            for row in out.results:
                s = parse_strategy(str(row["strategy"]))
                if s.c == 1 or row["source"] != "simulated":
                    continue
                ring = exact(job, str(s), True)
                gather = exact(job, str(s), False)
                scr = float(row["screen_step_time_s"])
                errors.append(scr / ring.step_time_s - 1)
                speedups.append(gather.step_time_s / ring.step_time_s)
                print(
                    f"  {s!s:44} {scr:8.2f} {ring.step_time_s:8.2f} {exposed_comm(ring):8.2f}"
                    f" {gather.step_time_s:8.2f} {exposed_comm(gather):8.2f}"
                    f" {scr / ring.step_time_s:11.3f} {gather.step_time_s / ring.step_time_s:11.3f}"
                )
    if errors:
        print(
            f"\nscreen vs exact (ring) over {len(errors)} CP plans: median |error| "
            f"{statistics.median(abs(e) for e in errors):.1%}, range {min(errors):+.1%} … {max(errors):+.1%}"
        )
        print(
            f"ring speed-up over the gather: median {statistics.median(speedups):.3f}x, "
            f"range {min(speedups):.3f} … {max(speedups):.3f}x"
        )


if __name__ == "__main__":
    main()
