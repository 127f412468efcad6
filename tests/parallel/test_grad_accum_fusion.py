"""distribute(..., grad_accum_fusion=True): Megatron-LM's gradient-accumulation fusion. Each
linear layer's weight-gradient product is cast to fp32 and added into the accumulated fp32 sum
inside the layer's backward, right after its MatMul, so the fusion rule runs both as the GEMM's
epilogue (no Add kernel, no low-precision product written); the other weights' gradients are
added into their fp32 sums by one fused cast-add in the chunk (Megatron's hook); the sums are
reduced in fp32 and the optimizer takes them as they are. The step still equals the sequential
mixed step (to bf16's roundoff)."""

from __future__ import annotations

import pytest

from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.interp.loop import interpret
from distir.interp.shapes import TypeDomain
from distir.ir.dtensor import DTensorType
from distir.ir.function import Module
from distir.ir.ops import Call, Op
from distir.ir.types import DType
from distir.parallel.distribute import HP_GRAD, device_map, distribute
from distir.parallel.strategy import StrategyError, parse_strategy
from distir.sim.cost import RooflineCostModel
from distir.sim.fusion import fused_inputs
from distir.sim.simulate import SimResult, simulate

from .helpers import assert_mixed_step_matches

GPT = "gpt:layers=2,hidden=8,heads=2,seq=4,vocab=16"
TIED = "gpt:layers=2,hidden=8,heads=2,seq=4,vocab=16,tied=1"
LLAMA = "llama:layers=2,hidden=16,heads=2,kv_heads=1,ffn=32,seq=4,vocab=16"
LLAMA4 = "llama:layers=4,hidden=16,heads=2,kv_heads=1,ffn=32,seq=4,vocab=16"


@pytest.mark.parametrize(
    ("spec", "strategy", "options"),
    [
        (GPT, "d1.t1.p1.k2", {}),
        (GPT, "d2.t2.p1.k2.1f1b.z1.sp", {"megatron_ddp": True, "comm_streams": True}),
        (LLAMA, "d2.t1.p2.k4.1f1b.z1", {"megatron_ddp": True, "comm_streams": True}),
        (TIED, "d1.t1.p2.k2.zb1", {}),
        (LLAMA4, "d2.t2.p2.k2.interleaved.v2", {"comm_streams": True}),
        (LLAMA, "d2.t1.c2.p1.k2", {"comm_streams": True}),
        (GPT, "d2.t2.p2.k2.1f1b", {"deepspeed_pipe": True}),
    ],
)
def test_step_equals_the_sequential_mixed_step(spec: str, strategy: str, options: dict[str, bool]) -> None:
    assert_mixed_step_matches(spec, strategy, grad_accum_fusion=True, **options)


def _program(strategy: str, fusion: bool = True, spec: str = GPT) -> Module:
    s = parse_strategy(strategy)
    model = build_model(spec, batch=4 * s.k * s.d, dtype=DType.bf16)
    return distribute(
        model, s, Optimizer("adam"), precision="mixed", comm_streams=True, grad_accum_fusion=fusion
    )


def test_the_weight_gradient_products_accumulate_in_the_gemm() -> None:
    prog = _program("d2.t1.p1.k2.z1")
    fn = prog["block_bwd_gaf_acc"]
    links = fused_inputs(fn)
    made = {o: x for x in fn.body for o in x.outputs}
    added = [(i, x) for i, x in enumerate(fn.body) if type(x) is Op and x.name in ("Cast", "Add")]
    adds = [x for _, x in added if x.name == "Add" and x.inputs[0].name.startswith("acc_")]
    assert len(adds) == 6  # wq, wk, wv, wo, w1, w2
    for x in adds:  # the sum: the GEMM's product cast to fp32, added in its epilogue
        cast_op = made[x.inputs[1]]
        assert cast_op.name == "Cast" and made[cast_op.inputs[0]].name == "MatMul"
        assert links[fn.body.index(x)] is not None and links[fn.body.index(cast_op)] is not None
        assert links[fn.body.index(x)].sole and links[fn.body.index(cast_op)].sole  # type: ignore[union-attr]
    # the first microbatch's GEMMs write fp32 (no accumulator to read)
    first = prog["block_bwd_gaf"]
    assert [x.name for x in first.body].count("Cast") == 6 and len(first.params) == len(
        prog["block_bwd"].params
    )


