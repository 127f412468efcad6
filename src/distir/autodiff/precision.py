"""Training precision: ``pure`` (everything in the model's dtype) or ``mixed`` (Micikevicius et al.,
"Mixed Precision Training", ICLR 2018; the layout of ZeRO, Megatron-LM, PyTorch AMP/FSDP).

A model is built in its *compute* dtype (``build_model(spec, batch, dtype=bf16)``). Under mixed
precision the training step (``training_step``, ``distribute``) then keeps, per weight:

- an fp32 **master weight** and fp32 **optimizer state** (Adam's ``m``, ``v``): the step's weight and
  state parameters and results are fp32;
- one **compute copy**: ``%w_bf16 = Cast(%w, to=bf16)``; forward and backward run on it, in the
  compute dtype. The sequential step casts it once per step before any use; ``distribute`` keeps
  it as trainers do — a step input that persists between steps, made anew from the updated
  master after the optimizer and written into the old copy's place (``Function.donated``);
- the **gradient** in the compute dtype: accumulated over microbatches and reduced over the
  data-parallel replicas in that dtype (half the bytes of an fp32 reduction — DeepSpeed ZeRO's and
  FSDP's default ``reduce_dtype = param_dtype``; Megatron-LM instead accumulates and all-reduces
  bf16 gradients in fp32, a precision/communication trade this IR could express by moving the
  Cast before the reduction), then cast to fp32 (``%g_w_f32 = Cast(%g_w, to=f32)``) for the
  optimizer, which updates the fp32 master.

The **loss layer** computes in fp32 (``with_fp32_loss``): its floating-point inputs (the logits,
float targets) are cast to fp32 first, as Megatron-LM (``output.float()`` before the cross
entropy) and PyTorch autocast (softmax / log-softmax / losses autocast to fp32) do — a softmax
over a large vocabulary and a sum over the whole batch lose too much in bf16. So the loss is
fp32, and the gradient entering the backward is cast back to the compute dtype by Cast's own
gradient rule.

Model state per parameter with Adam (bytes): 4 master + 2 compute copy + 2 gradient + 4 ``m`` + 4
``v`` = **16** (``state_bytes``), the ZeRO paper's 2Ψ + 2Ψ + 12Ψ. ZeRO partitions what it
partitions in that paper: stage 1 and 2 shard the master with the optimizer state (the master is
optimizer state: K = 12 bytes per parameter), cast the shard and all-gather the *compute* copy
(2 bytes per parameter, where the fp32 path gathers 4); stage 3 also keeps the compute copy
sharded and gathers the low-precision copy right before each use (DeepSpeed ZeRO-3 gathers fp16 /
bf16 parameters, never fp32 masters).

An **optimizer in the compute dtype** (``with_optimizer_dtype("bf16")``: NeMo's ``optim.dtype:
bf16``, with which Apex's DistributedFusedAdam keeps no parameter copy, ``store_params=False``)
keeps no masters: the optimizer updates the compute weights themselves, with ``m`` and ``v`` in
the compute dtype, 2 + 2 + 2 + 2 = 8 bytes per parameter; the loss still computes in fp32.

**FP8** (``fp8``: mixed precision whose linear layers multiply in float8, as torchtitan's float8
training runs torchao's ``Float8Linear`` with dynamic tensorwise scaling;
``with_float8_linears``): every matrix product of an activation by a weight in every layer but
the last two (the head, the output projection torchtitan leaves in bf16 with
``module_filter_fn=lambda mod, fqn: fqn != "output"``, and the loss) multiplies float8 operands:
``MatMul(Float8Cast(x, to=f8e4m3), Float8Cast(w, to=f8e4m3))``, its backward casting the
gradient to E5M2 (``distir.ops.float8``). Attention, norms, embeddings and the head stay in the
compute dtype; master weights, gradients and optimizer state are as under ``mixed``. An
activation read by several linear layers (q, k and v; SwiGLU's two inputs) is cast once, as
torch.compile's common-subexpression elimination (and torchtitan's ``PrepareFloat8ModuleInput``
under tensor parallelism) leaves it. The float8 operands are what the backward reads, so they
are what is saved for it (torchao ``manual_float8_matmul_with_args_in_float8`` saves
``input_fp8`` and ``weight_fp8_t``); where the checkpointing policy recomputes them instead,
each pass's cast writes the one layout its products read, and torchtitan's op-level policy,
which saves the amax, casts again in one pass (``distir.autodiff.reverse``,
``distir.ops.float8``). A GPU without FP8 tensor cores cannot run it (``check_devices``).
``fp8-delayed`` is the same with Transformer Engine's delayed scaling (llm-foundry's ``amp_fp8``
through ``te.Linear``: the scales from earlier steps' amax history, so each cast is one pass
over its input; ``distir.ops.float8``). What TE does besides is not modelled: its cast of the
LayerNorm output fused into ``LayerNormLinear`` (llm-foundry's MPT uses plain ``te.Linear``),
its amax history update and reduction once per step.

The reference executor computes bf16 in float32 (``DType.to_numpy``); ``Cast`` to bf16 rounds to
the bf16 grid (round to nearest even), so masters, compute copies and the gradients entering
the backward are genuinely rounded; f16 computes in numpy's float16.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from distir.autodiff.reverse import AutodiffError
from distir.frontends.zoo.model import Model
from distir.interp.shapes import TypeDomain, infer_types, type_of
from distir.ir.builder import FunctionBuilder
from distir.ir.function import Function, Module
from distir.ir.ops import Call, Op
from distir.ir.rewrite import ValueMap, copy_instr
from distir.ir.types import DType, TensorType
from distir.ir.values import Attrs, Value
from distir.ops.float8 import FLOAT8_CAST
from distir.ops.linalg import DYNAMIC_SCALING, MATMUL
from distir.ops.registry import REGISTRY
from distir.ops.shape.family import FAMILY as SHAPE_FAMILY

if TYPE_CHECKING:
    from collections.abc import Iterable

    from distir.hardware.specs import DeviceSpec

LOW = (DType.bf16, DType.f16)
OPTIMIZER_DTYPES = ("f32", "bf16", "f16")  # ``Precision.with_optimizer_dtype``


class PrecisionError(AutodiffError):
    """A precision option that does not apply (e.g. mixed precision of an f32 model)."""


@dataclass(frozen=True, slots=True)
class Precision:
    """``pure``, ``mixed`` or ``fp8`` (module docstring); ``master`` is the dtype of master
    weights and optimizer state, ``loss`` the dtype the loss layer computes in, under mixed
    precision; ``float8``: the linear layers multiply in float8 (mixed precision otherwise)."""

    mixed: bool = False
    master: DType = DType.f32
    loss: DType = DType.f32
    float8: bool = False
    float8_scaling: str = DYNAMIC_SCALING  # Float8Cast's scaling: dynamic (torchao) or delayed (TE)

    def __str__(self) -> str:
        if self.float8:
            return "fp8" if self.float8_scaling == DYNAMIC_SCALING else f"fp8-{self.float8_scaling}"
        return "mixed" if self.mixed else "pure"

    @staticmethod
    def parse(text: str | Precision) -> Precision:
        if isinstance(text, Precision):
            return text
        if text == "pure":
            return PURE
        if text == "mixed":
            return MIXED
        if text == "fp8":
            return FP8
        if text == "fp8-delayed":
            return FP8_DELAYED
        raise PrecisionError(f"precision must be pure, mixed, fp8 or fp8-delayed, got {text!r}")

    def with_optimizer_dtype(self, text: str) -> Precision:
        """This precision with master weights and optimizer state in ``text`` (f32, bf16 or
        f16). Mixed precision only: a dtype equal to the compute dtype keeps no masters, the
        optimizer updating the weights themselves (``distir.parallel.distribute``); pure
        precision keeps everything in the model's dtype."""
        if text not in OPTIMIZER_DTYPES:
            raise PrecisionError(f"the optimizer's dtype must be f32, bf16 or f16, got {text!r}")
        dt = DType(text)
        if dt is self.master:
            return self
        if not self.mixed:
            raise PrecisionError(
                f"an optimizer dtype ({text}) applies to mixed precision; precision {self} keeps the "
                "optimizer state in the model's dtype"
            )
        return replace(self, master=dt)

    def compute_dtype(self, model: Model) -> DType:
        """The dtype the model computes in (its weights'); under mixed precision it must be bf16
        or f16."""
        dtypes = {w.type.dtype for w in model.weights}
        if len(dtypes) != 1:
            raise PrecisionError(
                f"model {model.name}: weights of several dtypes ({', '.join(sorted(map(str, dtypes)))}); "
                "a training precision needs one compute dtype"
            )
        (dt,) = dtypes
        if self.float8 and dt is not DType.bf16:
            raise PrecisionError(
                f"fp8 precision computes what is not float8 in bf16; model {model.name} is {dt} "
                "(build it with --dtype bf16)"
            )
        if self.mixed and dt not in LOW:
            raise PrecisionError(
                f"mixed precision computes in bf16 or f16 with {self.master} master weights; model "
                f"{model.name} is {dt} (build it in bf16 or f16, or train in pure precision)"
            )
        return dt

    def master_type(self, t: TensorType) -> TensorType:
        """The type of a weight's (or its optimizer state's) step parameter."""
        return TensorType(self.master, t.shape, t.device) if self.mixed else t

    def prepare(self, model: Model) -> Model:
        """The model the step differentiates: under mixed precision, with its loss in fp32; under
        fp8, with its linear layers in float8 too."""
        if self.float8:
            model = with_float8_linears(model, self.float8_scaling)
        if not self.mixed or model.loss_dtype == self.loss:  # a fused loss computes in fp32 itself
            return model
        return with_fp32_loss(model, self.loss)

    def check_devices(self, devices: Iterable[DeviceSpec]) -> None:
        """Refuse fp8 on GPUs without FP8 tensor cores (``DeviceSpec.fp8`` None)."""
        if not self.float8:
            return
        lacking = sorted({d.name for d in devices if d.fp8 is None})
        if lacking:
            raise PrecisionError(
                f"--precision fp8 needs FP8 tensor cores; {', '.join(lacking)} has none (H100 has)"
            )


