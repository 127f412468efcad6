"""distribute(..., fp8_weight_cache=True): Transformer Engine's FP8 weight cache as Megatron-Core
runs it (``distir.parallel.fp8_cache``). Each linear weight is cast to float8 once per step and
the copy is what every chunk call reads: the step computes what the uncached step computes (the
same casts of the same tensors), within float8's tolerance of the sequential step; the program
has one weight cast per cached weight, and a pipeline stage holds one float8 copy of its weights
instead of one per microbatch in flight."""

from __future__ import annotations

import math

import numpy as np
import pytest

from distir.autodiff.precision import FP8, FP8_DELAYED, MIXED
from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir.dtensor import DTensorType
from distir.ir.function import Module
from distir.ir.ops import Call, Op
from distir.ir.rewrite import inline_calls
from distir.ir.types import DType
from distir.ir.values import Value
from distir.parallel.check import check_against_sequential
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import StrategyError, parse_strategy
from distir.parallel.trainers import trainer_semantics
from distir.sim.cost import RooflineCostModel
from distir.sim.simulate import simulate

LLAMA = "llama:layers=4,hidden=8,heads=2,kv_heads=1,ffn=16,seq=4,vocab=16"
GPT = "gpt:layers=4,hidden=8,heads=2,seq=4,vocab=16"
F8 = "fp8-delayed"


def _results(spec: str, strategy: str, cache: bool, **options: bool) -> tuple[dict[str, tuple], Module]:
    s = parse_strategy(strategy)
    model = build_model(spec, batch=s.k * s.d, dtype=DType.bf16)
    opt = Optimizer("adam", lr=0.01)
    cmp = check_against_sequential(model, s, opt, precision=F8, fp8_weight_cache=cache, **options)
    return cmp.results, cmp.distributed


@pytest.mark.parametrize(
    ("spec", "strategy", "og"),
    [
        (LLAMA, "d2.t1.p1.k2.1f1b", False),
        (LLAMA, "d2.t1.p1.k2.1f1b.z1", True),
        (LLAMA, "d1.t2.p2.k4.1f1b", False),
        (GPT, "d2.t2.p2.k4.1f1b.z2", True),
        (LLAMA, "d1.t1.p2.k4.interleaved.v2", False),
        (LLAMA, "d2.t1.p2.k4.interleaved.v2.z1", True),
        (LLAMA, "d1.t1.p2.k4.zb1.rfull", False),
        (LLAMA, "d1.c2.t1.p2.k2.1f1b", False),  # the weights' views under context parallelism
    ],
)
def test_step_equals_the_uncached_step_and_the_sequential_step(spec: str, strategy: str, og: bool) -> None:
    """The cached cast is the same cast of the same (sharded) weight, so the step's results are
    the uncached step's; both are the sequential fp8 step's within float8's rounding (the
    bound of ``tests/autodiff/test_precision.py``: the loss within 2^-4 relative, the updated
    weights and state within twice Adam's step)."""
    _same_as_uncached(spec, strategy, overlap_param_gather=og)


def test_step_with_megatrons_switches_equals_the_uncached_step() -> None:
    """As ``--trainer megatron`` runs fp8-delayed: its buckets, fp32 main_grad fused into the
    weight-gradient GEMMs, fp32 reductions; with full recomputation the backward casts again."""
    megatron = {"megatron_ddp": True, "grad_accum_fusion": True, "reduce_fp32": True}
    _same_as_uncached(LLAMA, "d2.t2.sp.p2.k4.1f1b.z1", **megatron)
    _same_as_uncached(LLAMA, "d2.t1.p2.k4.interleaved.v2.z1.rfull", overlap_param_gather=True, **megatron)


def _same_as_uncached(spec: str, strategy: str, **options: bool) -> None:
    got, prog = _results(spec, strategy, True, **options)
    assert any(f.name.endswith("_f8w") for f in prog.functions), "some layer takes float8 weights"
    plain, _ = _results(spec, strategy, False, **options)
    for name, (kind, _x0, want, b) in got.items():
        np.testing.assert_array_equal(np.asarray(b), np.asarray(plain[name][3]), err_msg=name)
        if kind == "loss":
            assert abs(float(b) - float(want)) <= 2.0**-4 * abs(float(want))
        else:
            np.testing.assert_allclose(np.asarray(b), np.asarray(want), rtol=0, atol=2 * 0.01, err_msg=name)


def _program(strategy: str, cache: bool, spec: str = LLAMA, **options: bool) -> Module:
    s = parse_strategy(strategy)
    model = build_model(spec, batch=s.k * s.d, dtype=DType.bf16)
    return distribute(model, s, Optimizer("adam"), precision=F8, fp8_weight_cache=cache, **options)


MOVES = {"MeshSend", "MeshView", "Redistribute", "Cast", "Identity"}  # a weight still, moved or cast


def _weight_casts(prog: Module) -> dict[str, int]:
    """Per weight, its float8 casts in one step: the E4M3 casts of the inlined step whose input is
    a step parameter (a master or compute copy), moved, gathered or cast to bf16 on the way."""
    flat = inline_calls(prog)
    src: dict[Value, str] = {p: p.name.removesuffix("_bf16") for p in flat.params}
    counts: dict[str, int] = {}
    for op in flat.ops():
        got = src.get(op.inputs[0]) if op.inputs else None
        if got is None:
            continue
        if op.name in MOVES:
            src[op.outputs[0]] = got
        elif op.name == "Float8Cast" and op.attrs.get("to") == DType.f8e4m3:
            counts[got] = counts.get(got, 0) + 1
    return counts


