"""Mixed precision training steps (``distir.autodiff.precision``): fp32 masters and optimizer state,
one cast per weight per step, the loss layer in fp32, gradients cast to fp32 for the update."""

from __future__ import annotations

import numpy as np
import pytest

import distir
from distir.autodiff.precision import (
    FP8,
    FP8_DELAYED,
    MIXED,
    PURE,
    Precision,
    PrecisionError,
    state_bytes,
    with_float8_linears,
    with_fp32_loss,
)
from distir.autodiff.train import Optimizer, training_step
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.interp.reference import run_reference
from distir.ir.ops import Call, Op
from distir.ir.printer import print_function
from distir.ir.types import DType, TensorType
from distir.ir.verify import verify
from distir.parallel.check import initial_values
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.simulate import simulate

TINY = "mlp:layers=2,hidden=4"

GOLDEN_STEP = (
    (
        "func @train_step(%x: Tensor[bf16, (2, 4), d0], %y: Tensor[bf16, (2, 4), d0], "
        "%w_0: Tensor[f32, (4, 4), d0], %w_1: Tensor[f32, (4, 4), d0]) {\n"
    )
    + """\
  %w_0_bf16 = Cast(%w_0, to=bf16)
  %w_1_bf16 = Cast(%w_1, to=bf16)
  %dense_fwd, %dense_fwd_1 = @dense_fwd(%x, %w_0_bf16)
  %dense_1_fwd, %dense_1_fwd_1 = @dense_1_fwd(%dense_fwd, %w_1_bf16)
  %loss_f32_fwd, %loss_f32_fwd_1, %loss_f32_fwd_2 = @loss_f32_fwd(%dense_1_fwd, %y)
  %dloss = FillLike(%loss_f32_fwd, value=1.0)
  %dh1 = @loss_f32_bwd(%loss_f32_fwd_1, %loss_f32_fwd_2, %dloss)
  %dh0, %dw_1 = @dense_1_bwd(%dense_fwd, %w_1_bf16, %dense_1_fwd_1, %dh1)
  %dw_0 = @dense_bwd(%x, %w_0_bf16, %dense_fwd_1, %dh0)
  %dw_0_f32 = Cast(%dw_0, to=f32)
  %w_0_new = SGD(%w_0, %dw_0_f32, lr=0.01)
  %dw_1_f32 = Cast(%dw_1, to=f32)
  %w_1_new = SGD(%w_1, %dw_1_f32, lr=0.01)
  return %loss_f32_fwd, %w_0_new, %w_1_new
}
"""
)
GOLDEN_LOSS = """\
func @loss_f32_fwd(%pred, %target) {
  %pred_f32 = Cast(%pred, to=f32)
  %target_f32 = Cast(%target, to=f32)
  %sse = MSELoss(%pred_f32, %target_f32, reduction="sum")
  %loss = Scale(%sse, alpha=0.125)
  return %loss, %pred_f32, %target_f32
}
func @loss_f32_bwd(%pred_f32, %target_f32, %dloss) {
  %scale = Scale(%dloss, alpha=0.125)
  %mselossgrad = MSELossGrad(%scale, %pred_f32, %target_f32, reduction="sum")
  %cast = Cast(%mselossgrad, to=bf16)
  return %cast
}
"""


def test_mixed_step_of_a_tiny_mlp_casts_where_expected() -> None:
    """Masters are f32 parameters; each is cast to bf16 once, before the first layer; the loss
    layer casts its inputs to f32 and its input gradient back to bf16; each bf16 weight gradient
    is cast to f32 right before its update."""
    step = training_step(build_model(TINY, batch=2, dtype=DType.bf16), Optimizer("sgd"), precision="mixed")
    verify(step)
    assert print_function(step.entry) + "\n" == GOLDEN_STEP
    loss = print_function(step["loss_f32_fwd"]) + "\n" + print_function(step["loss_f32_bwd"]) + "\n"
    assert loss == GOLDEN_LOSS