PURE = Precision()
MIXED = Precision(mixed=True)
FP8 = Precision(mixed=True, float8=True)
FP8_DELAYED = Precision(mixed=True, float8=True, float8_scaling="delayed")


def with_float8_linears(model: Model, scaling: str = DYNAMIC_SCALING) -> Model:
    """``model`` whose linear layers multiply in float8 (module docstring): in the functions of
    every layer but the last two, each ``MatMul(x, w)`` of an activation by a weight (a layer
    parameter other than the first, the activation, or a view of one by a shape op; not
    transposed on the left) becomes
    ``MatMul(Float8Cast(x), Float8Cast(w))``, E4M3 both, each distinct operand cast once, with
    ``scaling`` (``Float8Cast``'s: dynamic or delayed; the product's ``grad_scaling`` the same).
    A function also called by the last two layers is left as it is."""
    kept = {c.callee for c in model.layers[-2:]}
    names = {c.callee for c in model.layers[:-2]} - kept
    functions = tuple(_float8_linears(f, scaling) if f.name in names else f for f in model.module.functions)
    return replace(model, module=Module(functions))


def _float8_linears(fn: Function, scaling: str) -> Function:
    fb = FunctionBuilder(fn.name, REGISTRY.out_arity)
    how: dict[str, object] = {} if scaling == DYNAMIC_SCALING else {"scaling": scaling}  # default: unprinted
    vmap = ValueMap()
    for p in fn.params:
        vmap.bind(p, fb.param(p.name))
    weights = set(fn.params[1:])  # and their views (context parallelism's broadcast weights)
    casts: dict[Value, Value] = {}

    def f8(v: Value) -> Value:
        if v not in casts:
            attrs = Attrs({"to": DType.f8e4m3, **how})
            casts[v] = fb.emit(FLOAT8_CAST.name, (v,), attrs, [f"{v.name}_f8"])[0]
        return casts[v]

    for instr in fn.body:
        if not isinstance(instr, Op):
            fb.append(copy_instr(instr, vmap))
            continue
        view = len(instr.inputs) == 1 and instr.inputs[0] in weights
        if view and REGISTRY[instr.name].family == SHAPE_FAMILY:  # a view of a weight is a weight
            weights.update(instr.outputs)
        linear = instr.name == MATMUL.name and instr.inputs[1] in weights
        if linear and not instr.attrs.get("transA", 0):
            a, b = (vmap(v) for v in instr.inputs)
            attrs = Attrs({**instr.attrs, **({"grad_scaling": scaling} if how else {})})
            (y,) = fb.emit(MATMUL.name, (f8(a), f8(b)), attrs, [instr.outputs[0].name])
            vmap.bind(instr.outputs[0], y)
        else:
            fb.append(copy_instr(instr, vmap))
    return fb.ret(*(vmap(v) for v in fn.outputs))


