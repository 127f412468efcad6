"""Ring attention (context parallelism, ``distir.parallel.context``) simulated on one DGX-A100
node: step time of the forward + backward of one causal attention, sequential vs c = 2, 4, 8
ranks, with the ring's Sends blocking the compute stream or on their own streams (overlapping
the attention blocks), and the peak memory per GPU (with the preset's fixed runtime memory: CUDA
context, NCCL buffers, workspaces). Run:

    PYTHONPATH=src .venv/bin/python bench/bench_ring_attention.py [--seq 32768] [--heads 32]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import distir
from distir.hardware.cluster import parse_cluster
from distir.ir import Device, DType, FunctionBuilder, Module, TensorType
from distir.parallel.context import RingShape, ring_attention, ring_device_map
from distir.sim.simulate import simulate


def sequential(shape: RingShape) -> Module:
    fb = FunctionBuilder("sequential")
    q = TensorType(shape.dtype, (shape.batch, shape.seq, shape.heads, shape.head_dim), Device(0))
    k = TensorType(shape.dtype, (shape.batch, shape.seq, shape.kv_heads, shape.head_dim), Device(0))
    qv, kv, vv, dov = (fb.param(n, t) for n, t in (("q", q), ("k", k), ("v", k), ("dout", q)))
    o, lse = fb.op("Attention", qv, kv, vv, names=["o", "lse"], causal=True)
    g = fb.op("AttentionGrad", dov, qv, kv, vv, o, lse, names=["dq", "dk", "dv"], causal=True)
    return distir.check(Module((fb.ret(o, lse, *g),)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--cluster", default="dgx-a100")
    a = ap.parse_args()
    shape = RingShape(1, a.seq, a.heads, a.head_dim, a.kv_heads, DType.bf16)
    cl = parse_cluster(a.cluster)
    base = simulate(sequential(shape), cl)
    print(f"{a.cluster}, causal attention fwd+bwd, S={a.seq}, h={a.heads}, h_kv={a.kv_heads}, bf16")
    print(f"  c=1: {base.step_time_s * 1e3:8.2f} ms, peak {max(base.peak_memory.values()) / 2**20:8.1f} MiB")
    for c in (2, 4, 8):
        row = []
        for streams in (False, True):
            r = simulate(ring_attention(shape, c, streams), cl, ring_device_map(c, streams))
            row.append(r)
        mem = max(row[1].peak_memory.values()) / 2**20
        print(
            f"  c={c}: {row[0].step_time_s * 1e3:8.2f} ms blocking sends, "
            f"{row[1].step_time_s * 1e3:8.2f} ms on ring streams "
            f"(ideal {base.step_time_s / c * 1e3:.2f}), peak {mem:8.1f} MiB"
        )


if __name__ == "__main__":
    main()
