"""Neural-network layers (ONNX names): Softmax, LayerNormalization, RMSNormalization; and
CausalMask (attention's causal mask, not an ONNX op); Dropout and its gradient DropoutGrad;
UnpadTokens and PadTokens.

The normalizations work over the trailing axes ``[axis, rank)`` of ``X`` (ONNX semantics);
``Scale`` (and ``B``) broadcast against those axes. References compute in float64 and round
once to the input dtype. Helpers here are shared with their gradients in ``distir.ops.grad.nn``.

``Y, mask = Dropout(X; p)`` is inverted dropout as PyTorch and Megatron-LM train with it: each
element is kept with probability 1 − p (``mask`` true, a bool tensor of X's shape: 1 byte per
element, what the backward keeps) and scaled by 1/(1 − p), else zeroed. ``dX = DropoutGrad(dY,
mask; p)`` is dY·mask/(1 − p). Both are pointwise (``Fusion.POINTWISE``: Megatron's fused
bias+dropout+residual add) and shard elementwise: X, Y and mask alike on any dim, the gradient
also linearly in dY (a pending sum on dY, the mask replicated). The numpy reference of Dropout
runs p = 0 only (the identity and an all-true mask) and refuses p > 0 with ``DropoutError``: a
distributed program draws its masks per rank (data-parallel replicas, pipeline microbatches and
sequence-parallel shards each draw their own), so no sequential program computes the same
numbers; such a program is typed, costed and simulated, not run. DropoutGrad's reference runs
any p: its mask is an input.

``UnpadTokens`` and ``PadTokens`` are flash-attn's ``bert_padding`` helpers around its
variable-length kernel (``index_first_axis`` and ``pad_input``, which llm-foundry's
``flash_attn_fn`` applies to q, k, v and the output of every attention), for a batch without
padding: every token is kept, so both are the identity on the values, and what they cost is
their copies. UnpadTokens gathers the rows (``torch.gather``: reads and writes each element
once); PadTokens writes a zero tensor and puts the rows into it (``torch.zeros`` then
``index_put``: two writes and a read). Each is the other's gradient (the backward of a gather is
a scatter into zeros, and of a put a gather). Pointwise for sharding: a row copy keeps any
placement, a pending sum too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from distir.ir.dtensor import Shard
from distir.ir.ops import Op
from distir.ir.types import DType, TensorType, Type
from distir.ir.values import Attrs, Value
from distir.ops import sharding as sh
from distir.ops._rules import (
    float_attr,
    float_input,
    in_numel_flops,
    int_attr,
    norm_axis,
    out_numel_flops,
    same_dtype,
)
from distir.ops._special import F64, f64
from distir.ops.gradrules import GradCtx, first, unbroadcast
from distir.ops.registry import AttrSpec, CostClass, EagerRate, Fusion, OpDef, TypeCtx, register

if TYPE_CHECKING:
    from distir.backend.context import TorchContext

FAMILY = "nn"
COST_CLASS = CostClass.NN  # how the family's ops are costed


# -- Softmax ----------------------------------------------------------------------------------
def softmax_axis(ctx: TypeCtx, t: TensorType) -> int:
    if t.rank == 0:
        ctx.fail(f"{ctx.op.name} needs an input of rank >= 1", 0, "rank >= 1", 0)
    return norm_axis(ctx, ctx.attr("axis"), t.rank, f"{ctx.op.name} axis")


def _softmax_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = float_input(ctx, 0)
    softmax_axis(ctx, t)
    return (ctx.out(t.dtype, t.shape),)


def softmax(x: Any, axis: int) -> F64:
    """Numerically stable softmax along ``axis`` in float64."""
    xd = f64(x)
    e = np.exp(xd - np.max(xd, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)  # type: ignore[no-any-return]


def log_softmax(x: Any, axis: int) -> F64:
    xd = f64(x)
    z = xd - np.max(xd, axis=axis, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=axis, keepdims=True))  # type: ignore[no-any-return]


def _softmax_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[0])
    return (softmax(x, int_attr(attrs, "axis", -1)).astype(x.dtype),)


SOFTMAX = register(
    OpDef(
        name="Softmax",
        family=FAMILY,
        cost_class=COST_CLASS,
        fusion=Fusion.ROWWISE,
        inputs=("input",),
        outputs=("output",),
        infer=_softmax_rule,
        attrs={"axis": AttrSpec("int", -1)},
        reference=_softmax_ref,
        flops=out_numel_flops(5.0),
        doc="exp(x - max) / sum(exp(x - max)) along one axis (ONNX opset 13 Softmax).",
        sharding=sh.whole_axes("axis"),
        attention_core=True,
    )
)


def _log_softmax_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[0])
    return (log_softmax(x, int_attr(attrs, "axis", -1)).astype(x.dtype),)


LOG_SOFTMAX = register(
    OpDef(
        name="LogSoftmax",
        family=FAMILY,
        cost_class=COST_CLASS,
        fusion=Fusion.ROWWISE,
        inputs=("input",),
        outputs=("output",),
        infer=_softmax_rule,
        attrs={"axis": AttrSpec("int", -1)},
        reference=_log_softmax_ref,
        flops=out_numel_flops(5.0),
        doc="x - max - log(sum(exp(x - max))) along one axis (ONNX opset 13 LogSoftmax; torch's "
        "log_softmax, the first half of F.cross_entropy: its gradient needs only its output).",
        sharding=sh.whole_axes("axis"),
    )
)


# -- normalizations ---------------------------------------------------------------------------
def norm_start(ctx: TypeCtx, x: TensorType) -> int:
    """The first normalized axis of ``x`` (``axis`` attribute, normalized)."""
    if x.rank == 0:
        ctx.fail(f"{ctx.op.name} needs an input of rank >= 1", 0, "rank >= 1", 0)
    return norm_axis(ctx, ctx.attr("axis"), x.rank, f"{ctx.op.name} axis")


def check_param(ctx: TypeCtx, i: int, x_index: int, start: int) -> TensorType:
    """Input ``i`` (a Scale or bias) must broadcast to X's normalized shape without growing it."""
    x, p = ctx.tensor(x_index), ctx.tensor(i)
    same_dtype(ctx, [x_index, i])
    normed = x.shape[start:]
    fits = all(d in (1, n) for d, n in zip(p.shape[::-1], normed[::-1], strict=False))
    if p.rank > len(normed) or not fits:
        name = ctx.op.inputs[i].rstrip("?")
        ctx.fail(
            f"{ctx.op.name}: {name} of shape {p.shape} does not broadcast to the normalized "
            f"shape {normed} (axes {start}..{x.rank - 1} of X)",
            i,
            normed,
            p.shape,
        )
    return p


