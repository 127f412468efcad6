"""Throughput of the DistIR core on a generated program of >= 200k ops.

Prints ops/s for: verification (structure + op signatures, no execution), type/shape propagation
(mixed abstract/concrete interpretation), printing and parsing. Run:

    .venv/bin/python bench/bench_ir.py [--ops 200000]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import distir
from distir.interp.shapes import infer_types
from distir.ir import Device, DType, FunctionBuilder, Module, TensorType, parse_module, print_module
from distir.ops import REGISTRY

OPS_PER_BLOCK = 14


def build(n_ops: int, n_devices: int = 4, hidden: int = 64, batch: int = 32) -> Module:
    """A long straight-line program: transformer-ish blocks round-robin over devices, with
    dynamic reshapes (Shape → Gather → Concat → Reshape), Sends between devices and an
    AllReduce every block."""
    fb = FunctionBuilder("bench", REGISTRY.out_arity)
    devs = [Device(i) for i in range(n_devices)]
    ws = [fb.param(f"w{i}", TensorType(DType.f32, (hidden, hidden), d)) for i, d in enumerate(devs)]
    x = fb.param("x", TensorType(DType.f32, (batch, hidden), devs[0]))
    minus1 = fb.op("Constant", value=[-1], device=devs[0])[0]
    blocks = max(1, n_ops // OPS_PER_BLOCK)
    for b in range(blocks):
        d = b % n_devices
        w = ws[d]
        (h,) = fb.op("MatMul", x, w)
        (h,) = fb.op("Gelu", h)
        (h,) = fb.op("Add", h, x)
        (s,) = fb.op("Shape", h)
        (one,) = fb.op("Constant", value=1, device=devs[d])
        (dim,) = fb.op("Gather", s, one, axis=0)
        (dim,) = fb.op("Unsqueeze", dim, axes=[0])
        (m1,) = fb.op("Constant", value=[-1], device=devs[d])
        (shape,) = fb.op("Concat", m1, dim, axis=0)
        (h,) = fb.op("Reshape", h, shape)
        a, c = fb.op("Split", h, dim=1, num_splits=2)
        (h,) = fb.op("Concat", a, c, axis=1)
        nxt = devs[(b + 1) % n_devices]
        (x,) = fb.op("Send", h, dst=nxt)
        (x,) = fb.op("Relu", x)
    del minus1
    return Module((fb.ret(x),))


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:>12,.0f} ops/s  ({seconds:.2f} s)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ops", type=int, default=200_000)
    args = ap.parse_args()
    t0 = time.perf_counter()
    m = build(args.ops)
    n = sum(len(f.body) for f in m.functions)
    t1 = time.perf_counter()
    print(f"program: {n:,} ops ({t1 - t0:.2f} s to build)")
    distir.verify(m)
    t2 = time.perf_counter()
    print(f"verify (structure + signatures): {rate(n, t2 - t1)}")
    (out,), _ = infer_types(m)
    t3 = time.perf_counter()
    print(f"type/shape propagation (mixed):  {rate(n, t3 - t2)}   -> {out}")
    text = print_module(m)
    t4 = time.perf_counter()
    print(f"print:                           {rate(n, t4 - t3)}   ({len(text) / 1e6:.1f} MB)")
    m2 = parse_module(text)
    t5 = time.perf_counter()
    print(f"parse:                           {rate(n, t5 - t4)}")
    assert sum(len(f.body) for f in m2.functions) == n


if __name__ == "__main__":
    main()
