"""Compute microbenchmarks for ``distir calibrate``: registry ops timed on torch.

Each case names a registry op (its family, FLOPs, bytes and GEMM shape come from the op's cost
descriptors, so the fit is in the cost model's own terms) and the eager PyTorch kernel that runs
it (``torch.matmul`` for MatMul, ``F.scaled_dot_product_attention`` for Attention, ...). Cases
cover matrix products over (M, N, K) shapes, elementwise ops, row-wise ops (Softmax,
LayerNormalization, their gradients, the loss), reductions and attention, over sizes and dtypes.

Timing (``time_call``): one warm-up call, then batches of calls sized to last about
``batch_s`` each; the time is the fastest of ``repeats`` batches' time per call (on a shared
machine other processes only ever add time; on CUDA, each batch ends with
``torch.cuda.synchronize``).

Sizes stop at 2^20 elements per tensor (4 MiB in f32): the sizes of the steps ``distir
validate`` runs on a CPU. Beyond them a CPU slows down (every eager op's output is fresh memory
the kernel must fault in page by page: 1-7 GB/s against 30 GB/s below, on the machine this was
written on), which one memory bandwidth per family cannot describe; profiles are for the
measured range. Inputs are random normal
tensors made once per case. The caller sets the thread count (``torch.set_num_threads``).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from distir.backend import require_torch
from distir.hardware.fit import GemmSample, OpSample
from distir.hardware.gemm import GemmShape
from distir.ir.types import Device, DType, TensorType
from distir.ir.values import Attrs
from distir.ops.registry import REGISTRY

Kernel = Callable[[Any, Sequence[Any]], Any]
"""``kernel(torch, inputs)``: runs the op once on torch tensors."""


class Case(NamedTuple):
    """One op at one size: the registry op, its input shapes, attributes, the torch kernel and
    which inputs are integer class labels (drawn in [0, shape[-1] of input 0))."""

    op: str
    shapes: tuple[tuple[int, ...], ...]
    attrs: tuple[tuple[str, Any], ...]
    kernel: Kernel
    labels: tuple[int, ...] = ()


class Sizes(NamedTuple):
    """The sweep: GEMM (M, N, K) per dtype kind, elementwise sizes, row-wise (rows, cols),
    attention (B, S, heads, head dim)."""

    gemm: tuple[tuple[int, int, int], ...]
    gemm_low: tuple[tuple[int, int, int], ...]  # for 16-bit dtypes (slow on CPUs)
    elementwise: tuple[int, ...]
    rows: tuple[tuple[int, int], ...]
    attention: tuple[tuple[int, int, int, int], ...]


FULL = Sizes(
    gemm=(
        (128, 128, 128),
        (256, 256, 256),
        (512, 512, 512),
        (1024, 1024, 1024),
        (2048, 512, 512),
        (512, 2048, 128),
        (64, 1024, 1024),
        (1024, 64, 1024),
        (256, 256, 2048),
        (1536, 1536, 512),
    ),
    gemm_low=((128, 128, 128), (256, 256, 256), (512, 512, 512), (512, 128, 1024), (768, 768, 256)),
    elementwise=(1 << 10, 1 << 13, 1 << 16, 1 << 18, 1 << 20),
    rows=((64, 1024), (256, 1024), (1024, 1024)),
    attention=((1, 128, 4, 64), (2, 256, 4, 64), (1, 512, 8, 64)),
)

QUICK = Sizes(
    gemm=((32, 32, 32), (64, 64, 64), (128, 128, 128), (256, 128, 64), (64, 256, 128)),
    gemm_low=((32, 32, 32), (64, 64, 64), (128, 64, 128)),
    elementwise=(1 << 8, 1 << 12, 1 << 16, 1 << 18),
    rows=((16, 256), (64, 512), (256, 1024)),
    attention=((1, 64, 2, 32), (1, 128, 4, 32)),
)


def _sdpa(torch: Any, x: Sequence[Any]) -> Any:
    q, k, v = (t.transpose(1, 2) for t in x)  # BSHD → BHSD, as a view
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def _cases(sizes: Sizes, low: bool) -> list[Case]:
    """Every case of ``sizes`` (``low``: the GEMM shapes for 16-bit dtypes)."""
    out: list[Case] = [
        Case("MatMul", ((m, k), (k, n)), (), lambda t, x: t.matmul(x[0], x[1]))
        for m, n, k in (sizes.gemm_low if low else sizes.gemm)
    ]
    for n in (1, *sizes.elementwise):
        out.append(Case("Add", ((n,), (n,)), (), lambda t, x: t.add(x[0], x[1])))
    for n in sizes.elementwise:
        out.append(Case("Mul", ((n,), (n,)), (), lambda t, x: t.mul(x[0], x[1])))
        out.append(Case("Gelu", ((n,),), (), lambda t, x: t.nn.functional.gelu(x[0])))
        out.append(Case("Exp", ((n,),), (), lambda t, x: t.exp(x[0])))
        out.append(Case("GeluGrad", ((n,), (n,)), (), lambda t, x: t.ops.aten.gelu_backward(x[0], x[1])))
    for r, c in sizes.rows:
        out.append(Case("Softmax", ((r, c),), (("axis", -1),), lambda t, x: t.softmax(x[0], -1)))
        out.append(
            Case(
                "LayerNormalization",
                ((r, c), (c,), (c,)),
                (("axis", -1),),
                lambda t, x: t.nn.functional.layer_norm(x[0], x[0].shape[-1:], x[1], x[2]),
            )
        )
        out.append(
            Case(
                "SoftmaxGrad",
                ((r, c), (r, c)),
                (("axis", -1),),
                lambda t, x: t.ops.aten._softmax_backward_data(x[0], x[1], -1, x[0].dtype),
            )
        )
        out.append(
            Case("ReduceSum", ((r, c),), (("axes", (-1,)),), lambda t, x: t.sum(x[0], -1, keepdim=True))
        )
        out.append(
            Case(
                "SoftmaxCrossEntropyLoss",
                ((r, c), (r,)),
                (),
                lambda t, x: t.nn.functional.cross_entropy(x[0], x[1]),
                labels=(1,),
            )
        )
    for b, s, h, d in sizes.attention:
        out.append(Case("Attention", ((b, s, h, d),) * 3, (("causal", True),), _sdpa))
    return out


class CaseCost(NamedTuple):
    family: str
    flops: float
    nbytes: float
    gemm: GemmShape | None


def case_cost(case: Case, dtype: DType) -> CaseCost:
    """The case's family, FLOPs, bytes and GEMM shape as the registry counts them."""
    op = REGISTRY[case.op]
    ins = [
        TensorType(DType.i64 if i in case.labels else dtype, s, Device(0)) for i, s in enumerate(case.shapes)
    ]
    attrs = Attrs(dict(case.attrs))
    outs = op.infer_types(ins, attrs, [None] * len(ins))
    nbytes = op.bytes_read(ins, outs, attrs) + op.bytes_written(ins, outs, attrs)
    gemm = op.gemm(ins, outs, attrs) if op.gemm is not None else None
    return CaseCost(op.family, op.flops(ins, outs, attrs), nbytes, gemm)