def _norm_rule(ctx: TypeCtx) -> Sequence[Type]:
    x = float_input(ctx, 0, "X")
    start = norm_start(ctx, x)
    for i in range(1, len(ctx.types)):
        check_param(ctx, i, 0, start)
    return (ctx.out(x.dtype, x.shape),)


def norm_axes_of(x: np.ndarray, attrs: Attrs) -> tuple[int, ...]:
    start = int_attr(attrs, "axis", -1) % x.ndim
    return tuple(range(start, x.ndim))


def layer_norm_stats(x: F64, axes: tuple[int, ...], eps: float) -> tuple[F64, F64]:
    """(x̂, 1/σ): the normalized input and the reciprocal standard deviation (keepdims)."""
    mu = np.mean(x, axis=axes, keepdims=True)
    var = np.mean((x - mu) ** 2, axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    return (x - mu) * rstd, rstd


def rms_norm_stats(x: F64, axes: tuple[int, ...], eps: float) -> tuple[F64, F64]:
    """(x̂, 1/rms): x scaled by its reciprocal root mean square (keepdims)."""
    r = 1.0 / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + eps)
    return x * r, r


def gamma_shift(attrs: Attrs) -> float:
    """What LayerNormalization adds to its stored Scale: 1 with ``zero_centered_gamma``
    (LayerNorm1p: the weight stored as w, applied as 1 + w), else 0."""
    return 1.0 if attrs.get("zero_centered_gamma", False) else 0.0


