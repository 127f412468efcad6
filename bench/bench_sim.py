"""Simulator throughput.

1. Flat programs of 10k, 100k and 1M ops (matmul/GELU/add blocks round-robin over 8 devices with a
   Send between blocks): wall time of ``simulate`` (type propagation, costing, memory liveness and
   the timing loop — everything after parsing), ops/s, and the slope of a least-squares line
   through (ops, seconds): cost per op, to show linear growth.
2. A layered training program: 96 transformer-sized layers in 8 pipeline stages, 128 microbatches,
   forward and backward as calls of per-layer functions (GPipe order, Sends between stages):
   wall time (target < 1 s on this 2-core machine).
3. The same kind of program as a DTensor program (simulated directly, SPMD): 8 pipeline stages,
   each on its own mesh (dp=16, tp=8: 1024 devices in all), Megatron-style layer functions with
   Redistributes inside, called per microbatch, activations moved between stages by MeshSend.
   ``--spmd-dp 128`` gives meshes of dp=128, tp=8 (8192 devices).

    .venv/bin/python bench/bench_sim.py [--max-ops 1000000] [--spmd-dp 16]
"""

from __future__ import annotations

import argparse
import gc
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from distir.hardware.cluster import Cluster, parse_cluster
from distir.ir import Device, DTensorType, DType, Function, FunctionBuilder, Mesh, Module, TensorType, Value
from distir.ir.dtensor import parse_placements
from distir.ops import REGISTRY
from distir.ops.dist import format_mesh_attr
from distir.sim.simulate import simulate


def flat_program(n_ops: int, n_dev: int = 8, batch: int = 64, hidden: int = 1024) -> Module:
    fb = FunctionBuilder("flat", REGISTRY.out_arity)
    devs = [Device(i) for i in range(n_dev)]
    ws = [fb.param(f"w{i}", TensorType(DType.f16, (hidden, hidden), d)) for i, d in enumerate(devs)]
    x = fb.param("x", TensorType(DType.f16, (batch, hidden), devs[0]))
    blocks = n_ops // 5
    for b in range(blocks):
        d = b % n_dev
        (h,) = fb.op("MatMul", x, ws[d])
        (h,) = fb.op("Gelu", h)
        (h,) = fb.op("Add", h, x)
        (h,) = fb.op("Relu", h)
        (x,) = fb.op("Send", h, dst=devs[(d + 1) % n_dev])
    return Module((fb.ret(x),))


def layered_program(
    layers: int = 96, stages: int = 8, micro: int = 128, batch: int = 4, seq: int = 1024, hidden: int = 2048
) -> Module:
    """Per-layer forward/backward functions; stage functions call them; the entry runs GPipe."""
    per_stage = layers // stages
    t = DType.f16

    def layer_fwd() -> Function:
        fb = FunctionBuilder("layer_fwd", REGISTRY.out_arity)
        w1, w2, x = fb.param("w1"), fb.param("w2"), fb.param("x")
        (h,) = fb.op("MatMul", x, w1)
        (h,) = fb.op("Gelu", h)
        (y,) = fb.op("MatMul", h, w2)
        (y,) = fb.op("Add", y, x)
        return fb.ret(y, h)

    def layer_bwd() -> Function:
        fb = FunctionBuilder("layer_bwd", REGISTRY.out_arity)
        w1, w2, x, h, dy = (fb.param(n) for n in ("w1", "w2", "x", "h", "dy"))
        (w2t,) = fb.op("Transpose", w2)
        (dh,) = fb.op("MatMul", dy, w2t)
        (dh,) = fb.op("GeluGrad", dh, h)
        (w1t,) = fb.op("Transpose", w1)
        (dx,) = fb.op("MatMul", dh, w1t)
        (dx,) = fb.op("Add", dx, dy)
        (xt,) = fb.op("Transpose", x, perm=[0, 2, 1])
        (dw1,) = fb.op("MatMul", xt, dh)
        (dw1,) = fb.op("ReduceSum", dw1, axes=[0], keepdims=0)
        return fb.ret(dx, dw1)

    fwd = layer_fwd()
    bwd = layer_bwd()
    fns = [fwd, bwd]
    stage_f: list[Function] = []
    stage_b: list[Function] = []
    for s in range(stages):
        fb = FunctionBuilder(f"stage{s}_fwd", REGISTRY.out_arity)
        ws = [(fb.param(f"w1_{i}"), fb.param(f"w2_{i}")) for i in range(per_stage)]
        x = fb.param("x")
        acts: list[Value] = []
        for w1, w2 in ws:
            acts.append(x)
            x, h = fb.call(fwd, w1, w2, x)
            acts.append(h)
        stage_f.append(fb.ret(x, *acts))
        fb = FunctionBuilder(f"stage{s}_bwd", REGISTRY.out_arity)
        ws = [(fb.param(f"w1_{i}"), fb.param(f"w2_{i}")) for i in range(per_stage)]
        act_params = [fb.param(f"a{i}") for i in range(2 * per_stage)]
        dy = fb.param("dy")
        grads = []
        for i in reversed(range(per_stage)):
            w1, w2 = ws[i]
            dy, dw = fb.call(bwd, w1, w2, act_params[2 * i], act_params[2 * i + 1], dy)
            grads.append(dw)
        stage_b.append(fb.ret(dy, *grads))
    fns += stage_f + stage_b
    fb = FunctionBuilder("train", REGISTRY.out_arity)
    devs = [Device(i) for i in range(stages)]
    wts = [
        [
            (
                fb.param(f"s{s}w1_{i}", TensorType(t, (hidden, 4 * hidden), devs[s])),
                fb.param(f"s{s}w2_{i}", TensorType(t, (4 * hidden, hidden), devs[s])),
            )
            for i in range(per_stage)
        ]
        for s in range(stages)
    ]
    xs = [fb.param(f"x{m}", TensorType(t, (batch, seq, hidden), devs[0])) for m in range(micro)]
    saved: dict[tuple[int, int], tuple[Value, ...]] = {}
    outs = []
    for m in range(micro):  # GPipe: all forwards, then all backwards
        x = xs[m]
        for s in range(stages):
            res = fb.call(stage_f[s], *[w for pair in wts[s] for w in pair], x)
            x = res[0]
            saved[(m, s)] = res[1:]
            if s + 1 < stages:
                (x,) = fb.op("Send", x, dst=devs[s + 1])
        outs.append(x)
    grads = []
    for m in range(micro):
        dy = outs[m]
        for s in reversed(range(stages)):
            res = fb.call(stage_b[s], *[w for pair in wts[s] for w in pair], *saved[(m, s)], dy)
            dy = res[0]
            grads.extend(res[1:])
            if s > 0:
                (dy,) = fb.op("Send", dy, dst=devs[s - 1])
    return Module((*fns, fb.ret(*grads[-per_stage * stages :])))