def time_call(fn: Callable[[], Any], sync: Callable[[], None], batch_s: float, repeats: int) -> float:
    """Seconds per call of ``fn`` (see the module docstring)."""
    t0 = time.perf_counter()
    fn()
    sync()
    first = max(time.perf_counter() - t0, 1e-7)
    calls = max(1, min(10_000, math.ceil(batch_s / first)))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / calls)
    return min(times)


class Timing(NamedTuple):
    """What ``run_cases`` measured: GEMM samples, other op samples, the 1-element Add's time."""

    gemm: list[GemmSample]
    ops: list[OpSample]
    launch_s: float


def plan(sizes: Sizes, dtypes: Sequence[DType]) -> list[tuple[Case, DType]]:
    """Every (case, dtype) to time, in order."""
    return [(c, dt) for dt in dtypes for c in _cases(sizes, dt in (DType.bf16, DType.f16))]


def run_cases(
    work: Sequence[tuple[Case, DType]],
    device: str = "cpu",
    batch_s: float = 0.02,
    repeats: int = 5,
    tick: Callable[[str], None] | None = None,
) -> Timing:
    """Time every (case, dtype) of ``work`` on ``device``; ``tick(label)`` after each."""
    torch = require_torch()
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    gen = torch.Generator(device="cpu").manual_seed(0)
    gemm: list[GemmSample] = []
    ops: list[OpSample] = []
    launch = math.inf
    for case, dt in work:
        cost = case_cost(case, dt)
        tdt = getattr(
            torch, {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "f64": "float64"}[dt.name]
        )
        xs = []
        for i, s in enumerate(case.shapes):
            if i in case.labels:
                xs.append(torch.randint(0, case.shapes[0][-1], s, generator=gen).to(dev))
            else:
                xs.append(torch.randn(s, generator=gen).to(dev, tdt))
        secs = time_call(functools.partial(case.kernel, torch, xs), sync, batch_s, repeats)
        if cost.gemm is not None:
            gemm.append(GemmSample(cost.gemm, dt.name, cost.flops, secs))
        elif math.prod(case.shapes[0]) == 1:
            launch = min(launch, secs)
        else:
            ops.append(OpSample(case.op, cost.family, dt.name, cost.flops, cost.nbytes, secs))
        if tick is not None:
            tick(f"{case.op} {'x'.join(map(str, case.shapes[0]))} {dt.name}")
    return Timing(gemm, ops, launch if math.isfinite(launch) else 0.0)