def _layer_norm_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[0])
    xhat, _ = layer_norm_stats(f64(x), norm_axes_of(x, attrs), float_attr(attrs, "epsilon", 1e-5))
    y = xhat * (f64(args[1]) + gamma_shift(attrs))
    if len(args) > 2 and args[2] is not None:
        y = y + f64(args[2])
    return (y.astype(x.dtype),)


def _rms_norm_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[0])
    xhat, _ = rms_norm_stats(f64(x), norm_axes_of(x, attrs), float_attr(attrs, "epsilon", 1e-5))
    return ((xhat * f64(args[1])).astype(x.dtype),)


NORM_ATTRS = {"axis": AttrSpec("int", -1), "epsilon": AttrSpec("float", 1e-5)}
# LayerNormalization's (and its gradient's): the Scale applied as 1 + Scale (Megatron-Core's and
# Transformer Engine's ``zero_centered_gamma``, NeMo's ``layernorm1p``); the kernel is the same
LAYER_NORM_ATTRS = {**NORM_ATTRS, "zero_centered_gamma": AttrSpec("bool", False)}

NORM_BENCH = (
    "Liger-Kernel's published benchmark timings of torch.nn.LayerNorm (fp32; A100 and H100) and "
    "torch.nn.RMSNorm (bf16; H100), https://github.com/linkedin/Liger-Kernel/blob/"
    "ead96b618e5c67bddc6a6e9bcb99bfe6b5ab661c/benchmark/data/all_benchmark_data.csv: the median "
    "over hidden sizes 4096-16384 (bench/data/norm_kernels_liger.csv, bench/bench_memory_kernels.py)"
)
"""Where the eager normalization kernels' HBM fractions (``OpDef.eager_memory``) come from."""

LAYER_NORMALIZATION = register(
    OpDef(
        name="LayerNormalization",
        family=FAMILY,
        cost_class=COST_CLASS,
        fusion=Fusion.ROWWISE,
        inputs=("X", "Scale", "B?"),
        outputs=("Y",),
        infer=_norm_rule,
        attrs=dict(LAYER_NORM_ATTRS),
        reference=_layer_norm_ref,
        flops=out_numel_flops(8.0),
        eager_memory=EagerRate(0.52, NORM_BENCH),  # 52% on both GPUs
        doc="Y = (X - mean) / sqrt(var + epsilon) * Scale + B over axes [axis, rank) "
        "(* (1 + Scale) with zero_centered_gamma: LayerNorm1p).",
        sharding=sh.whole_axes("axis", to_end=True),
    )
)
RMS_NORMALIZATION = register(
    OpDef(
        name="RMSNormalization",
        family=FAMILY,
        cost_class=COST_CLASS,
        fusion=Fusion.ROWWISE,
        inputs=("X", "scale"),
        outputs=("Y",),
        infer=_norm_rule,
        attrs=dict(NORM_ATTRS),
        reference=_rms_norm_ref,
        flops=out_numel_flops(5.0),
        eager_memory=EagerRate(0.54, NORM_BENCH),
        doc="Y = X / sqrt(mean(X^2) + epsilon) * scale over axes [axis, rank).",
        sharding=sh.whole_axes("axis", to_end=True),
    )
)


# -- CausalMask -------------------------------------------------------------------------------
def _causal_mask_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = float_input(ctx, 0, "X")
    if t.rank < 2:
        ctx.fail("CausalMask needs an input of rank >= 2 (..., i, j)", 0, "rank >= 2", t.rank)
    return (ctx.out(t.dtype, t.shape),)


def _causal_mask_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[0])
    i, j = x.shape[-2:]
    above = np.triu(np.ones((i, j), dtype=bool), k=1)  # j > i
    fill = float_attr(attrs, "fill", -1e9)
    if x.dtype.kind == "f":  # the fill as the dtype holds it (f16: -65504, not an overflow to -inf)
        fill = min(max(fill, float(np.finfo(x.dtype).min)), float(np.finfo(x.dtype).max))
    return (np.where(above, np.asarray(fill).astype(x.dtype), x),)


