"""Data parallelism as DDP / DeepSpeed / FSDP run it, checked against the ZeRO paper's formulas
(Rajbhandari et al. 2020, §3 and §5): per-device model state with Adam is, for Ψ parameters,
N data-parallel replicas and K bytes of optimizer state per parameter,

- mixed precision (bf16 compute copy 2Ψ, bf16 gradients 2Ψ, K = 12: fp32 master, m, v):
  ZeRO-0 (2 + 2 + K)Ψ, ZeRO-1 (2 + 2)Ψ + KΨ/N, ZeRO-2 2Ψ + (2 + K)Ψ/N, ZeRO-3 (2 + 2 + K)Ψ/N;
- pure fp32 (weights 4Ψ, gradients 4Ψ, K = 8: m, v) alike.

The simulated peak must lie between the formula and the formula plus what a step holds beyond
model state, bounded independently: two gradient buckets (one filling, one in flight on the
reduction stream), the optimizer's transients for the largest weight (its new weight and state
made before the old are freed, the fp32 gradient), two gathered layers (ZeRO-3's prefetch) and
the MLP's activations. The models are MLPs of many small layers, so that bound is a small share
of the state — smaller than a whole gradient, which ZeRO-2/3 must therefore never hold."""

from __future__ import annotations

from itertools import pairwise

import pytest

from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir.dtensor import DTensorType, Partial
from distir.ir.ops import Call, Op
from distir.ir.types import DType
from distir.parallel.check import check_against_sequential
from distir.parallel.distribute import DDP_BUCKET_MB, STREAMS, device_map, distribute
from distir.parallel.strategy import StrategyError, parse_strategy
from distir.sim.simulate import simulate

BUCKET_MB = 0.25
MODELS = {"mlp:layers=64,hidden=256": (64, 256), "mlp:layers=128,hidden=320": (128, 320)}


def zero_formula(zero: int, n: int, mixed: bool) -> float:
    """Bytes per parameter of model state on one of ``n`` replicas (module docstring)."""
    w, g, k = (2, 2, 12) if mixed else (4, 4, 8)
    return [w + g + k, w + g + k / n, w + (g + k) / n, (w + g + k) / n][zero]


def tensor_peak(spec: str, strategy: str, mixed: bool) -> tuple[float, int, float]:
    """(simulated peak tensor bytes on the busiest GPU, Ψ, the transient bound in bytes) of
    ``spec`` under ``strategy``; the runtime memory (CUDA context, workspaces, allocator reserve)
    is not the formulas' business."""
    s = parse_strategy(strategy)
    dtype = DType.bf16 if mixed else DType.f32
    mb = 2
    model = build_model(spec, batch=mb * s.d * s.k, dtype=dtype)
    prog = distribute(
        model,
        s,
        Optimizer("adam"),
        comm_streams=True,
        precision="mixed" if mixed else "pure",
        bucket_mb=BUCKET_MB,
    )
    r = simulate(prog, parse_cluster("dgx-a100"), device_map(s, True))
    layers, hidden = MODELS[spec]
    largest = hidden * hidden
    bound = (
        2 * BUCKET_MB * (1 << 20)
        + 16 * largest  # new fp32 weight, m, v (12) and the fp32 gradient (4) of one weight
        + 2 * 2 * largest * dtype.itemsize  # two gathered layers (ZeRO-3), and their stream copies
        + 4 * mb * hidden * layers * dtype.itemsize  # activations: input and output of each layer, twice
    )
    tensors = max(r.peak_memory[g] - r.runtime_memory[g] for g in r.peak_memory)
    return tensors, model.num_params, bound


def _peak(spec: str, zero: int, d: int, k: int, mixed: bool) -> tuple[float, int, float]:
    return tensor_peak(spec, f"d{d}.t1.p1.k{k}.1f1b" + (f".z{zero}" if zero else ""), mixed)


@pytest.mark.slow
@pytest.mark.parametrize("mixed", [True, False], ids=["mixed", "pure"])
@pytest.mark.parametrize("d", [2, 4, 8])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("spec", list(MODELS))
def test_zero_peak_memory_follows_the_formulas(spec: str, zero: int, d: int, mixed: bool) -> None:
    peak, psi, bound = _peak(spec, zero, d, 2, mixed)
    want = zero_formula(zero, d, mixed) * psi
    assert want <= peak <= want + bound, f"peak {peak / psi:.3f} B/param, formula {want / psi:.3f}"
    if zero >= 2:  # no replica holds the whole gradient: with it, the peak would exceed this
        grads = (2 if mixed else 4) * psi
        assert peak < want + grads * (1 - 1 / d)
        assert bound < grads * (1 - 1 / d)  # the check above can fail


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_one_microbatch_keeps_the_compute_copy_and_the_gradients(zero: int) -> None:
    """Without gradient accumulation too: the bf16 copy persists through the backward (a step
    input, updated in place after the optimizer), so it never trades places with the gradients."""
    spec = "mlp:layers=64,hidden=256"
    peak, psi, bound = _peak(spec, zero, 4, 1, True)
    want = zero_formula(zero, 4, True) * psi
    assert want <= peak <= want + bound


