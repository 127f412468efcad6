"""What a trace costs at each ``--trace-detail`` level (docs/simulator.md's table): simulate
time with and without the trace, the detail built, slices, flows and the trace file's size.

    PYTHONPATH=src OMP_NUM_THREADS=1 python bench/bench_trace_detail.py [--model gpt2-1.6b]
        [--strategy d4.t1.p4.k8.1f1b] [--cluster dgx-a100:2] [--batch 64]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from distir.cli import _model_program, _SimSwitches
from distir.hardware.cluster import parse_cluster
from distir.limits import MAX_OPS
from distir.parallel.distribute import DDP_BUCKET_MB
from distir.sim.simulate import simulate
from distir.sim.trace import write_trace


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2-1.6b")
    ap.add_argument("--strategy", default="d4.t1.p4.k8.1f1b")
    ap.add_argument("--cluster", default="dgx-a100:2")
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    # as ``distir simulate --model`` builds it by default (trainer distir, no switches added)
    switches = _SimSwitches("distir", None, None, DDP_BUCKET_MB, False, False, False)
    built = _model_program(
        spec=a.model,
        strategy=a.strategy,
        batch=a.batch,
        train=True,
        optimizer="adam",
        dtype="bf16",
        debug=False,
        precision="mixed",
        cluster=a.cluster,
        tp_layout="declared",
        max_ops=MAX_OPS.max,
        switches=switches,
    )
    m, dmap, batch = built.module, built.device_map, built.batch
    cl = parse_cluster(a.cluster)
    t0 = time.perf_counter()
    simulate(m, cl, dmap, batch=batch)
    print(f"{a.model} {a.strategy} on {a.cluster}: simulate without a trace {time.perf_counter() - t0:.2f} s")
    head = ("detail", "simulate s", "detail s", "write s", "slices", "flows", "MB")
    print(" ".join(f"{h:>10}" for h in head))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "t.json"
        for level in ("chunk", "layer", "op"):
            t0 = time.perf_counter()
            r = simulate(m, cl, dmap, batch=batch, trace=True, trace_detail=level)
            t1 = time.perf_counter()
            d = r.trace_detail()
            t2 = time.perf_counter()
            write_trace(r, out)
            t3 = time.perf_counter()
            mb = out.stat().st_size / 1e6
            times = (f"{t1 - t0:.2f}", f"{t2 - t1:.2f}", f"{t3 - t2:.2f}")
            cells = (*times, len(d.slices), len(d.flows), f"{mb:.1f}")
            print(f"{level:>10} " + " ".join(f"{c:>10}" for c in cells))


if __name__ == "__main__":
    main()
