"""Simulated peak memory per GPU of data parallelism with ZeRO 0-3, against the ZeRO paper's
model-state formulas (Rajbhandari et al. 2020): with Adam under mixed precision, Ψ parameters and
N replicas, (2 + 2 + 12)Ψ, (2 + 2)Ψ + 12Ψ/N, 2Ψ + 14Ψ/N and 16Ψ/N bytes. The difference is what a
step holds beyond model state: activations, a gradient bucket (at least one weight's gradient,
and its copy on the reduction stream), the optimizer's transients for the largest weight and
ZeRO-3's gathered layers. Run:

    .venv/bin/python bench/bench_zero_memory.py [--model gpt:layers=36,hidden=4096,heads=32,seq=64] [--d 64]

The default model is a 7.66B-parameter GPT-like decoder (short sequences: activations small next
to the model state), bf16 with fp32 masters, one sample per replica, on 8 DGX-A100 nodes.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir.types import DType
from distir.parallel.distribute import DDP_BUCKET_MB, device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.simulate import simulate

GB = 1e9


def formula(zero: int, n: int) -> float:
    """Bytes of model state per parameter on one of ``n`` replicas, mixed-precision Adam."""
    return [16.0, 4 + 12 / n, 2 + 14 / n, 16 / n][zero]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt:layers=36,hidden=4096,heads=32,seq=64")
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--cluster", default="dgx-a100:8")
    ap.add_argument("--bucket-mb", type=float, default=DDP_BUCKET_MB)
    args = ap.parse_args()
    model = build_model(args.model, batch=args.d, dtype=DType.bf16)
    psi = model.num_params
    print(f"{args.model}: {psi / 1e9:.2f}B parameters, d={args.d}, Adam, bf16 + fp32 masters")
    # tensors: the peak less the runtime memory (context, workspaces, buffers, allocator reserve),
    # which the formulas do not count
    head = ("ZeRO", "tensors GB", "B/param", "formula GB", "diff GB", "with runtime GB", "step s", "sim s")
    widths = (4, 10, 8, 11, 8, 15, 7, 6)
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, widths, strict=True)))
    for zero in (0, 1, 2, 3):
        t0 = time.perf_counter()
        s = parse_strategy(f"d{args.d}.t1.p1.k1.1f1b" + (f".z{zero}" if zero else ""))
        prog = distribute(
            model, s, Optimizer("adam"), comm_streams=True, precision="mixed", bucket_mb=args.bucket_mb
        )
        cluster = parse_cluster(args.cluster)
        r = simulate(prog, cluster, device_map(s, True))
        g = max(r.peak_memory, key=r.peak_memory.__getitem__)
        full = r.peak_memory[g]
        peak = full - r.runtime_memory.get(g, 0.0)
        want = formula(zero, args.d) * psi
        print(
            f"{zero:>4} {peak / GB:>10.2f} {peak / psi:>8.3f} {want / GB:>11.2f} {(peak - want) / GB:>8.3f} "
            f"{full / GB:>15.2f} {r.step_time_s:>7.3f} {time.perf_counter() - t0:>6.1f}"
        )


if __name__ == "__main__":
    main()