def spmd_program(
    stages: int = 8,
    dp: int = 16,
    tp: int = 8,
    layers: int = 96,
    micro: int = 128,
    batch: int = 64,
    seq: int = 1024,
    hidden: int = 2048,
) -> Module:
    """A D/T/P pipeline as a DTensor program: one (dp, tp) mesh per stage; untyped layer
    functions (column/row-parallel MLP forward and backward, with the tensor-parallel all-reduces
    and the data-parallel gradient all-reduce as Redistributes) called on every stage's mesh;
    MeshSend between stages; GPipe order."""
    per_stage = layers // stages
    t = DType.f16

    fb = FunctionBuilder("layer_fwd", REGISTRY.out_arity)
    w1, w2, x = fb.param("w1"), fb.param("w2"), fb.param("x")
    (h,) = fb.op("MatMul", x, w1)
    (a,) = fb.op("Gelu", h)
    (y,) = fb.op("MatMul", a, w2)
    (y,) = fb.op("Redistribute", y, to="S(0), R")
    (y,) = fb.op("Add", y, x)
    fwd = fb.ret(y, h)

    fb = FunctionBuilder("layer_bwd", REGISTRY.out_arity)
    w1, w2, x, h, dy = (fb.param(n) for n in ("w1", "w2", "x", "h", "dy"))
    (w2t,) = fb.op("Transpose", w2)
    (dh,) = fb.op("MatMul", dy, w2t)
    (dh,) = fb.op("GeluGrad", dh, h)
    (w1t,) = fb.op("Transpose", w1)
    (dx,) = fb.op("MatMul", dh, w1t)
    (dx,) = fb.op("Redistribute", dx, to="S(0), R")
    (dx,) = fb.op("Add", dx, dy)
    (xt,) = fb.op("Transpose", x, perm=[0, 2, 1])
    (dw1,) = fb.op("MatMul", xt, dh)
    (dw1,) = fb.op("ReduceSum", dw1, axes=[0], keepdims=0)
    (dw1,) = fb.op("Redistribute", dw1, to="R, S(1)")
    bwd = fb.ret(dx, dw1)

    fb = FunctionBuilder("train", REGISTRY.out_arity)
    n = dp * tp
    meshes = [
        Mesh((("dp", dp), ("tp", tp)), tuple(Device(s * n + i) for i in range(n))) for s in range(stages)
    ]

    def dt(shape: tuple[int, ...], s: int, places: str) -> DTensorType:
        return DTensorType(t, shape, meshes[s], parse_placements(places))

    wts = [
        [
            (
                fb.param(f"s{s}w1_{i}", dt((hidden, 4 * hidden), s, "R, S(1)")),
                fb.param(f"s{s}w2_{i}", dt((4 * hidden, hidden), s, "R, S(0)")),
            )
            for i in range(per_stage)
        ]
        for s in range(stages)
    ]
    xs = [fb.param(f"x{m}", dt((batch, seq, hidden), 0, "S(0), R")) for m in range(micro)]
    saved: dict[tuple[int, int], list[Value]] = {}
    outs = []
    for m in range(micro):
        x = xs[m]
        for s in range(stages):
            acts: list[Value] = []
            for w1, w2 in wts[s]:
                acts.append(x)
                x, h = fb.call(fwd, w1, w2, x)
                acts.append(h)
            saved[(m, s)] = acts
            if s + 1 < stages:
                (x,) = fb.op("MeshSend", x, mesh=format_mesh_attr(meshes[s + 1]))
        outs.append(x)
    grads = []
    for m in range(micro):
        dy = outs[m]
        for s in reversed(range(stages)):
            acts = saved[(m, s)]
            for i in reversed(range(per_stage)):
                w1, w2 = wts[s][i]
                dy, dw = fb.call(bwd, w1, w2, acts[2 * i], acts[2 * i + 1], dy)
                grads.append(dw)
            if s > 0:
                (dy,) = fb.op("MeshSend", dy, mesh=format_mesh_attr(meshes[s - 1]))
    return Module((fwd, bwd, fb.ret(*grads[-per_stage * stages :])))


