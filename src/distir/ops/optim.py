"""Optimizer update ops. ``SGD(w, g, lr)`` gives ``w - lr * g``; Adam lives here too (training
steps use them as the weight-update op, the paper's ``Optimizer``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from distir.ir.dtensor import Shard
from distir.ir.types import DType, TensorType, Type
from distir.ir.values import Attrs
from distir.ops import sharding as sh
from distir.ops._rules import float_attr, float_input, numel, same_dtype, same_shape
from distir.ops._torch import like, upcast
from distir.ops.elementwise import round_to_bf16
from distir.ops.registry import (
    AttrSpec,
    CostClass,
    OpDef,
    TypeCtx,
    default_bytes_read,
    default_bytes_written,
    register,
)

if TYPE_CHECKING:
    from distir.backend.context import TorchContext

FAMILY = "optim"
COST_CLASS = CostClass.OPTIM  # how the family's ops are costed


def _sgd_rule(ctx: TypeCtx) -> Sequence[Type]:
    same_dtype(ctx, [0, 1])
    w, g = ctx.tensor(0), ctx.tensor(1)
    if w.shape != g.shape:
        ctx.fail("SGD gradient shape differs from the weight's", 1, w.shape, g.shape)
    return (ctx.out(w.dtype, w.shape),)


def _sgd_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    w, g = np.asarray(args[0]), np.asarray(args[1])
    return ((w - float_attr(attrs, "lr", 0.01) * g).astype(w.dtype, copy=False),)


SGD = register(
    OpDef(
        name="SGD",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("weight", "grad"),
        outputs=("new_weight",),
        infer=_sgd_rule,
        attrs={"lr": AttrSpec("float", 0.01)},
        reference=_sgd_ref,
        flops=lambda ins, outs, attrs: 2.0 * numel(outs[0]),
        doc="Plain SGD step: new_weight = weight - lr * grad.",
        sharding=sh.pointwise(),
    )
)


def _adam_rule(ctx: TypeCtx) -> Sequence[Type]:
    w = float_input(ctx, 0, "weight")
    same_dtype(ctx, [0, 1, 2, 3])
    same_shape(ctx, [0, 1, 2, 3])
    step = ctx.tensor(4)
    if not step.dtype.is_int or step.rank != 0:
        ctx.fail(
            "Adam step must be an integer scalar (a Scalar or 0-d tensor)",
            4,
            "Scalar[i64] or Tensor[i64, ()]",
            ctx.types[4],
        )
    known = ctx.known[4] if len(ctx.known) > 4 else None
    if known is not None and int(np.asarray(known)) < 1:
        ctx.fail(
            "Adam step counts from 1 (bias correction divides by 1 - beta^step)",
            4,
            ">= 1",
            int(np.asarray(known)),
        )
    for name in ("beta1", "beta2"):
        b = ctx.attr(name)
        if not 0.0 <= b < 1.0:
            ctx.fail(f"Adam {name} must be in [0, 1)", None, "[0, 1)", b)
    return (ctx.out(w.dtype, w.shape),) * 3


def _adam_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    w0 = np.asarray(args[0])
    w, g, m, v = (np.asarray(a, dtype=np.float64) for a in args[:4])
    t = int(np.asarray(args[4]))
    lr, b1 = float_attr(attrs, "lr", 0.001), float_attr(attrs, "beta1", 0.9)
    b2, eps = float_attr(attrs, "beta2", 0.999), float_attr(attrs, "epsilon", 1e-8)
    m = b1 * m + (1.0 - b1) * g
    v = b2 * v + (1.0 - b2) * g * g
    m_hat = m / (1.0 - b1**t)
    v_hat = v / (1.0 - b2**t)
    w = w - lr * m_hat / (np.sqrt(v_hat) + eps)
    return tuple(a.astype(w0.dtype) for a in (w, m, v))


# How Adam's update runs (the op's ``kernels`` attribute; its numbers do not change): ``fused``,
# one kernel reading weight, gradient and both moments and writing weight and moments
# (apex/Transformer Engine FusedAdam, DeepSpeed's, torch's fused=True); or a sequence of passes
# over the state, each a kernel reading and writing whole tensors of the weight's size (name,
# tensors read, written: ``Pass``):
# ``foreach``: torch.optim.AdamW(foreach=True), the default on CUDA (``_multi_tensor_adamw`` in
# torch/optim/adamw.py), with weight decay (torchtitan's 0.1);
class Pass(NamedTuple):
    """One pass of an unfused optimizer update: its op, the whole tensors it reads and writes."""

    op: str
    reads: int
    writes: int


FOREACH_ADAMW_PASSES: tuple[Pass, ...] = (
    Pass("_foreach_mul_(params, 1 - lr·weight_decay)", 1, 1),
    Pass("_foreach_lerp_(exp_avgs, grads, 1 - beta1)", 2, 1),
    Pass("_foreach_mul_(exp_avg_sqs, beta2)", 1, 1),
    Pass("_foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)", 2, 1),
    Pass("exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs)", 1, 1),
    Pass("_foreach_div_(exp_avg_sq_sqrt, bias_correction2_sqrt)", 1, 1),
    Pass("_foreach_add_(exp_avg_sq_sqrt, eps)", 1, 1),
    Pass("_foreach_addcdiv_(params, exp_avgs, exp_avg_sq_sqrt, step_size)", 3, 1),
)
# ``loop``: Composer's DecoupledAdamW (``DecoupledAdamW.adamw`` in composer/optim/
# decoupled_weight_decay.py: a Python loop of in-place ops per parameter), weight decay 0 (the
# llm-foundry pretraining yamls' ``weight_decay: 0.0``: no ``param.mul_``).
LOOP_ADAMW_PASSES: tuple[Pass, ...] = (
    Pass("exp_avg.mul_(beta1)", 1, 1),
    Pass(".add_(grad, alpha=1 - beta1)", 2, 1),
    Pass("exp_avg_sq.mul_(beta2)", 1, 1),
    Pass(".addcmul_(grad, grad, value=1 - beta2)", 2, 1),
    Pass("exp_avg_sq.sqrt()", 1, 1),
    Pass("/ math.sqrt(bias_correction2)", 1, 1),
    Pass(".add_(eps)", 1, 1),
    Pass("param.addcdiv_(exp_avg, denom, value=-step_size)", 3, 1),
)
ADAM_PASSES = {"foreach": FOREACH_ADAMW_PASSES, "loop": LOOP_ADAMW_PASSES}
ADAM_KERNELS = ("fused", *ADAM_PASSES)


def _adam_bytes(part: int) -> Any:
    """Bytes read (``part`` 1) or written (2) by an Adam update: the fused kernel's inputs and
    outputs; the foreach passes' tensors, each of the weight's size and dtype."""

    fused = default_bytes_read if part == 1 else default_bytes_written

    def count(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
        passes = ADAM_PASSES.get(str(attrs.get("kernels", "fused")))
        if passes is None:
            return fused(ins, outs, attrs)
        tensors = sum(p.reads if part == 1 else p.writes for p in passes)
        return float(tensors * ins[0].nbytes)

    return count


ADAM = register(
    OpDef(
        name="Adam",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("weight", "grad", "m", "v", "step"),
        outputs=("new_weight", "new_m", "new_v"),
        infer=_adam_rule,
        attrs={
            "lr": AttrSpec("float", 0.001),
            "beta1": AttrSpec("float", 0.9),
            "beta2": AttrSpec("float", 0.999),
            "epsilon": AttrSpec("float", 1e-8),
            "kernels": AttrSpec("str", "fused", ADAM_KERNELS),
        },
        reference=_adam_ref,
        bytes_read=_adam_bytes(1),
        bytes_written=_adam_bytes(2),
        flops=lambda ins, outs, attrs: 10.0 * numel(ins[0]),
        doc="Adam (Kingma & Ba) with bias correction; step is the 1-based step count: "
        "m' = b1 m + (1-b1) g, v' = b2 v + (1-b2) g^2, "
        "w' = w - lr (m'/(1-b1^step)) / (sqrt(v'/(1-b2^step)) + epsilon). ``kernels``: how the update "
        "runs, for its cost only (fused: one kernel; foreach, loop: the passes of "
        "torch.optim.AdamW(foreach=True), Composer's DecoupledAdamW).",
        sharding=sh.pointwise(),
    )
)


# -- Adam over bf16 parameters and 16-bit remainders --------------------------------------------
# Apex's DistributedFusedAdam with ``store_param_remainders`` (NeMo's default for distributed Adam
# with an fp32 optimizer over a bf16 model): no fp32 master is stored, only the low 16 bits of
# each fp32 value (an int16 "remainder") beside the bf16 parameter, which holds the high 16 bits
# rounded to nearest. Apex's kernel (``multi_tensor_adam_param_remainder``,
# apex/contrib/csrc/optimizers/multi_tensor_distopt_adam_kernel.cu) joins them — where the
# remainder is negative (its top bit set) the high half was rounded up, so it is decremented
# first — updates the fp32 value, and splits it again: high half, incremented where the low
# half's top bit is set (round to nearest, ties away from zero), and the low half. The join
# gives back the fp32 value bit for bit, so the update is the fp32 master's.
def join_remainder(high: np.ndarray[Any, Any], rem: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The fp32 values whose split (``split_remainder``) is bf16 ``high`` (held as float32
    values on the bf16 grid) and int16 ``rem``."""
    hi = (round_to_bf16(high).view(np.uint32) >> 16).astype(np.int64)
    lo = np.asarray(rem, dtype=np.int16).astype(np.int64)
    hi = (hi - (lo < 0)) & 0xFFFF
    return ((hi << 16) | (lo & 0xFFFF)).astype(np.uint32).view(np.float32)


