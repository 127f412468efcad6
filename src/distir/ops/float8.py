"""Float8 training's scaling cast: ``Float8Cast`` (dynamic tensorwise scaling to float8).

FP8 training as torchao's ``Float8Linear`` runs it (torchtitan's float8; torchao ``eab345c``,
``torchao/float8/float8_linear.py`` and ``float8_scaling_utils.py``, the recipe of the
default ``Float8LinearConfig``): each linear layer casts its input and its weight to float8
E4M3 and, in the backward, the incoming gradient to E5M2, each with a *dynamic tensorwise*
scale, ``scale = FP8_MAX / max|x|`` over the whole tensor (``tensor_to_scale``), then
multiplies the float8 operands on the FP8 tensor cores (``torch._scaled_mm``; MatMul of two
float8 operands, ``distir.ops.linalg``), the product coming out in bf16.

``Float8Cast(x; to=f8e4m3|f8e5m2, scaling=dynamic|delayed|saved, layouts=2|1)`` is that
cast. With ``dynamic`` scaling (torchao's) it is two memory-bound passes over ``x``: the amax
reduction reads it, the scaled cast reads it again. With ``delayed`` scaling (Transformer
Engine's ``DelayedScaling``, llm-foundry's ``amp_fp8``) the scale comes from the amax history of
earlier steps, so one pass reads ``x``, records its amax and casts (TE's
``fp8_cast_transpose_fused``). ``saved`` is a dynamic cast run again in the backward whose amax
the forward saved (torchtitan's selective checkpointing saves ``aten.max``'s result:
``distir.autodiff.reverse``): one pass, the same values; so is ``precomputed``, a weight's
shard cast with the scale of the whole weight before FSDP gathers it in float8
(``distir.parallel.fp8_cache``; the reference scales the shard by its own amax, as a sharded
dynamic cast, below). The cast writes ``layouts`` bytes per
element: by default the float8 tensor in both layouts, because Hopper's FP8 GEMMs take only
row-major first and column-major second operands (torchao eab345c, ``float8_ops.py``
``preprocess_addmm``: ``b_data.t().contiguous().t()``), and every float8 operand is read in the
other layout by one of the three products of its linear layer (the input by the weight
gradient, the weight by the input gradient, the gradient by the weight gradient): TE writes
both in its cast, torch.compile fuses torchao's copy into it. A cast that the backward runs
again instead of saving writes one layout in each pass (``layouts=1``): the forward's products
read the input and the weight as they come (``x @ w.t()``, torchao's
``manual_float8_matmul_with_args_in_float8.forward``), the backward's only the other layout (the
input by the weight gradient, the weight by the input gradient), which Inductor writes in the
recomputed cast's one kernel; the gradient's cast, read by both backward products, writes both.
Two FLOPs
per element (the abs-max, the scaling); the scale itself is a scalar beside the tensor
(torchao's ``Float8Tensor._scale``), whose 4 bytes the types do not count, as they do not
count the second layout (memory holds one). Under tensor parallelism the amax of a sharded
tensor is an all-reduce of one scalar (DTensor's ``max``); TE reduces its amaxes once per
forward; neither is modelled: the sharding rule is pointwise, so a sharded cast scales each
shard by its own amax — the same values up to a float8 rounding step (the tolerance
``distir.backend.verify`` allows for float8 programs), the same bytes and time.

The reference holds a float8 tensor as the float32 values it stands for: ``x`` scaled, rounded
to the float8 grid (round to nearest even, subnormals included), saturated at ``FP8_MAX`` and
scaled back. So the rounding error of float8 is genuinely there and MatMul of two float8
operands is an ordinary product of those values. Delayed scaling computes as dynamic scaling
does (the steady state of an amax history whose largest entry is this tensor's amax): the
reference holds no state across steps. The torch backend holds them so too, in bf16
(a CPU has no float8 GEMM). The gradient is straight-through (torchao's casts pass the
gradient on unchanged: ``ToFloat8ConstrFunc.backward``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from distir.ir.ops import Op
from distir.ir.types import DType, Type
from distir.ir.values import Attrs, Value
from distir.ops._rules import int_attr, numel
from distir.ops.gradrules import GradCtx, first
from distir.ops.linalg import DYNAMIC_SCALING, FLOAT8_PRODUCT, FLOAT8_SCALINGS
from distir.ops.registry import AttrSpec, CostClass, OpDef, TypeCtx, register
from distir.ops.sharding import pointwise

if TYPE_CHECKING:
    from distir.backend.context import TorchContext

FAMILY = "float8"
COST_CLASS = CostClass.ELEMENTWISE

FP8_MAX: dict[DType, float] = {DType.f8e4m3: 448.0, DType.f8e5m2: 57344.0}
"""The largest finite value of each float8 type (OCP FP8: E4M3 "fn", E5M2)."""

_MANTISSA = {DType.f8e4m3: 3, DType.f8e5m2: 2}
_MIN_EXP = {DType.f8e4m3: -6, DType.f8e5m2: -14}  # the smallest normal's exponent
AMAX_EPS = 1e-12
"""The floor of the amax a scale divides by (torchao's ``EPS``), so an all-zero tensor scales."""


def round_to_float8(x: Any, to: DType) -> np.ndarray:
    """``x`` (float32, already scaled) rounded to the nearest value of float8 type ``to`` (ties
    to even), saturated at ``±FP8_MAX[to]``: the grid of ``mantissa`` bits in every binade above
    the smallest normal, the subnormals' fixed step below it."""
    v = np.clip(np.asarray(x, dtype=np.float64), -FP8_MAX[to], FP8_MAX[to])
    mag = np.abs(v)
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.where(mag > 0, mag, 1.0)))
    step = np.exp2(np.maximum(e, _MIN_EXP[to]) - _MANTISSA[to])
    out: np.ndarray = np.clip(np.round(v / step) * step, -FP8_MAX[to], FP8_MAX[to]).astype(np.float32)
    return out