@pytest.mark.parametrize(
    ("strategy", "og"),
    [("d1.t2.p2.k4.1f1b", False), ("d2.t1.p2.k4.interleaved.v2.z1", True), ("d1.t1.p2.k4.zb1.rfull", False)],
)
def test_each_cached_weight_is_cast_once_per_step(strategy: str, og: bool) -> None:
    k = parse_strategy(strategy).k
    cached = _weight_casts(_program(strategy, True, overlap_param_gather=og))
    plain = _weight_casts(_program(strategy, False, overlap_param_gather=og))
    assert cached and set(cached) == set(plain)
    assert set(cached.values()) == {1}
    assert min(plain.values()) >= k  # a cast per microbatch (and per recomputation)


def test_each_chunk_casts_its_weights_right_before_its_first_forward() -> None:
    """The entry casts each block weight once, right before the first forward of its chunk (TE
    casts on the model chunk's first microbatch), and every call of the chunk passes the float8
    copies: the layer functions take them typed E4M3 and cast nothing of them."""
    prog = _program("d1.t1.p2.k4.1f1b", True)
    body = prog.entry.body
    casts = {op.outputs[0]: k for k, op in enumerate(body) if isinstance(op, Op) and op.name == "Float8Cast"}
    assert len(casts) == 4 * 7 and all(v.name.endswith("_f8") for v in casts)
    for c in (0, 1):
        calls = [(k, i) for k, i in enumerate(body) if isinstance(i, Call) and i.callee.startswith(f"c{c}_")]
        first = calls[0][0]
        assert calls[0][1].callee == f"c{c}_fwd"
        mine = [casts[v] for v in calls[0][1].inputs if v in casts]
        assert len(mine) == 2 * 7  # two blocks a chunk
        assert all(k < first for k in mine) and all(k > first - 1 - len(mine) - 2 for k in mine)
        for _, call in calls:  # the same copies for every call
            assert [v for v in call.inputs if v in casts] == [v for v in calls[0][1].inputs if v in casts]
    (fwd,) = [f for f in prog.functions if f.name.endswith("_f8w")]
    # the activations' only: x (q, k, v), the attention, the norm (gate, up), the hidden
    assert sum(1 for op in fwd.ops() if op.name == "Float8Cast") == 4
    assert all(op.inputs[0] not in fwd.params[1:] for op in fwd.ops() if op.name == "Float8Cast")


def test_no_cache_without_delayed_fp8_training_and_zero_3_refused() -> None:
    for prec in ("mixed", "fp8"):
        s = parse_strategy("d2.t1.p1.k2.1f1b")
        model = build_model(LLAMA, batch=4, dtype=DType.bf16)
        a = distribute(model, s, Optimizer("adam"), precision=prec, fp8_weight_cache=True)
        b = distribute(model, s, Optimizer("adam"), precision=prec)
        assert str(a) == str(b)
    with pytest.raises(StrategyError, match="ZeRO-3 gathers each weight per use"):
        _program("d2.t1.p1.k2.1f1b.z3", True)


SPEC = "llama:layers=8,hidden=512,heads=8,kv_heads=8,ffn=1536,seq=256,vocab=512"


def _simulated(strategy: str, cache: bool) -> tuple[dict[int, float], float, dict[int, float]]:
    """Per GPU its peak memory, the step time, and per GPU the bytes of its float8 weight
    copies (the entry's casts, one byte per element; strategies without d or t)."""
    s = parse_strategy(strategy)
    cl = parse_cluster("h100")
    model = build_model(SPEC, batch=s.k * s.d, dtype=DType.bf16)
    prog = distribute(model, s, Optimizer("adam"), precision=F8, comm_streams=True, fp8_weight_cache=cache)
    res = simulate(prog, cl, device_map(s, True), RooflineCostModel(cl))
    f8: dict[int, float] = {}
    for op in prog.entry.ops():
        if op.name == "Float8Cast":
            t = op.inputs[0].type
            assert isinstance(t, DTensorType)
            for dev in t.mesh.devices:
                f8[dev.id] = f8.get(dev.id, 0.0) + math.prod(t.shape)  # whole: no d, no t
    return res.peak_memory, res.step_time_s, f8


@pytest.mark.parametrize(("strategy", "in_flight"), [("d1.t1.p4.k8.1f1b", 4), ("d1.t1.p2.k8.1f1b", 2)])
def test_a_stage_holds_one_float8_copy_of_its_weights(strategy: str, in_flight: int) -> None:
    """The first stage of 1F1B has ``p`` microbatches in flight at its peak, each holding its own
    float8 weights without the cache: the cache saves (in flight - 1) copies, and the step is
    shorter by the k - 1 casts per weight it no longer runs."""
    peak0, t0, _ = _simulated(strategy, False)
    peak1, t1, f8 = _simulated(strategy, True)
    saved = peak0[0] - peak1[0]
    want = (in_flight - 1) * f8[0]
    assert 0.85 * want <= saved <= 1.05 * want, (saved, want)
    assert t1 < t0


def test_megatron_caches_under_fp8_delayed_only() -> None:
    """Megatron-Core passes TE ``is_first_microbatch``: its trainer turns the cache on under
    delayed scaling (ZeRO 0-2), not under mixed precision or torchao's dynamic scaling; the
    other trainers never do."""
    s = parse_strategy("d2.t1.p2.k4.1f1b.z1")
    assert trainer_semantics("megatron", s, FP8_DELAYED, DType.bf16).switches()["fp8_weight_cache"]
    for prec in (MIXED, FP8):
        assert not trainer_semantics("megatron", s, prec, DType.bf16).fp8_weight_cache
    assert not trainer_semantics("distir", s, FP8_DELAYED, DType.bf16).fp8_weight_cache
