"""Per-layer cost of ``transgan-hetero`` (AMP's TransGAN generator): forward FLOPs, bytes moved
and the cost model's forward/backward times per layer. Prints figures; asserts nothing
(``tests/frontends/test_zoo.py`` checks the blocks' FLOPs in closed form).

    PYTHONPATH=src .venv/bin/python bench/bench_transgan_layers.py [MODEL] [CLUSTER] [MICROBATCH]

Defaults: ``transgan-hetero`` on one p3.8xlarge GPU (V100), microbatch 1, f32.
"""

from __future__ import annotations

import os
import sys

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

from distir.frontends.zoo.model import Model  # noqa: E402
from distir.frontends.zoo.registry import build_model, parse_model_string  # noqa: E402
from distir.hardware.cluster import parse_cluster  # noqa: E402
from distir.interp.loop import interpret  # noqa: E402
from distir.interp.shapes import TypeDomain, entry_args, type_of  # noqa: E402
from distir.ir.ops import Op  # noqa: E402
from distir.ir.types import DType, TensorType  # noqa: E402
from distir.ops.registry import REGISTRY  # noqa: E402
from distir.search.profile import cached_profiler  # noqa: E402


def layer_costs(m: Model) -> list[tuple[str, tuple[int, ...], float, float, float]]:
    """Per layer call: (callee, activation shape in, forward FLOPs, MatMul FLOPs, bytes moved)."""
    _, env = interpret(m.module, m.forward, entry_args(m.forward), TypeDomain())
    out = []
    for call in m.layers:
        fn = m.module[call.callee]
        _, inner = interpret(m.module, fn, [type_of(env[v]) for v in call.inputs], TypeDomain())
        flops = mm = moved = 0.0
        for op in fn.body:
            assert isinstance(op, Op)
            ins = [type_of(inner[v]) for v in op.inputs]
            outs = [type_of(inner[v]) for v in op.outputs]
            d = REGISTRY[op.name]
            f = d.flops(ins, outs, op.attrs)
            flops += f
            mm += f if op.name == "MatMul" else 0.0
            moved += d.bytes_read(ins, outs, op.attrs) + d.bytes_written(ins, outs, op.attrs)
        x = type_of(env[call.inputs[0]])
        assert isinstance(x, TensorType)
        out.append((call.callee, x.shape, flops, mm, moved))
    return out


def main() -> None:
    spec = sys.argv[1] if len(sys.argv) > 1 else "transgan-hetero"
    cluster = sys.argv[2] if len(sys.argv) > 2 else "p3.8xlarge:1"
    b = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    m = build_model(spec, b)
    prof = cached_profiler(parse_model_string(spec), parse_cluster(cluster), DType.f32, True)
    times = prof.layers(1, b, [0], "none")
    print(f"{spec}, microbatch {b}, f32, {cluster} GPU 0: per layer")
    cols = ("GFLOP", "matmul", "GB moved", "fwd ms", "bwd ms")
    print(f"{'#':>3} {'layer':8s} {'input':>18s} " + " ".join(f"{c:>8s}" for c in cols))
    for i, (name, shape, f, mm, moved) in enumerate(layer_costs(m)):
        t = times[i]
        print(
            f"{i:3d} {name:8s} {shape!s:>18s} {f / 1e9:8.3f} {mm / 1e9:8.3f} {moved / 1e9:8.3f} "
            f"{t.fwd_s * 1e3:8.2f} {t.bwd_s * 1e3:8.2f}"
        )


if __name__ == "__main__":
    main()