def with_fp32_loss(model: Model, dtype: DType = DType.f32) -> Model:
    """``model`` whose loss layer first casts its floating-point arguments to ``dtype``: the
    layer ``@loss`` becomes ``@loss_f32(x, ...) = @loss(Cast(x, to=f32), ...)`` (the body copied,
    so the layer stays one function that autodiff and sharding see whole)."""
    fwd = model.forward
    last = model.layers[-1]
    _, env = infer_types(model.module, domain=TypeDomain(concrete_limit=0))
    arg_types = [type_of(env[v]) for v in last.inputs]
    callee = model.module[last.callee]
    name = f"{callee.name}_{dtype}"
    fb = FunctionBuilder(name, REGISTRY.out_arity)
    vmap = ValueMap()
    for p, t in zip(callee.params, arg_types, strict=True):
        q = fb.param(p.name)
        if isinstance(t, TensorType) and t.dtype.is_float and t.dtype != dtype:
            (q,) = fb.op("Cast", q, names=[f"{p.name}_{dtype}"], to=dtype)
        vmap.bind(p, q)
    for instr in callee.body:
        fb.append(copy_instr(instr, vmap))
    wrapper = fb.ret(*(vmap(v) for v in callee.outputs))
    body = tuple(Call(name, i.inputs, i.outputs) if i is last else i for i in fwd.body)
    entry = Function(fwd.name, fwd.params, body, fwd.outputs)
    functions = [f for f in model.module.functions if f is not fwd]
    return replace(model, module=Module((*functions, wrapper, entry)))


def cast(fb: FunctionBuilder, v: Value, to: DType, name: str) -> Value:
    """``%name = Cast(%v, to=...)``."""
    return fb.op("Cast", v, names=[name], to=to)[0]


def state_bytes(optimizer_state: int, precision: Precision, dtype: DType) -> dict[str, int]:
    """Bytes per parameter of the model state during a step, by part: ``master`` (fp32 weights,
    mixed only), ``weights`` (the compute copy; the weights themselves when pure), ``grads``
    (compute dtype) and ``optimizer`` (``optimizer_state`` tensors per weight, e.g. Adam's 2)."""
    low = dtype.itemsize
    if not precision.mixed or precision.master is dtype:  # no masters: the weights are updated
        return {"master": 0, "weights": low, "grads": low, "optimizer": optimizer_state * low}
    hi = precision.master.itemsize
    return {"master": hi, "weights": low, "grads": low, "optimizer": optimizer_state * hi}


__all__ = [
    "FP8",
    "FP8_DELAYED",
    "MIXED",
    "OPTIMIZER_DTYPES",
    "PURE",
    "Precision",
    "PrecisionError",
    "cast",
    "state_bytes",
    "with_float8_linears",
    "with_fp32_loss",
]