def test_mixed_adam_step_types() -> None:
    """Weights, m, v and their results are f32; the loss is f32; layers compute in f16."""
    model = build_model("gpt:layers=2,hidden=8,heads=2,seq=4,vocab=16", batch=2, dtype=DType.f16)
    typed = distir.check(training_step(model, Optimizer("adam"), precision=MIXED))
    entry = typed.entry
    n_in, n_w = len(model.inputs), len(model.weights)
    for p in entry.params[n_in : n_in + 3 * n_w]:
        assert isinstance(p.type, TensorType) and p.type.dtype is DType.f32, p
    for o in entry.outputs:
        assert isinstance(o.type, TensorType) and o.type.dtype is DType.f32, o
    casts = [op for op in entry.ops() if op.name == "Cast"]
    assert [str(op.attrs["to"]) for op in casts].count("f16") == n_w  # one compute copy per weight
    assert [str(op.attrs["to"]) for op in casts].count("f32") == n_w  # one gradient cast per weight
    masters = set(entry.params[n_in:])
    calls = [i for i in entry.body if isinstance(i, Call)]
    assert calls and not any(v in masters for c in calls for v in c.inputs)  # layers take the copies


@pytest.mark.parametrize("dtype", [DType.bf16, DType.f16])
def test_mixed_step_is_close_to_the_f32_step_but_rounded(dtype: DType) -> None:
    """The same f32 values through the f32 step and the mixed step: the mixed step rounds
    weights and activations to ``dtype`` (the reference rounds casts to bf16; f16 computes in
    float16), so results differ — by about that dtype's rounding, not more."""
    spec = "mlp:layers=3,hidden=8"
    f32 = build_model(spec, batch=4, dtype=DType.f32)
    low = build_model(spec, batch=4, dtype=dtype)
    opt = Optimizer("adam", lr=0.01)
    vals = initial_values(f32, opt, seed=2)
    want = run_reference(
        training_step(f32, opt), [vals[p.name] for p in f32.forward.params] + _rest(f32, opt, vals)
    )
    step = training_step(low, opt, precision="mixed")
    args = [
        vals[p.name].astype(dtype.to_numpy()) if i < len(low.inputs) else vals[p.name]
        for i, p in enumerate(low.forward.params)
    ]
    got = run_reference(step, args + _rest(low, opt, vals))
    u = 2.0**-8 if dtype is DType.bf16 else 2.0**-11  # unit roundoff
    assert abs(float(got[0]) - float(want[0])) <= 64 * u * abs(float(want[0]))
    assert float(got[0]) != float(want[0])  # the casts round: mixed is not f32 in disguise
    for a, b in zip(want[1:], got[1:], strict=True):
        assert np.asarray(b).dtype == np.float32
        # Adam normalizes the update, so weights move by ~lr whatever the gradient's rounding
        np.testing.assert_allclose(b, a, rtol=0, atol=2 * opt.lr)


def _rest(model, opt: Optimizer, vals: dict[str, np.ndarray]) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    return [vals[f"{s}_{w.name}"] for s in opt.state for w in model.weights] + [vals["step"]]


def test_with_fp32_loss_leaves_the_other_layers_alone() -> None:
    model = build_model("gpt:layers=1,hidden=8,heads=2,seq=4,vocab=16", batch=2, dtype=DType.bf16)
    wrapped = with_fp32_loss(model)
    assert [c.callee for c in wrapped.layers[:-1]] == [c.callee for c in model.layers[:-1]]
    assert wrapped.layers[-1].callee == f"{model.layers[-1].callee}_f32"
    loss_fn = wrapped.module[wrapped.layers[-1].callee]
    # the logits are cast, the integer labels are not
    assert [op.name for op in loss_fn.body[:1]] == ["Cast"] and loss_fn.body[1].name != "Cast"
    (out,) = run_reference(wrapped.module, [model.random_inputs(0)[p.name] for p in model.forward.params])
    (ref,) = run_reference(model.module, [model.random_inputs(0)[p.name] for p in model.forward.params])
    assert float(out) == pytest.approx(float(ref), rel=1e-6)