def test_no_add_kernel_for_the_products_in_the_chunks() -> None:
    prog = _program("d2.t1.p1.k2.z1")
    bwd = prog["c0_bwd_acc_red"]
    calls = {x.callee for x in bwd.body if type(x) is Call}
    assert HP_GRAD not in calls and "block_bwd_gaf_acc" in calls
    adds = {x.outputs[0].name for x in bwd.body if type(x) is Op and x.name == "Add"}
    products = {f"g_{w}_{i}" for w in ("wq", "wk", "wv", "wo", "w1", "w2") for i in range(2)} | {"g_wlm"}
    assert not products & adds  # the blocks' and the output layer's products: in the GEMM
    assert {"g_b1_0", "g_ln1_scale_1", "g_wte"} <= adds  # the hook's add_, fused with the cast
    links = fused_inputs(bwd)
    for i, x in enumerate(bwd.body):
        if type(x) is Op and x.name == "Add" and x.inputs[0].name.startswith("acc_"):
            assert links[i] is not None, x.outputs[0].name


def _sums(fusion: bool) -> dict[str, DType]:
    """The dtype of every accumulated gradient the last backward chunk takes, and of what its
    reductions reduce."""
    prog = _program("d2.t1.p1.k2.z1", fusion)
    dom = TypeDomain(record=True)
    interpret(prog, prog.entry, [p.type for p in prog.entry.params], dom)
    bwd = prog["c0_bwd_acc_red"]
    _types, env = dom.envs["c0_bwd_acc_red"][0]
    out = {p.name: env[p].dtype for p in bwd.params if p.name.startswith("acc_")}
    for x in bwd.ops():
        if x.name == "Redistribute":
            t = env.get(x.inputs[0])
            if isinstance(t, DTensorType):
                out[f"reduced_{x.outputs[0].name}"] = t.dtype
    return out


def test_the_sums_and_their_reductions_are_fp32() -> None:
    fused, plain = _sums(True), _sums(False)
    assert fused and set(fused.values()) == {DType.f32}
    assert set(plain.values()) == {DType.bf16}  # without: bf16 sums, reduced in bf16
    assert fused.keys() == plain.keys()


def test_refused_without_mixed_precision_or_with_zero_2_3() -> None:
    model = build_model(GPT, batch=4, dtype=DType.bf16)
    with pytest.raises(StrategyError, match="mixed precision"):
        distribute(
            model, parse_strategy("d1.t1.p1.k1"), Optimizer("adam"), precision="pure", grad_accum_fusion=True
        )
    model = build_model(GPT, batch=8, dtype=DType.bf16)
    with pytest.raises(StrategyError, match="whole gradients"):
        distribute(
            model,
            parse_strategy("d2.t1.p1.k2.z3"),
            Optimizer("adam"),
            precision="mixed",
            grad_accum_fusion=True,
        )


SIM_GPT = "gpt:layers=2,hidden=256,heads=4,seq=64,vocab=512"


def _simulated(**options: bool) -> SimResult:
    s = parse_strategy("d2.t1.p1.k4.z1")
    cl = parse_cluster("dgx-a100:1")
    model = build_model(SIM_GPT, batch=4 * s.k * s.d, dtype=DType.bf16)
    prog = distribute(model, s, Optimizer("adam"), precision="mixed", comm_streams=True, **options)
    return simulate(prog, cl, device_map(s, True), RooflineCostModel(cl, fuse=True))


def test_fused_accumulation_is_cheaper_than_casting_and_adding() -> None:
    """Against DeepSpeed's fp32 accumulation (the same fp32 sums and fp32 reductions, but a cast
    kernel and an add kernel per weight and microbatch) the fused step is faster."""
    fused = _simulated(grad_accum_fusion=True)
    unfused = _simulated(fp32_grad_accum=True)
    assert fused.step_time_s < unfused.step_time_s


def test_the_sums_take_fp32_memory() -> None:
    """The accumulated gradients are the fp32 main_grad's 4 bytes per parameter, not bf16's 2."""
    params = build_model(SIM_GPT, batch=1, dtype=DType.bf16).num_params
    fused, plain = _simulated(grad_accum_fusion=True), _simulated()
    assert max(fused.peak_memory.values()) - max(plain.peak_memory.values()) >= 2 * params
