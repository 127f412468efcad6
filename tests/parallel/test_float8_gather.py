"""distribute(..., float8_gather=True): FSDP's float8 all-gather, as torchao runs it under
torchtitan's ``--float8.enable_fsdp_float8_all_gather`` (``distir.parallel.fp8_cache``). Each
sharded linear weight's shard is cast to float8 (the whole weight's scale, one pass) on the
stream that gathers it, gathered in float8 and read so by the layers: the step computes the
sequential float8 step within float8's tolerance, gathers half the bytes of the bf16 gathers,
and holds smaller gathered weights."""

from __future__ import annotations

import numpy as np
import pytest

from distir.autodiff.precision import Precision
from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir.function import Function, Module
from distir.ir.ops import Op
from distir.ir.types import DType
from distir.parallel.check import check_against_sequential
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import StrategyError, parse_strategy
from distir.sim.cost import RooflineCostModel
from distir.sim.simulate import simulate

LLAMA = "llama:layers=4,hidden=8,heads=2,kv_heads=2,ffn=16,seq=4,vocab=16"
FSDP2 = {"comm_streams": True, "gather_cast": True, "gather_copy_out": True, "fsdp2_root": True}


def _compare(strategy: str, gather: bool) -> tuple[dict[str, tuple], Module]:
    s = parse_strategy(strategy)
    model = build_model(LLAMA, batch=s.k * s.d, dtype=DType.bf16)
    opt = Optimizer("adam", lr=0.01)
    cmp = check_against_sequential(model, s, opt, precision="fp8", float8_gather=gather, **FSDP2)
    return cmp.results, cmp.distributed


@pytest.mark.parametrize(
    "strategy",
    [
        "d2.t1.p1.k2.1f1b.z3.rops",
        "d2.t1.p1.k1.1f1b.z3.rfull",
        "d2.t2.p1.k2.1f1b.z3.rops",  # tensor-parallel shards of the weights
        "d2.t1.p2.k2.1f1b.z3.rops",  # a pipeline
        "d4.t1.p1.k1.1f1b.z3h2.rops",  # HSDP: sharded in groups of two
        "d2.c2.t1.p1.k1.1f1b.z3.rfull",  # context parallelism: sharded over d·c
    ],
)
def test_step_equals_the_sequential_float8_step(strategy: str) -> None:
    """The gathered float8 weight is the layer's float8 weight (a shard's cast with the scale
    of its own amax is the whole weight's up to a float8 rounding step), so the step is the
    sequential fp8 step's within the bound of ``tests/autodiff/test_precision.py``: the loss
    within 2^-4 relative, the weights within twice Adam's step (lr 0.01)."""
    got, prog = _compare(strategy, True)
    _assert_every_block_takes_its_linear_weights_in_float8(prog)
    for name, (kind, _x0, want, b) in got.items():
        if kind == "loss":
            assert abs(float(b) - float(want)) <= 2**-4 * abs(float(want)), name
        else:
            np.testing.assert_allclose(np.asarray(b), np.asarray(want), rtol=0, atol=2 * 0.01, err_msg=name)


def _casts(f: Function) -> int:
    return sum(1 for i in f.body if isinstance(i, Op) and i.name == "Float8Cast")


def _assert_every_block_takes_its_linear_weights_in_float8(prog: Module) -> None:
    """The block's forward and backward are rewritten, each casting seven fewer tensors (a Llama
    block's seven linear weights) than the function it rewrites."""
    by_name = {f.name: f for f in prog.functions}
    rewritten = [f for f in prog.functions if f.name.endswith("_f8w")]
    assert {f.name for f in rewritten} >= {"block_fwd_f8w", "block_bwd_f8w"}
    for f in rewritten:
        assert _casts(by_name[f.name.removesuffix("_f8w")]) - _casts(f) == 7, f.name