def test_state_bytes_per_parameter() -> None:
    """Mixed Adam: 4 (master) + 2 (bf16 copy) + 2 (bf16 gradient) + 8 (fp32 m, v) = 16 bytes per
    parameter, the ZeRO paper's 2Ψ + 2Ψ + 12Ψ; pure bf16 Adam 8, pure f32 Adam 16, mixed SGD 8."""
    assert state_bytes(2, MIXED, DType.bf16) == {"master": 4, "weights": 2, "grads": 2, "optimizer": 8}
    assert sum(state_bytes(2, MIXED, DType.bf16).values()) == 16
    assert sum(state_bytes(2, PURE, DType.bf16).values()) == 8
    assert sum(state_bytes(2, PURE, DType.f32).values()) == 16
    assert sum(state_bytes(0, MIXED, DType.f16).values()) == 8


def test_precision_errors_name_the_problem() -> None:
    with pytest.raises(PrecisionError, match="precision must be pure, mixed, fp8 or fp8-delayed, got 'half'"):
        Precision.parse("half")
    f32 = build_model(TINY, batch=2, dtype=DType.f32)
    with pytest.raises(PrecisionError, match=r"mixed precision computes in bf16 or f16 .* is f32"):
        training_step(f32, precision="mixed")
    f64 = build_model(TINY, batch=2, dtype=DType.f64)
    with pytest.raises(PrecisionError, match="is f64"):
        training_step(f64, precision="mixed")
    assert str(Precision.parse("mixed")) == "mixed" and Precision.parse(PURE) is PURE


FUSED = "gpt:layers=1,hidden=8,heads=2,seq=4,vocab=64,loss=fused"


def test_fused_loss_is_not_wrapped_and_keeps_no_fp32_copy_of_the_logits() -> None:
    """``loss=fused`` computes in fp32 inside (flash-attn's cross entropy): mixed precision casts
    nothing in the loss layer, its results are f32, and the logits' gradient is bf16."""
    model = build_model(FUSED, batch=2, dtype=DType.bf16)
    assert model.loss_dtype is DType.f32 and MIXED.prepare(model) is model
    step = distir.check(training_step(model, Optimizer("adam"), precision=MIXED))
    (loss,) = (o for o in step.entry.outputs[:1])
    assert isinstance(loss.type, TensorType) and loss.type.dtype is DType.f32
    names = [f.name for f in step.functions]
    assert not any(n.startswith("loss_f32") for n in names)
    bwd = step["loss_bwd"]
    casts = [op for f in (step["loss_fwd"], bwd) for op in f.ops() if op.name == "Cast"]
    assert casts == []  # no copy of the logits in either direction
    assert "SoftmaxCrossEntropyPartsGrad" in {op.name for op in bwd.ops()}


def test_fused_loss_equals_the_fp32_loss() -> None:
    """The same bf16 logits: the fused loss (fp32 accumulation inside) and the cast-first loss
    agree to fp32 rounding, and so do their gradients after the fp32 → bf16 cast."""
    fused = build_model(FUSED, batch=2, dtype=DType.bf16)
    plain = MIXED.prepare(build_model(FUSED.replace(",loss=fused", ""), batch=2, dtype=DType.bf16))
    vals = fused.random_inputs(3)
    args = [vals[p.name] for p in fused.forward.params]
    (a,) = run_reference(fused.module, args)
    (b,) = run_reference(plain.module, args)
    assert np.asarray(a).dtype == np.float32 and float(a) == pytest.approx(float(b), rel=1e-5)
    opt = Optimizer("sgd", lr=1.0)
    ga = run_reference(training_step(fused, opt, precision=MIXED), args)
    gb = run_reference(training_step(plain, opt, precision=MIXED), args)
    for x, y in zip(ga, gb, strict=True):  # updated fp32 masters: w - 1.0 · gradient
        np.testing.assert_allclose(x, y, rtol=2.0**-7, atol=2.0**-12)