def _causal_mask_sharding(
    ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs, n: int
) -> list[sh.Strategy]:
    """Pointwise over the leading dims; the (i, j) dims stay whole (a piece does not know its
    global offsets). With fill=0 the op is linear, so a pending sum passes through."""
    x = ins[0].shape if isinstance(ins[0], TensorType) else ()
    found = [sh.replicated(ins, outs)]
    found += [sh.Strategy((Shard(d),), (Shard(d),)) for d in range(len(x) - 2) if x[d] > 1]
    if float_attr(attrs, "fill", -1e9) == 0.0:
        found.append(sh.Strategy((sh.SUM,), (sh.SUM,)))
    return found


CAUSAL_MASK = register(
    OpDef(
        name="CausalMask",
        family=FAMILY,
        cost_class=COST_CLASS,
        fusion=Fusion.POINTWISE,
        inputs=("X",),
        outputs=("Y",),
        infer=_causal_mask_rule,
        attrs={"fill": AttrSpec("float", -1e9)},
        reference=_causal_mask_ref,
        flops=out_numel_flops(1.0),
        doc="Y[..., i, j] = fill where j > i, else X[..., i, j] (rank >= 2): attention's causal mask.",
        sharding=_causal_mask_sharding,
    )
)


# -- Dropout ----------------------------------------------------------------------------------
class DropoutError(ValueError):
    """The numpy reference was asked for dropout with p > 0, which no sequential program
    reproduces (the module docstring)."""


def _dropout_p(ctx: TypeCtx) -> float:
    p = ctx.attr("p")
    if not 0.0 <= p < 1.0:
        ctx.fail(f"{ctx.op.name}: p={p} must be in [0, 1)", None, "[0, 1)", p)
    return float(p)


def _dropout_rule(ctx: TypeCtx) -> Sequence[Type]:
    x = float_input(ctx, 0, "X")
    _dropout_p(ctx)
    return (ctx.out(x.dtype, x.shape), ctx.out(DType.bool, x.shape))


def _dropout_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    if float_attr(attrs, "p", 0.0) > 0.0:
        raise DropoutError(
            "the numpy reference of Dropout cannot run p > 0: a distributed program draws a "
            "different mask on each rank, so no sequential reference exists; simulate such a "
            "program, or run it with dropout 0"
        )
    x = np.asarray(args[0])
    return (np.array(x, copy=True), np.ones(x.shape, dtype=bool))


def _dropout_grad_rule(ctx: TypeCtx) -> Sequence[Type]:
    dy = float_input(ctx, 0, "dY")
    mask = ctx.tensor(1)
    if mask.dtype is not DType.bool or mask.shape != dy.shape:
        ctx.fail(
            f"DropoutGrad: mask must be bool {dy.shape} like dY, got {mask.dtype} {mask.shape}",
            1,
            (DType.bool, dy.shape),
            (mask.dtype, mask.shape),
        )
    _dropout_p(ctx)
    return (ctx.out(dy.dtype, dy.shape),)


def _dropout_grad_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    dy = np.asarray(args[0])
    keep = np.asarray(args[1], dtype=bool)
    scale = 1.0 / (1.0 - float_attr(attrs, "p", 0.0))
    return (np.where(keep, f64(dy) * scale, 0.0).astype(dy.dtype),)


DROPOUT = register(
    OpDef(
        name="Dropout",
        family=FAMILY,
        cost_class=COST_CLASS,
        fusion=Fusion.POINTWISE,
        inputs=("X",),
        outputs=("Y", "mask"),
        infer=_dropout_rule,
        attrs={"p": AttrSpec("float")},
        reference=_dropout_ref,
        flops=in_numel_flops(2.0),  # a compare with the random draw, a scale
        doc="Inverted dropout: Y = X·mask/(1 − p) with mask (bool, X's shape) true with "
        "probability 1 − p; the reference runs p = 0 only (DropoutError).",
        sharding=sh.pointwise(),
    )
)
DROPOUT_GRAD = register(
    OpDef(
        name="DropoutGrad",
        family=FAMILY,
        cost_class=COST_CLASS,
        fusion=Fusion.POINTWISE,
        inputs=("dY", "mask"),
        outputs=("dX",),
        infer=_dropout_grad_rule,
        attrs={"p": AttrSpec("float")},
        reference=_dropout_grad_ref,
        flops=out_numel_flops(2.0),  # a select, a scale
        doc="dX = dY·mask/(1 − p), the gradient of Dropout given its mask.",
        sharding=sh.pointwise("scale"),
    )
)