def test_the_shards_are_cast_before_their_gathers_and_the_layers_cast_no_weight() -> None:
    """Every linear weight's shard is cast with the precomputed scale, one layout, before it is
    gathered; each rewritten layer function casts seven fewer tensors than the function it
    rewrites."""
    _, prog = _compare("d2.t1.p1.k2.1f1b.z3.rops", True)
    pre = [
        i
        for f in prog.functions
        for i in f.body
        if isinstance(i, Op) and i.attrs.get("scaling") == "precomputed"
    ]
    assert pre and all(i.name == "Float8Cast" and i.attrs.get("layouts") == 1 for i in pre)
    gathered = {
        v
        for f in prog.functions
        for i in f.body
        if isinstance(i, Op) and i.name == "Redistribute"
        for v in i.inputs
    }
    assert all(i.outputs[0] in gathered for i in pre), "each float8 shard is gathered"
    _assert_every_block_takes_its_linear_weights_in_float8(prog)


def test_a_shorter_step_and_a_lower_peak() -> None:
    """On an 8-GPU H100 node, a Llama whose linear layers dominate: the float8 gathers move one
    byte an element where the bf16 ones move two and the layers cast no weight, so the step is
    shorter and the gathered weights, the peak, smaller."""
    spec = "llama:layers=4,hidden=1024,heads=8,kv_heads=8,ffn=3584,seq=1024,vocab=1024"
    s = parse_strategy("d8.t1.p1.k1.1f1b.z3.rops")
    cl = parse_cluster("h100")
    model = build_model(spec, batch=8, dtype=DType.bf16)
    out = {}
    for gather in (False, True):
        prog = distribute(model, s, Optimizer("adam"), precision="fp8", float8_gather=gather, **FSDP2)
        res = simulate(prog, cl, device_map(s, True), RooflineCostModel(cl))
        out[gather] = (res.step_time_s, max(res.peak_memory.values()))
    (t0, p0), (t1, p1) = out[False], out[True]
    assert t1 < t0 and p1 < p0


@pytest.mark.parametrize(
    ("strategy", "precision", "train", "options", "what"),
    [
        ("d2.t1.p1.k1.1f1b.z3.rops", "mixed", True, FSDP2, "precision fp8"),
        ("d2.t1.p1.k1.1f1b.z3.rops", "fp8-delayed", True, FSDP2, "precision fp8"),
        ("d2.t1.p1.k1.1f1b.z3", "fp8", False, FSDP2, "a training step"),
        ("d2.t1.p1.k1.1f1b.z1.rops", "fp8", True, FSDP2, "ZeRO-3, not ZeRO-1"),
        ("d1.t1.p1.k1.1f1b.z3.rops", "fp8", True, FSDP2, "d > 1"),  # nothing sharded
        ("d1.c2.t1.p1.k1.1f1b.z3.rfull", "fp8", True, FSDP2, "d > 1"),  # torchtitan's dp_shard is 1
        ("d2.t1.p1.k1.1f1b.z3.rops", "fp8", True, {"comm_streams": True}, "gather_cast"),
        ("d2.t1.p1.k1.1f1b.z3", "fp8", True, FSDP2, "recomputed"),  # the forward saves the casts
        ("d2.t1.p1.k1.1f1b.z3.rsel", "fp8", True, FSDP2, "recomputed"),
    ],
)
def test_refused_where_torchtitan_would_not_gather_float8_or_distir_does_not_model_it(
    strategy: str, precision: str, train: bool, options: dict[str, bool], what: str
) -> None:
    """One line naming the missing condition; never a program that silently gathers bf16."""
    s = parse_strategy(strategy)
    model = build_model(LLAMA, batch=s.d * s.c, dtype=DType.bf16)
    opt = Optimizer("adam")
    with pytest.raises(StrategyError, match=what) as e:
        distribute(model, s, opt, train=train, precision=precision, float8_gather=True, **options)
    assert "\n" not in str(e.value)


def test_refused_without_fp32_masters() -> None:
    s = parse_strategy("d2.t1.p1.k1.1f1b.z3.rops")
    model = build_model(LLAMA, batch=2, dtype=DType.bf16)
    prec = Precision.parse("fp8").with_optimizer_dtype("bf16")
    with pytest.raises(StrategyError, match="fp32 masters"):
        distribute(model, s, Optimizer("adam"), precision=prec, float8_gather=True, **FSDP2)