def test_torch_loss_equals_the_fp32_loss_and_keeps_more() -> None:
    """``loss=torch`` (F.cross_entropy: LogSoftmax then NegativeLogLikelihoodLoss) computes the
    same loss and gradients as the default form, and under mixed precision keeps more memory: the
    saved fp32 log-probabilities and the dense gradient of the NLL beside the log-softmax's."""
    base = "gpt:layers=1,hidden=8,heads=2,seq=4,vocab=64"
    torch_form = build_model(base + ",loss=torch", batch=2, dtype=DType.f64)
    plain = build_model(base, batch=2, dtype=DType.f64)
    vals = plain.random_inputs(5)
    args = [vals[p.name] for p in plain.forward.params]
    opt = Optimizer("sgd", lr=1.0)
    ga = run_reference(training_step(torch_form, opt), args)
    gb = run_reference(training_step(plain, opt), args)
    for x, y in zip(ga, gb, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-14)
    peaks = {}
    for form in ("fp32", "torch", "fused"):
        spec = "gpt:layers=1,hidden=64,heads=4,seq=64,vocab=8192" + f",loss={form}"
        model = build_model(spec, 8, DType.bf16)
        s = parse_strategy("d1.t1.p1.k1")
        prog = distribute(model, s, comm_streams=True, precision="mixed")
        peaks[form] = simulate(prog, parse_cluster("dgx-a100"), device_map(s, True)).peak_memory[0]
    logits = 8 * 64 * 8192  # elements
    # at the backward's peak the default form holds 8 bytes per logit (measured; 10 before the
    # loss's bf16 input died inside the loss call as the inlined program frees it); torch's the
    # fp32 log-probabilities, the NLL's dense gradient and the log-softmax's (12); the fused
    # kernel the bf16 logits and their bf16 gradient (4)
    assert peaks["torch"] - peaks["fp32"] >= 3.5 * logits
    assert peaks["fp32"] - peaks["fused"] >= 3.5 * logits


def _loss_peaks(strategy: str, forms: tuple[str, ...]) -> dict[str, float]:
    """The simulated peak per local logit of each loss form (mixed precision, bf16 logits)."""
    peaks = {}
    s = parse_strategy(strategy)
    for form in forms:
        model = build_model(f"gpt:layers=1,hidden=64,heads=4,seq=64,vocab=8192,loss={form}", 8, DType.bf16)
        prog = distribute(model, s, comm_streams=True, precision="mixed")
        peak = simulate(prog, parse_cluster("dgx-a100"), device_map(s, True)).peak_memory[0]
        peaks[form] = peak / (8 * 64 * 8192 / s.t)
    return peaks


@pytest.mark.parametrize("strategy", ["d1.t1.p1.k1", "d1.t2.p1.k1"])
def test_parallel_loss_holds_four_fp32_logits_in_its_backward(strategy: str) -> None:
    """``loss=parallel`` (torch's loss_parallel): its fused backward holds the saved fp32
    log-probabilities, ``grad_input``, ``grad_input + exp(x)`` and the product — four fp32
    tensors of the local logits (16 bytes per local logit) — where the default form holds two
    (8, measured above) and ``loss=torch`` three (the log-probabilities, the NLL's dense gradient
    and the log-softmax's; whole logits, so only on one device)."""
    t1 = strategy == "d1.t1.p1.k1"
    peaks = _loss_peaks(strategy, ("fp32", "torch", "parallel") if t1 else ("fp32", "parallel"))
    assert 7.5 <= peaks["parallel"] - peaks["fp32"] <= 8.5
    if t1:
        assert 3.5 <= peaks["parallel"] - peaks["torch"] <= 4.5


LLAMA = "llama:layers=2,hidden=32,heads=4,kv_heads=2,ffn=64,vocab=64,seq=8"


def test_fp8_precision_parses_and_is_mixed_with_float8_linears() -> None:
    fp8 = Precision.parse("fp8")
    assert fp8 is FP8 and str(fp8) == "fp8" and fp8.mixed and fp8.float8
    assert fp8.float8_scaling == "dynamic"
    te = Precision.parse("fp8-delayed")
    assert te is FP8_DELAYED and str(te) == "fp8-delayed" and te.float8_scaling == "delayed"
    assert not MIXED.float8 and str(MIXED) == "mixed"


def test_delayed_float8_linears_scale_every_cast_and_gradient_so() -> None:
    model = build_model(LLAMA, batch=2, dtype=DType.bf16)
    block = FP8_DELAYED.prepare(model).module[model.layers[1].callee]
    ops = [i for i in block.body if isinstance(i, Op) and i.name in ("Float8Cast", "MatMul")]
    assert {i.attrs.get("scaling", i.attrs.get("grad_scaling")) for i in ops} == {"delayed"}