def float8_scale(x: Any, to: DType) -> float:
    """torchao's dynamic tensorwise scale of ``x``: ``FP8_MAX / max(amax, EPS)`` in float32."""
    amax = float(np.max(np.abs(np.asarray(x, dtype=np.float32)))) if np.size(x) else 0.0
    return float(np.float32(FP8_MAX[to]) / np.float32(max(amax, AMAX_EPS)))


def _float8_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = ctx.tensor(0)
    to = ctx.attr("to")
    if not isinstance(to, DType) or not to.is_float8:
        ctx.fail(f"Float8Cast casts to f8e4m3 or f8e5m2, not {to!r}", None, "a float8 dtype", to)
    if not t.dtype.is_float or t.dtype.is_float8:
        ctx.fail("Float8Cast scales a bf16, f16 or f32 tensor", 0, "a wide float dtype", t.dtype)
    return (ctx.out(to, t.shape),)


def _float8_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    to = attrs["to"]
    assert isinstance(to, DType)
    x = np.asarray(args[0], dtype=np.float32)
    scale = float8_scale(x, to)
    return ((round_to_float8(x * np.float32(scale), to) / np.float32(scale)).astype(np.float32),)


SAVED_SCALING = "saved"
PRECOMPUTED_SCALING = "precomputed"
SCALINGS = (*FLOAT8_SCALINGS, SAVED_SCALING, PRECOMPUTED_SCALING)
"""How a cast finds its scale: from this tensor's amax (torchao), earlier steps' (TE), the
amax its forward saved (a dynamic cast run again in the backward), or a scale computed before
the cast from the whole tensor's amax (torchao's ``precompute_float8_dynamic_scale_for_fsdp``,
which takes every float8 weight's amax after the optimizer step: a weight's shard cast before
FSDP gathers it)."""
LAYOUTS = (2, 1)
"""The layouts a cast writes: both (the default), or one (a cast the backward runs again, or a
weight's shard cast before FSDP gathers it, read by the forward's products as it comes)."""