def _tokens_rule(ctx: TypeCtx) -> Sequence[Type]:
    x = ctx.tensor(0)
    return (ctx.out(x.dtype, x.shape),)


def _copy_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    return (np.array(args[0], copy=True),)


def _tokens_op(name: str, writes: int, doc: str) -> OpDef:
    """A row copy of X (module docstring) that writes ``writes`` times X's bytes."""
    return register(
        OpDef(
            name=name,
            family=FAMILY,
            cost_class=COST_CLASS,
            inputs=("X",),
            outputs=("Y",),
            infer=_tokens_rule,
            reference=_copy_ref,
            bytes_written=lambda ins, outs, attrs: float(writes * outs[0].nbytes),
            doc=doc,
            sharding=sh.pointwise("linear"),
        )
    )


UNPAD_TOKENS = _tokens_op(
    "UnpadTokens",
    1,
    "Y = X: flash-attn's index_first_axis keeping every token (a gather of the rows: X read, Y written).",
)
PAD_TOKENS = _tokens_op(
    "PadTokens",
    2,
    "Y = X: flash-attn's pad_input of a batch without padding (Y zeroed, then the rows of X put in).",
)


# -- gradient rules (contract: distir.ops.gradrules) --------------------------------------------
def _softmax_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    axis = int_attr(op.attrs, "axis", -1)
    return ctx.op("SoftmaxGrad", first(douts), ctx.primal(op.outputs[0]), axis=axis)


def _log_softmax_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    axis = int_attr(op.attrs, "axis", -1)
    return ctx.op("LogSoftmaxGrad", first(douts), ctx.primal(op.outputs[0]), axis=axis)


def _norm_attrs(op: Op) -> dict[str, Any]:
    out: dict[str, Any] = {
        "axis": int_attr(op.attrs, "axis", -1),
        "epsilon": float_attr(op.attrs, "epsilon", 1e-5),
    }
    if op.attrs.get("zero_centered_gamma", False):
        out["zero_centered_gamma"] = True
    return out


def _layer_norm_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    """LayerNormalizationGrad gives dB shaped like Scale; a bias that broadcasts differently gets
    dY summed to its own shape instead."""
    dy = first(douts)
    x, scale = (ctx.primal(v) for v in op.inputs[:2])
    dx, dscale, db = ctx.op("LayerNormalizationGrad", dy, x, scale, **_norm_attrs(op))
    if len(op.inputs) == 2:
        return [dx, dscale]
    b_shape = ctx.type(op.inputs[2]).shape
    if b_shape != ctx.type(op.inputs[1]).shape:
        db = unbroadcast(ctx, dy, b_shape, ctx.type(op.inputs[0]).shape)
    return [dx, dscale, db]


def _rms_norm_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    x, scale = (ctx.primal(v) for v in op.inputs)
    return ctx.op("RMSNormalizationGrad", first(douts), x, scale, **_norm_attrs(op))


def _causal_mask_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    return ctx.op("CausalMask", first(douts), fill=0.0)


def _dropout_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    """dX = DropoutGrad(dY, mask); the mask (bool) takes no cotangent."""
    dy = douts[0]
    if dy is None:
        return [None]
    p = float_attr(op.attrs, "p", 0.0)
    return ctx.op("DropoutGrad", dy, ctx.primal(op.outputs[1]), p=p)