def test_float8_linears_cast_every_blocks_linear_operands_and_leave_the_head() -> None:
    """In the blocks, each MatMul by a weight multiplies Float8Cast (E4M3) operands, each distinct
    operand cast once (llama: 7 weights, 4 distinct inputs: q/k/v's, wo's, w1/w3's, w2's); the
    head's output projection stays bf16 (torchtitan's filter of ``output``)."""
    model = build_model(LLAMA, batch=2, dtype=DType.bf16)
    f8 = with_float8_linears(model)
    block = f8.module[f8.layers[1].callee]
    casts = [i for i in block.body if isinstance(i, Op) and i.name == "Float8Cast"]
    products = [i for i in block.body if isinstance(i, Op) and i.name == "MatMul"]
    assert len(casts) == 7 + 4 and len(products) == 7
    made = {c.outputs[0] for c in casts}
    assert all(set(p.inputs) <= made for p in products)
    assert {c.attrs["to"] for c in casts} == {DType.f8e4m3}
    head = f8.module[f8.layers[-2].callee]
    assert head == model.module[model.layers[-2].callee]
    assert not any(isinstance(i, Op) and i.name == "Float8Cast" for i in head.body)


def test_fp8_refuses_a_model_not_in_bf16_and_a_gpu_without_fp8() -> None:
    model = build_model(LLAMA, batch=2, dtype=DType.f16)
    with pytest.raises(PrecisionError, match="fp8 precision computes what is not float8 in bf16"):
        FP8.compute_dtype(model)
    with pytest.raises(PrecisionError, match="needs FP8 tensor cores; A100-SXM-80GB has none"):
        FP8.check_devices(n.device for n in parse_cluster("dgx-a100").nodes)
    FP8.check_devices(n.device for n in parse_cluster("h100").nodes)
    MIXED.check_devices(n.device for n in parse_cluster("dgx-a100").nodes)


def test_fp8_step_saves_float8_operands_for_the_backward() -> None:
    """torchao's tensorwise recipe saves ``input_fp8`` and ``weight_fp8_t``: the block's forward
    returns (for its backward) float8 activations and weights, one byte per element, and no bf16
    input of a linear layer beside them."""
    model = build_model(LLAMA, batch=2, dtype=DType.bf16)
    step = distir.check(training_step(model, Optimizer("adam"), precision="fp8"))
    fwd = step[f"{model.layers[1].callee}_fwd"]
    bwd = step[f"{model.layers[1].callee}_bwd"]
    saved = [v.type for v in fwd.outputs[1:]]
    f8 = [t for t in saved if isinstance(t, TensorType) and t.dtype.is_float8]
    assert len(f8) == 7 + 4  # every cast operand, read by dgrad or wgrad
    assert all(t.nbytes == int(np.prod(t.shape)) for t in f8)
    e5m2 = [i for i in bwd.body if isinstance(i, Op) and i.name == "Float8Cast"]
    assert len(e5m2) == 7 and {i.attrs["to"] for i in e5m2} == {DType.f8e5m2}


def test_fp8_step_is_close_to_the_mixed_step() -> None:
    """Float8 rounds the linear layers' operands to 3 (E4M3) and 2 (E5M2) mantissa bits: the loss
    moves by about that rounding, the updated weights by about Adam's step, not more."""
    model = build_model(LLAMA, batch=2, dtype=DType.bf16)
    opt = Optimizer("adam", lr=0.01)
    vals = initial_values(model, opt, seed=3)
    args = [vals[p.name] for p in model.forward.params] + _rest(model, opt, vals)
    want = run_reference(training_step(model, opt, precision="mixed"), args)
    got = run_reference(training_step(model, opt, precision="fp8"), args)
    assert float(got[0]) != float(want[0])
    assert abs(float(got[0]) - float(want[0])) <= 2.0**-4 * abs(float(want[0]))
    for a, b in zip(want[1:], got[1:], strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=2 * opt.lr)