def timing_loop_seconds(m: Module, cluster: Cluster) -> float:
    """Seconds of running an already compiled plan alone (the timing loop and the memory peaks),
    on the plan ``simulate`` builds (a flat entry: the compact one)."""
    from distir.interp.shapes import entry_args
    from distir.sim.cost import RooflineCostModel
    from distir.sim.devices import DeviceMap
    from distir.sim.plan import PlanDomain, PlanOptions
    from distir.sim.simulate import _program_devices, _run

    dmap = DeviceMap.default(_program_devices(m, m.entry), cluster.num_devices)
    cost = RooflineCostModel(cluster)
    domain = PlanDomain(m, dmap, cost, PlanOptions(entry_param_uses=False, entry_memory_columns=True))
    plan = domain.plan(m.entry, entry_args(m.entry))
    t0 = time.perf_counter()
    _run(plan, domain, cluster, dmap, False, None)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--max-ops", type=int, default=1_000_000)
    ap.add_argument("--spmd-dp", type=int, default=16, help="data-parallel size of each stage's mesh")
    args = ap.parse_args()
    cluster = parse_cluster("dgx-a100:1")
    points = []
    for n in (10_000, 100_000, 1_000_000):
        if n > args.max_ops:
            break
        m = flat_program(n)
        gc.collect()
        t0 = time.perf_counter()
        r = simulate(m, cluster)
        dt = time.perf_counter() - t0
        loop_s = timing_loop_seconds(m, cluster)
        points.append((r.n_ops, dt))
        print(
            f"flat {r.n_ops:>9,} ops: {dt:7.3f} s  {r.n_ops / dt:>10,.0f} ops/s end to end"
            f"   (timing loop alone {r.n_ops / loop_s:>12,.0f} ops/s; step {r.step_time_s * 1e3:.2f} ms)"
        )
        del m, r
    if len(points) >= 2:
        n_mean = sum(p[0] for p in points) / len(points)
        t_mean = sum(p[1] for p in points) / len(points)
        slope = sum((n - n_mean) * (t - t_mean) for n, t in points) / sum(
            (n - n_mean) ** 2 for n, _ in points
        )
        print(f"fitted slope: {slope * 1e6:.3f} µs per op ({1 / slope:,.0f} ops/s marginal)")
    m = layered_program()
    t0 = time.perf_counter()
    r = simulate(m, cluster, batch=4 * 128)
    dt = time.perf_counter() - t0
    print(
        f"layered: 96 layers x 128 microbatches x 8 stages = {r.n_ops:,} ops in {dt:.3f} s "
        f"(step {r.step_time_s:.3f} s, bubble {100 * r.bubble_fraction:.1f}%, "
        f"peak memory {max(r.peak_memory.values()) / 2**30:.1f} GiB)"
    )

    m = spmd_program(dp=args.spmd_dp)
    devices = 8 * args.spmd_dp * 8
    big = parse_cluster(f"dgx-a100:{devices // 8}")
    t0 = time.perf_counter()
    r = simulate(m, big, batch=64 * 128)
    dt = time.perf_counter() - t0
    print(
        f"spmd: 8 stages x mesh(dp={args.spmd_dp}, tp=8) = {devices} devices, 96 layers x 128 microbatches, "
        f"{r.n_ops:,} DTensor ops in {dt:.3f} s (step {r.step_time_s:.3f} s, "
        f"bubble {100 * r.bubble_fraction:.1f}%, peak memory {max(r.peak_memory.values()) / 2**30:.1f} GiB)"
    )


if __name__ == "__main__":
    main()