def recomputed(attrs: Attrs, amax_saved: bool) -> Attrs:
    """The attributes of a cast the backward runs again (module docstring): one layout, and,
    when the checkpointing policy saved the forward's amax (``amax_saved``), a dynamic scale
    taken from it."""
    saved = amax_saved and attrs.get("scaling", DYNAMIC_SCALING) == DYNAMIC_SCALING
    return Attrs({**one_layout(attrs), **({"scaling": SAVED_SCALING} if saved else {})})


def one_layout(attrs: Attrs) -> Attrs:
    """A torchao cast (dynamic scaling) writing one layout: its result is not saved for the
    backward, which casts again (module docstring). TE's casts (``delayed``) write both."""
    if attrs.get("scaling", DYNAMIC_SCALING) == "delayed":
        return attrs
    return Attrs({**attrs, "layouts": 1})


def _float8_bytes_read(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    """Dynamic: two passes over the input (the amax reduction, then the scaled cast); delayed,
    saved or precomputed: one."""
    return (2.0 if attrs.get("scaling", DYNAMIC_SCALING) == DYNAMIC_SCALING else 1.0) * ins[0].nbytes


def _float8_bytes_written(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    """The float8 tensor in ``layouts`` layouts (module docstring)."""
    return int_attr(attrs, "layouts", 2) * outs[0].nbytes


def _float8_flops(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    """The abs-max and the scaling: one FLOP each per element."""
    return 2.0 * numel(ins[0])


FLOAT8_CAST = register(
    OpDef(
        name="Float8Cast",
        family=FAMILY,
        cost_class=COST_CLASS,
        inputs=("X",),
        outputs=("Y",),
        infer=_float8_rule,
        attrs={
            "to": AttrSpec("dtype"),
            "scaling": AttrSpec("str", DYNAMIC_SCALING, SCALINGS),
            "layouts": AttrSpec("int", 2, LAYOUTS),
        },
        reference=_float8_ref,
        flops=_float8_flops,
        bytes_read=_float8_bytes_read,
        bytes_written=_float8_bytes_written,
        doc="Tensorwise scaling to float8: scale = FP8_MAX/amax, X·scale rounded and saturated "
        "to ``to``; held as the values it stands for. Dynamic (torchao): amax over X, two "
        "passes over X; delayed (Transformer Engine): amax from earlier steps, one pass; saved: "
        "a dynamic cast run again with the forward's amax, one pass; precomputed: a shard cast with the "
        "whole tensor's scale, one pass. Writes ``layouts`` "
        "layouts: both (Hopper's FP8 GEMM operand order) or one (a cast the backward runs again).",
        sharding=pointwise(),
    )
)


def _float8_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    """Straight-through, as torchao's cast passes the gradient on unchanged. The cotangent of a
    float8 value is in bf16 (the dtype a float8 product comes out in, whose backward makes it:
    ``FLOAT8_PRODUCT``); it is cast to the input's dtype when that is another."""
    dy = first(douts)
    x = ctx.type(op.inputs[0])
    if x.dtype is FLOAT8_PRODUCT:
        return [dy]
    return [ctx.op("Cast", dy, to=x.dtype)[0]]


def _float8_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """The reference's rounding, in torch: scaled, converted to torch's own float8 type (round to
    nearest even, saturated first), back to float32, unscaled; held in bf16."""
    to = attrs["to"]
    assert isinstance(to, DType)
    torch = ctx.torch
    x = xs[0].float()
    amax = x.abs().max() if x.numel() else torch.zeros((), device=x.device)
    scale = FP8_MAX[to] / torch.clamp(amax, min=AMAX_EPS)
    fp8 = torch.float8_e4m3fn if to is DType.f8e4m3 else torch.float8_e5m2
    q = torch.clamp(x * scale, -FP8_MAX[to], FP8_MAX[to]).to(fp8).float()
    return ((q / scale).to(ctx.dtype(to)),)


FLOAT8_CAST.fill("grad", _float8_grad)
FLOAT8_CAST.fill("torch", _float8_torch)
