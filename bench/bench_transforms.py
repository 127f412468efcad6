"""Time to build + transform + simulate zoo models under D/T/P/K strategies (issue 5's bench).

    .venv/bin/python bench/bench_transforms.py            # the paper's GPT-2 sizes on 16 GPUs + GPT-3 on 1024
    .venv/bin/python bench/bench_transforms.py --quick    # smaller set, for a smoke run

Prints, per case: model build, distribute (autodiff + sharding + pipeline schedule), simulation and
the end-to-end wall time, with the predicted step time. Target: the 1024-device GPT-3-175B-size
program (d16 t8 p8 k128) end to end in under 2 s on the 2-core reference machine.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

os.environ.setdefault("OMP_NUM_THREADS", "1")

from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.simulate import simulate

CASES = [
    ("gpt2-1.6b", "d2.t4.p2.k8.1f1b", 512, "dgx2-v100"),
    ("gpt2-13b", "d1.t8.p2.k16.1f1b", 256, "dgx2-v100"),
    ("gpt2-175b", "d1.t8.p2.k32.1f1b", 256, "dgx2-v100"),
    ("gpt2-175b", "d16.t8.p8.k128.1f1b", 2048, "dgx-a100:128"),
]
QUICK = [
    ("gpt2-117m", "d2.t2.p4.k8.1f1b", 64, "dgx2-v100"),
    ("gpt2-1.6b", "d2.t4.p2.k8.1f1b", 512, "dgx2-v100"),
]


def run(model: str, strategy: str, batch: int, cluster: str) -> None:
    t0 = time.perf_counter()
    m = build_model(model, batch=batch)
    t1 = time.perf_counter()
    s = parse_strategy(strategy)
    prog = distribute(m, s, comm_streams=True)
    t2 = time.perf_counter()
    r = simulate(prog, parse_cluster(cluster), device_map(s, True), batch=batch)
    t3 = time.perf_counter()
    r = replace(r, model_flops=m.step_flops())  # MFU needs the model's FLOPs, which a program lacks
    mfu = "  n/a" if r.mfu is None else f"{100 * r.mfu:5.1f}"
    print(
        f"{model:10s} {strategy:22s} {s.devices:5d} GPUs  build {t1 - t0:6.3f}s  distribute {t2 - t1:6.3f}s  "
        f"simulate {t3 - t2:7.3f}s  total {t3 - t0:7.3f}s  | step {r.step_time_s:8.3f}s  "
        f"MFU {mfu}%  bubble {100 * r.bubble_fraction:5.1f}%  ops {r.n_ops}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    for case in QUICK if args.quick else CASES:
        run(*case)


if __name__ == "__main__":
    main()