@pytest.mark.slow
@pytest.mark.parametrize("opt", ["sgd", "adam"])
@pytest.mark.parametrize(
    "strategy",
    [
        "d2.t1.p1.k2.1f1b",
        "d2.t1.p1.k3.1f1b.z1",
        "d2.t1.p2.k2.1f1b.z2",
        "d2.t2.p1.k2.gpipe.z3",
        "d2.t1.p2.k2.zb1.z2",
        "d2.t1.p2.k2.zb1",
    ],
)
@pytest.mark.parametrize("streams", [False, True], ids=["one-stream", "comm-streams"])
def test_bucketed_gradient_reduction_equals_the_sequential_step(
    strategy: str, opt: str, streams: bool
) -> None:
    """Buckets far smaller than a layer's gradients (one reduction per weight, in the backward):
    the loss and every update agree with the sequential step."""
    s = parse_strategy(strategy)
    model = build_model("gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64", batch=2 * s.d * s.k)
    optimizer = Optimizer(opt, lr=0.1 if opt == "sgd" else 0.01)
    cmp = check_against_sequential(model, s, optimizer, bucket_mb=1e-4, comm_streams=streams)
    err, where = cmp.update_error()
    assert err < 1e-4, f"{strategy} {opt}: {where} differs by {err:.2e}"


def test_gradients_are_reduced_inside_the_backward() -> None:
    """ZeRO-2: every backward reduce-scatters its buckets between layer backwards, on the
    ``dp_reduce`` stream; the entry reduces nothing itself and no gradient it hands the optimizer
    is a pending sum."""
    s = parse_strategy("d2.t1.p1.k2.1f1b.z2")
    model = build_model("mlp:layers=4,hidden=64", batch=8)
    prog = distribute(model, s, Optimizer("adam"), comm_streams=True, bucket_mb=64 * 64 * 4 / (1 << 20))
    n = s.devices
    reduce_devs = {(STREAMS.index("dp_reduce") + 1) * n + i for i in range(n)}
    for name in ("c0_bwd_red", "c0_bwd_acc_red"):
        body = prog[name].body
        calls = [i for i, x in enumerate(body) if isinstance(x, Call)]
        reds = [i for i, x in enumerate(body) if isinstance(x, Op) and x.name == "Redistribute"]
        assert len(reds) == 4 and reds[0] < calls[-1]  # the first bucket before the last layer
    sends = [x for x in prog["c0_bwd_red"].body if isinstance(x, Op) and x.name == "MeshSend"]
    assert sends and all(
        str(x.attrs["mesh"]).endswith(", ".join(f"d{i}" for i in sorted(reduce_devs))) for x in sends
    )
    entry_reds = [
        x for x in prog.entry.ops() if x.name == "Redistribute" and x.outputs[0].name.startswith("g_")
    ]
    assert not entry_reds
    from distir.interp.shapes import TypeDomain, infer_types, type_of

    _, env = infer_types(prog, domain=TypeDomain(concrete_limit=0))
    for op in prog.entry.ops():
        if op.name == "Adam":
            t = type_of(env[op.inputs[1]])
            assert isinstance(t, DTensorType) and not any(isinstance(p, Partial) for p in t.placements)


def test_reductions_on_a_stream_overlap_the_backward() -> None:
    """DDP on two nodes (gradients cross the network): with the buckets reduced on their own
    stream the step is shorter than with every reduction blocking compute."""
    s = parse_strategy("d16.t1.p1.k1.1f1b")
    model = build_model("mlp:layers=16,hidden=1024", batch=16 * 8, dtype=DType.bf16)
    cluster = parse_cluster("dgx-a100:2")
    times = {}
    for streams in (False, True):
        prog = distribute(model, s, Optimizer("adam"), comm_streams=streams, bucket_mb=2.0, precision="mixed")
        times[streams] = simulate(prog, cluster, device_map(s, streams)).step_time_s
    assert times[True] < 0.9 * times[False], times


def test_bucket_size_must_be_positive() -> None:
    model = build_model("mlp:layers=2,hidden=8", batch=4)
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(StrategyError, match="bucket"):
            distribute(model, parse_strategy("d2.t1.p1.k1.1f1b"), bucket_mb=bad)
    assert DDP_BUCKET_MB == 25.0


def test_zero3_prefetches_the_next_layer_on_the_gather_stream() -> None:
    """FSDP: in the forward and the backward, the next layer's weights are all-gathered (on the
    ``dp_gather`` stream) before this layer runs, and handed to the compute stream right before
    the layer that reads them."""
    s = parse_strategy("d2.t1.p1.k1.1f1b.z3")
    model = build_model("mlp:layers=3,hidden=64", batch=4)
    prog = distribute(model, s, Optimizer("adam"), comm_streams=True)
    n = s.devices
    gather_devs = ", ".join(f"d{(STREAMS.index('dp_gather') + 1) * n + i}" for i in range(n))
    for name in ("c0_fwd", "c0_bwd_red"):
        body = prog[name].body
        weight_of: dict[object, object] = {}  # a value on its way -> the weight shard it gathers
        issue: dict[object, int] = {}  # weight -> where its shard leaves for the gather stream
        take: dict[object, int] = {}  # weight -> where its gathered copy comes back
        for j, x in enumerate(body):
            if not isinstance(x, Op):
                continue
            if x.name == "MeshSend" and str(x.attrs["mesh"]).endswith(gather_devs):
                issue[x.inputs[0]] = j
                weight_of[x.outputs[0]] = x.inputs[0]
            elif x.name == "Redistribute" and x.inputs[0] in weight_of:
                weight_of[x.outputs[0]] = weight_of[x.inputs[0]]
            elif x.name == "MeshSend" and x.inputs[0] in weight_of:
                take[weight_of[x.inputs[0]]] = j
        assert len(issue) == len(take) == 3, name
        order = sorted(take, key=take.__getitem__)
        for a, b in pairwise(order):
            runs = next(j for j in range(take[a], len(body)) if isinstance(body[j], Call))  # a's layer
            assert issue[b] < runs < take[b], (name, a, b)