SOFTMAX.fill("grad", _softmax_grad)
LOG_SOFTMAX.fill("grad", _log_softmax_grad)
LAYER_NORMALIZATION.fill("grad", _layer_norm_grad)
RMS_NORMALIZATION.fill("grad", _rms_norm_grad)
CAUSAL_MASK.fill("grad", _causal_mask_grad)
DROPOUT.fill("grad", _dropout_grad)
UNPAD_TOKENS.fill("grad", lambda ctx, op, douts: ctx.op("PadTokens", first(douts)))
PAD_TOKENS.fill("grad", lambda ctx, op, douts: ctx.op("UnpadTokens", first(douts)))

__all__ = [
    "DropoutError",
    "check_param",
    "gamma_shift",
    "layer_norm_stats",
    "log_softmax",
    "norm_axes_of",
    "norm_shape",
    "norm_start",
    "rms_norm_stats",
    "softmax",
    "softmax_axis",
]


# -- torch implementations (contract: distir.ops._torch) ----------------------------------------
def norm_shape(x: Any, attrs: Attrs) -> tuple[int, ...]:
    """The normalized (trailing) shape of ``x``: its axes ``[axis, rank)``."""
    return tuple(x.shape[int_attr(attrs, "axis", -1) % x.dim() :])


def _layer_norm_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    x, shape = xs[0], norm_shape(xs[0], attrs)
    bias = xs[2].expand(shape) if len(xs) > 2 and xs[2] is not None else None
    eps = float_attr(attrs, "epsilon", 1e-5)
    scale = xs[1] + 1 if gamma_shift(attrs) else xs[1]
    return (ctx.torch.nn.functional.layer_norm(x, shape, scale.expand(shape), bias, eps),)


def _rms_norm_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    x, shape = xs[0], norm_shape(xs[0], attrs)
    eps = float_attr(attrs, "epsilon", 1e-5)
    return (ctx.torch.nn.functional.rms_norm(x, shape, xs[1].expand(shape), eps),)


def _causal_mask_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    x = xs[0]
    i, j = x.shape[-2:]
    above = ctx.torch.ones((i, j), dtype=ctx.torch.bool, device=x.device).triu(1)
    fill = float_attr(attrs, "fill", -1e9)
    info = ctx.torch.finfo(x.dtype)  # the fill as the dtype holds it (f16: -65504, not -inf)
    return (x.masked_fill(above, min(max(fill, info.min), info.max)),)


def _dropout_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """p = 0: the identity and an all-true mask, as the reference. p > 0: a mask drawn from
    torch's generator on the device (seeded by the runner; each rank draws its own, as trainers
    do), which no reference reproduces (the module docstring)."""
    x, p = xs[0], float_attr(attrs, "p", 0.0)
    if p == 0.0:
        return (x, ctx.torch.ones(x.shape, dtype=ctx.torch.bool, device=x.device))
    keep = ctx.torch.rand(x.shape, device=x.device) >= p
    return (x * keep * (1.0 / (1.0 - p)), keep)


def _dropout_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    dy, keep = xs
    scale = 1.0 / (1.0 - float_attr(attrs, "p", 0.0))
    return (ctx.torch.where(keep, dy * scale, ctx.torch.zeros_like(dy)),)


SOFTMAX.fill("torch", lambda ctx, xs, attrs: (ctx.torch.softmax(xs[0], int_attr(attrs, "axis", -1)),))
LOG_SOFTMAX.fill("torch", lambda ctx, xs, attrs: (ctx.torch.log_softmax(xs[0], int_attr(attrs, "axis", -1)),))
LAYER_NORMALIZATION.fill("torch", _layer_norm_torch)
RMS_NORMALIZATION.fill("torch", _rms_norm_torch)
CAUSAL_MASK.fill("torch", _causal_mask_torch)
DROPOUT.fill("torch", _dropout_torch)
DROPOUT_GRAD.fill("torch", _dropout_grad_torch)
UNPAD_TOKENS.fill("torch", lambda ctx, xs, attrs: (xs[0].clone(),))
PAD_TOKENS.fill("torch", lambda ctx, xs, attrs: (xs[0].clone(),))