def split_remainder(x: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """fp32 ``x`` as Apex stores it: its bf16 rounding (high half, plus one where the low half's
    top bit is set; float32 values on the bf16 grid) and the low half as int16."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.int64)
    lo = bits & 0xFFFF
    hi = ((bits >> 16) + (lo >> 15)) & 0xFFFF
    high = (hi << 16).astype(np.uint32).view(np.float32)
    return high, lo.astype(np.uint16).view(np.int16)


def _adam_rem_rule(ctx: TypeCtx) -> Sequence[Type]:
    p, r = ctx.tensor(0), ctx.tensor(1)
    if p.dtype is not DType.bf16:
        ctx.fail("AdamRemainder's parameter is bf16 (the fp32 value's high half)", 0, "bf16", p.dtype)
    if r.dtype is not DType.i16:
        ctx.fail("AdamRemainder's remainder is int16 (the fp32 value's low half)", 1, "i16", r.dtype)
    for i in (2, 3, 4):
        if ctx.tensor(i).dtype is not DType.f32:
            ctx.fail("AdamRemainder's gradient and moments are f32", i, "f32", ctx.tensor(i).dtype)
    same_shape(ctx, [0, 1, 2, 3, 4])
    step = ctx.tensor(5)
    if not step.dtype.is_int or step.rank != 0:
        ctx.fail("AdamRemainder's step must be an integer scalar", 5, "Tensor[i64, ()]", ctx.types[5])
    for name in ("beta1", "beta2"):
        b = ctx.attr(name)
        if not 0.0 <= b < 1.0:
            ctx.fail(f"AdamRemainder {name} must be in [0, 1)", None, "[0, 1)", b)
    m = ctx.out(DType.f32, p.shape)
    return (ctx.out(DType.bf16, p.shape), ctx.out(DType.i16, p.shape), m, m)


def _adam_rem_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    w = join_remainder(args[0], args[1])
    new_w, m, v = _adam_ref([w, *args[2:]], attrs)
    high, rem = split_remainder(new_w)
    return high, rem, m, v


ADAM_REMAINDER = register(
    OpDef(
        name="AdamRemainder",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("weight", "remainder", "grad", "m", "v", "step"),
        outputs=("new_weight", "new_remainder", "new_m", "new_v"),
        infer=_adam_rem_rule,
        attrs={
            "lr": AttrSpec("float", 0.001),
            "beta1": AttrSpec("float", 0.9),
            "beta2": AttrSpec("float", 0.999),
            "epsilon": AttrSpec("float", 1e-8),
        },
        reference=_adam_rem_ref,
        flops=lambda ins, outs, attrs: 10.0 * numel(ins[0]),
        doc="Adam (as ``Adam``) on the fp32 master joined from a bf16 weight (its high 16 bits, "
        "rounded to nearest) and an int16 remainder (its low 16 bits), as Apex "
        "DistributedFusedAdam's store_param_remainders: returns the new master split the same "
        "way, and the new fp32 moments. One fused kernel.",
        sharding=sh.pointwise(),
    )
)

# -- gradient-norm clipping ---------------------------------------------------------------------
# Every trainer clips the step's gradients by their global L2 norm before the update (max norm
# 1.0 by default: Megatron-LM's ``--clip-grad``, torchtitan's ``training.max_norm``, the
# llm-foundry yamls' ``gradient_clipping``, DeepSpeed's ``gradient_clipping``): each gradient's
# sum of squares (``GradNormSq``, one read of the gradient), their sum all-reduced over every
# rank that holds a piece of the model, then each gradient scaled by min(1, max_norm / (norm +
# 1e-6)) (``ClipByNorm``). ``scale`` says whether that scaling runs every step — torch's
# ``clip_grads_with_norm_`` and FSDP's ``clip_grad_norm_`` multiply by the clamped coefficient
# unconditionally, to avoid a host sync — or only when the norm exceeds max_norm
# (``if_over``: Megatron-LM's ``clip_grad_by_total_norm_fp32`` and DeepSpeed's
# ``clip_tensors_by_global_norm`` test ``clip_coeff < 1.0`` on the host), which the cost model
# takes as not run: a step's norm under max_norm, the common case after warm-up.
CLIP_EPS = 1e-6  # added to the norm by every trainer's clip coefficient
CLIP_SCALES = ("always", "if_over")


def _grad_norm_sq_rule(ctx: TypeCtx) -> Sequence[Type]:
    float_input(ctx, 0, "gradient")
    return (ctx.out(DType.f32, ()),)


def _grad_norm_sq_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    g = np.asarray(args[0], dtype=np.float64)
    return (np.asarray(np.sum(g * g), dtype=np.float32),)


def _grad_norm_sq_sharding(
    ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int
) -> list[sh.Strategy]:
    """A sharded gradient's sum of squares is each rank's partial sum; a pending sum has none
    (the square of a sum is not the sum of squares)."""
    rank = ins[0].rank if isinstance(ins[0], TensorType) else 0
    found = [sh.replicated(ins, outs)]
    found += [sh.Strategy((Shard(d),), (sh.SUM,)) for d in range(rank)]
    return found


GRAD_NORM_SQ = register(
    OpDef(
        name="GradNormSq",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("grad",),
        outputs=("sumsq",),
        infer=_grad_norm_sq_rule,
        reference=_grad_norm_sq_ref,
        flops=lambda ins, outs, attrs: 2.0 * numel(ins[0]),
        doc="The sum of a gradient's squared elements, accumulated and returned in f32 (a 0-d "
        "tensor): one term of the global norm that gradient clipping divides by.",
        sharding=_grad_norm_sq_sharding,
    )
)


def _clip_rule(ctx: TypeCtx) -> Sequence[Type]:
    g = float_input(ctx, 0, "gradient")
    s = ctx.tensor(1)
    if s.dtype is not DType.f32 or s.rank != 0:
        ctx.fail("ClipByNorm's sumsq is the f32 sum of squares (a 0-d tensor)", 1, "Tensor[f32, ()]", s)
    if ctx.attr("max_norm") <= 0.0:
        ctx.fail("ClipByNorm's max_norm must be positive", None, "> 0", ctx.attr("max_norm"))
    return (ctx.out(g.dtype, g.shape),)


def clip_coefficient(sumsq: float, max_norm: float) -> float:
    """The factor a gradient is scaled by: min(1, max_norm / (norm + 1e-6)), norm = sqrt(sumsq)."""
    return min(1.0, max_norm / (float(np.sqrt(sumsq)) + CLIP_EPS))


def _clip_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    g = np.asarray(args[0])
    c = clip_coefficient(float(np.asarray(args[1])), float_attr(attrs, "max_norm", 1.0))
    return ((g.astype(np.float64) * c).astype(g.dtype, copy=False),)


def _clip_cost(part: int) -> Any:
    """Bytes read (``part`` 1) or written (2), or FLOPs (0) of a ClipByNorm: the in-place
    multiplication of the gradient, or nothing when it runs only over the norm (``if_over``)."""
    fused = default_bytes_read if part == 1 else default_bytes_written

    def count(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
        if str(attrs.get("scale", "always")) == "if_over":
            return 0.0
        return float(numel(ins[0])) if part == 0 else fused(ins, outs, attrs)

    return count


CLIP_BY_NORM = register(
    OpDef(
        name="ClipByNorm",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("grad", "sumsq"),
        outputs=("clipped",),
        infer=_clip_rule,
        attrs={"max_norm": AttrSpec("float", 1.0), "scale": AttrSpec("str", "always", CLIP_SCALES)},
        reference=_clip_ref,
        flops=_clip_cost(0),
        bytes_read=_clip_cost(1),
        bytes_written=_clip_cost(2),
        doc="A gradient scaled by min(1, max_norm / (sqrt(sumsq) + 1e-6)), sumsq the global sum "
        "of squares of the step's gradients. ``scale``: when the multiplication runs, for its cost "
        "only (always: torch's clip_grads_with_norm_, FSDP's clip_grad_norm_; if_over: only when "
        "the norm exceeds max_norm, Megatron-LM's and DeepSpeed's host-side test, costed as not "
        "run).",
        sharding=sh.pointwise(),
    )
)


# -- torch implementations (contract: distir.ops._torch) ----------------------------------------
def _adam_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """Adam in the weight's dtype (a 16-bit one in f32), as torch.optim.Adam's update."""
    w0 = xs[0]
    w, g, m, v = (upcast(ctx, x) for x in xs[:4])
    t = int(xs[4].item())
    lr, b1 = float_attr(attrs, "lr", 0.001), float_attr(attrs, "beta1", 0.9)
    b2, eps = float_attr(attrs, "beta2", 0.999), float_attr(attrs, "epsilon", 1e-8)
    m = ctx.torch.lerp(m, g, 1.0 - b1)
    v = v * b2 + (1.0 - b2) * g * g
    denom = (v / (1.0 - b2**t)).sqrt() + eps
    w = w - (lr / (1.0 - b1**t)) * m / denom
    return tuple(like(a, w0) for a in (w, m, v))


def _adam_rem_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """AdamRemainder: the fp32 master joined from the bf16 weight and the int16 remainder by
    integer arithmetic on their bits, updated as ``Adam``, and split again."""
    torch = ctx.torch
    hi = xs[0].contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    lo = xs[1].to(torch.int32)
    hi = (hi - (lo < 0).to(torch.int32)) & 0xFFFF
    w = ((hi << 16) | (lo & 0xFFFF)).view(torch.float32)
    new_w, m, v = _adam_torch(ctx, [w, *xs[2:]], attrs)
    bits = new_w.contiguous().view(torch.int32)
    low = bits & 0xFFFF
    high = ((bits >> 16) + (low >> 15)) & 0xFFFF
    high16 = torch.where(high >= 0x8000, high - 0x10000, high).to(torch.int16)
    low16 = torch.where(low >= 0x8000, low - 0x10000, low).to(torch.int16)
    return high16.view(torch.bfloat16), low16, m, v


ADAM_REMAINDER.fill("torch", _adam_rem_torch)

SGD.fill("torch", lambda ctx, xs, attrs: (ctx.torch.add(xs[0], xs[1], alpha=-float_attr(attrs, "lr", 0.01)),))
ADAM.fill("torch", _adam_torch)
GRAD_NORM_SQ.fill("torch", lambda ctx, xs, attrs: (xs[0].double().square().sum().float(),))
CLIP_BY_NORM.fill(
    "torch",
    lambda ctx, xs, attrs: (
        like(
            xs[0].double() * clip_coefficient(float(xs[1].item()), float_attr(attrs, "max_norm", 1.0)),
            xs[0],
        ),
    ),
)
