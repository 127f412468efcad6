"""Training steps: forward + loss + backward + optimizer update, built from a zoo model's chain.

``training_step(model)`` is the *sequential* step every distributed program is checked against:

    func @train_step(inputs..., weights..., [m..., v..., step]) {
      %a1, %res0... = @embed_fwd(%ids, %wte, %wpe)          // forward, layer by layer
      ...
      %loss, %resL... = @loss_fwd(%aL, %labels)
      %dloss = FillLike(%loss, value=1.0)                     // the seed
      %daL = @loss_bwd(%resL..., %dloss)                      // backward, layer by layer
      ...
      %w_new = SGD(%w, %dw, lr=...)                           // or Adam with its state
      return %loss, %w_new..., [%m_new..., %v_new...]
    }

With ``precision="mixed"`` (``distir.autodiff.precision``) the weight and state parameters are
fp32 masters, ``%w_bf16 = Cast(%w, to=bf16)`` feeds the layers, the loss layer computes in fp32,
and each gradient is cast to fp32 (``%dw_f32 = Cast(%dw, to=f32)``) before the update.

Layers are differentiated once per distinct (layer function, argument types) (``layer_vjps``), so
repeated blocks share one ``_fwd``/``_bwd`` pair and the program stays as small as the model.
Layer 0 is not differentiated with respect to the model input (data, token ids); the loss layer
only with respect to its activation. The recompute policy applies to the repeated blocks only:
the layers before them (``Model.pre``: the embedding) and after them (``Model.post``: head and
loss) save what their backward reads, as every trainer checkpoints its transformer layers and
nothing else (torchtitan's ``apply_ac`` wraps each block of ``model.layers``,
torchtitan/parallelisms/parallelize_llama.py; Megatron-LM recomputes inside its transformer
block, ``--recompute-granularity`` full or selective), so a loss's log-softmax is kept, not
recomputed before its gradient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from distir.autodiff.precision import Precision, cast
from distir.autodiff.reverse import POLICIES, VJP, AutodiffError, vjp
from distir.frontends.zoo.model import Model
from distir.interp.shapes import TypeDomain, infer_types, type_of
from distir.ir.builder import FunctionBuilder
from distir.ir.function import Function, Module
from distir.ir.types import Device, DType, TensorType, Type
from distir.ir.values import Attrs, AttrValue, Value
from distir.ops.optim import CLIP_BY_NORM, CLIP_SCALES, GRAD_NORM_SQ
from distir.ops.registry import REGISTRY


@dataclass(frozen=True, slots=True)
class Optimizer:
    """``sgd`` or ``adam`` with its hyper-parameters; Adam keeps ``m`` and ``v`` per weight and
    takes the 1-based step count as an ``i64`` scalar input ``step``."""

    kind: str = "sgd"
    lr: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    # how Adam's update runs, for its cost: one fused kernel, or the passes over the state of
    # torch.optim.AdamW(foreach=True) (foreach) or Composer's DecoupledAdamW (loop)
    # (``distir.ops.optim.ADAM_PASSES``)
    kernels: str = "fused"
    # gradient-norm clipping before the update: the global L2 norm's bound (0: none), and when
    # the scaling runs, for its cost (``distir.ops.optim.CLIP_SCALES``: always, as torch's
    # clip_grad_norm_; if_over, as Megatron-LM's and DeepSpeed's host-side test)
    max_norm: float = 0.0
    clip_scale: str = "always"

    def __post_init__(self) -> None:
        if self.kind not in ("sgd", "adam"):
            raise AutodiffError(f"optimizer must be sgd or adam, got {self.kind!r}")
        if self.kernels not in ("fused", "foreach", "loop"):
            raise AutodiffError(f"optimizer kernels must be fused, foreach or loop, got {self.kernels!r}")
        if not (isinstance(self.max_norm, int | float) and 0.0 <= self.max_norm < math.inf):
            raise AutodiffError(f"the clipping norm must be 0 (none) or positive, got {self.max_norm!r}")
        if self.clip_scale not in CLIP_SCALES:
            raise AutodiffError(
                f"clip_scale must be one of {', '.join(CLIP_SCALES)}, got {self.clip_scale!r}"
            )

    @property
    def state(self) -> tuple[str, ...]:
        return ("m", "v") if self.kind == "adam" else ()

    def emit(
        self, fb: FunctionBuilder, w: Value, g: Value, state: Sequence[Value], step: Value | None
    ) -> tuple[Value, ...]:
        """The update ops for one weight: ``(new_w, *new_state)``."""
        if self.kind == "sgd":
            return fb.op("SGD", w, g, names=[f"{w.name}_new"], lr=self.lr)
        assert step is not None
        m, v = state
        attrs: dict[str, AttrValue] = {"lr": self.lr, "beta1": self.beta1, "beta2": self.beta2}
        attrs["epsilon"] = self.epsilon
        if self.kernels != "fused":
            attrs["kernels"] = self.kernels
        names = [f"{w.name}_new", f"{m.name}_new", f"{v.name}_new"]
        return fb.emit("Adam", (w, g, m, v, step), Attrs(attrs), names)

    def emit_remainder(
        self, fb: FunctionBuilder, high: Value, rem: Value, g: Value, state: Sequence[Value], step: Value
    ) -> tuple[Value, ...]:
        """Adam's update of a master kept as its bf16 copy ``high`` and int16 remainder ``rem``
        (``AdamRemainder``, Apex's store_param_remainders): ``(new_high, new_rem, *new_state)``."""
        if self.kind != "adam":
            raise AutodiffError(f"master remainders are updated by Adam, not {self.kind}")
        m, v = state
        attrs: dict[str, AttrValue] = {"lr": self.lr, "beta1": self.beta1, "beta2": self.beta2}
        attrs["epsilon"] = self.epsilon
        names = [f"{high.name}_new", f"{rem.name}_new", f"{m.name}_new", f"{v.name}_new"]
        return fb.emit("AdamRemainder", (high, rem, g, m, v, step), Attrs(attrs), names)

    def norm_terms(self, fb: FunctionBuilder, grads: Sequence[Value]) -> list[Value]:
        """Each gradient's sum of squares (``GradNormSq``): the terms of the global norm."""
        return [fb.op("GradNormSq", g, names=[f"{g.name}_sumsq"])[0] for g in grads]

    def clipped(self, fb: FunctionBuilder, g: Value, sumsq: Value) -> Value:
        """``g`` scaled by the clip coefficient of the global sum of squares ``sumsq``."""
        attrs = Attrs({"max_norm": float(self.max_norm), "scale": self.clip_scale})
        return fb.emit("ClipByNorm", (g, sumsq), attrs, (f"{g.name}_clipped",))[0]

    def clip(self, fb: FunctionBuilder, grads: Sequence[Value]) -> list[Value]:
        """The step's gradients, all on one device, clipped by their global norm (as given
        without ``max_norm``)."""
        if not self.max_norm:
            return list(grads)
        terms = self.norm_terms(fb, grads)
        total = terms[0] if len(terms) == 1 else fb.op("Sum", *terms, names=["grad_sumsq"])[0]
        return [self.clipped(fb, g, total) for g in grads]


class UpdateTraffic(NamedTuple):
    """What the step's update costs per weight after the gradient sync, as ``training_step`` and
    ``distribute`` write it: ``bytes_per_param`` moved through memory per parameter updated, and
    ``kernels`` launched per weight."""

    bytes_per_param: float
    kernels: int


def update_traffic(opt: Optimizer, dtype: DType, mixed: bool) -> UpdateTraffic:
    """The update of a weight in compute dtype ``dtype``: the optimizer's op on the weight (fp32
    under ``mixed``), and under ``mixed`` the gradient's Cast to fp32 before it and the master's
    Cast to the compute copy after it; bytes from each op's registry cost rules."""
    n = 1 << 20
    master = DType.f32 if mixed else dtype
    w = TensorType(master, (n,), Device(0))
    step = TensorType(DType.i64, (), Device(0))
    ins = [w, w] + ([w, w, step] if opt.kind == "adam" else [])
    outs = [w] * (3 if opt.kind == "adam" else 1)
    attrs = Attrs({"kernels": opt.kernels} if opt.kind == "adam" else {})
    upd = REGISTRY["Adam" if opt.kind == "adam" else "SGD"]
    total = upd.bytes_read(ins, outs, attrs) + upd.bytes_written(ins, outs, attrs)
    total -= step.nbytes if opt.kind == "adam" else 0
    kernels = 1
    if mixed:
        low = TensorType(dtype, (n,), Device(0))
        cast = REGISTRY["Cast"]
        for a, b in ((low, w), (w, low)):  # the gradient up, the master down
            total += cast.bytes_read([a], [b], Attrs({})) + cast.bytes_written([a], [b], Attrs({}))
        kernels += 2
    if opt.max_norm:  # the norm's read of the gradient, then its scaling (``Optimizer.clip``)
        sumsq = TensorType(DType.f32, (), Device(0))
        attrs = Attrs({"scale": opt.clip_scale})
        for op, ins, outs in ((GRAD_NORM_SQ, [w], [sumsq]), (CLIP_BY_NORM, [w, sumsq], [w])):
            moved = op.bytes_read(ins, outs, attrs) + op.bytes_written(ins, outs, attrs)
            total += moved - (sumsq.nbytes if moved else 0.0)
            kernels += 1 if moved else 0
    return UpdateTraffic(total / n, kernels)


@dataclass(frozen=True)
class LayerGrad:
    """A layer call's derivative: which call arguments are differentiated (``wrt``, indices into
    the call's inputs) and the forward/backward functions."""

    index: int
    vjp: VJP


def layer_types(model: Model) -> list[list[Type]]:
    """The argument types of every layer call of the model's forward (full batch)."""
    _, env = infer_types(model.module, domain=TypeDomain(concrete_limit=0))
    return [[type_of(env[v]) for v in call.inputs] for call in model.layers]


def layer_vjps(
    model: Model, arg_types: Sequence[Sequence[Type]], recompute: str = "none"
) -> tuple[list[LayerGrad], list[Function]]:
    """Differentiate every layer at ``arg_types`` (one list per layer). Returns one LayerGrad per
    layer and the new functions (each distinct fwd/bwd once)."""
    try:
        policy = POLICIES[recompute]
    except KeyError:
        raise AutodiffError(f"recompute must be one of {', '.join(POLICIES)}, got {recompute!r}") from None
    weights = {v for v in model.forward.params[len(model.inputs) :]}
    cache: dict[tuple[str, tuple[Type, ...], tuple[int, ...], object], VJP] = {}
    names: dict[str, int] = {}
    out: list[LayerGrad] = []
    fns: list[Function] = []
    last = len(model.layers) - 1
    blocks = range(model.pre, len(model.layers) - model.post)
    for i, call in enumerate(model.layers):
        types = tuple(arg_types[i])
        layer_policy = policy if i in blocks else POLICIES["none"]
        wrt = tuple(
            j
            for j, v in enumerate(call.inputs)
            if (j == 0 and i > 0) or (v in weights and i != last)
            if isinstance(types[j], TensorType) and types[j].dtype.is_float  # type: ignore[union-attr]
        )
        key = (call.callee, types, wrt, layer_policy)
        got = cache.get(key)
        if got is None:
            n = names.get(call.callee, 0)
            names[call.callee] = n + 1
            base = call.callee if n == 0 else f"{call.callee}_{n}"
            got = vjp(model.module, model.module[call.callee], types, wrt, layer_policy, name=base)
            cache[key] = got
            fns.extend((got.fwd, got.bwd))
        out.append(LayerGrad(i, got))
    return out, fns


def training_step(
    model: Model,
    optimizer: Optimizer | None = None,
    recompute: str = "none",
    precision: Precision | str = "pure",
) -> Module:
    """The sequential training step of ``model`` (module docstring)."""
    opt = optimizer or Optimizer()
    prec = Precision.parse(precision)
    compute = prec.compute_dtype(model)
    model = prec.prepare(model)
    fwd = model.forward
    grads, fns = layer_vjps(model, layer_types(model), recompute)
    fb = FunctionBuilder("train_step", REGISTRY.out_arity)
    env: dict[Value, Value] = {}
    n_in = len(model.inputs)
    weights = fwd.params[n_in:]
    for k, p in enumerate(fwd.params):
        t = p.type
        env[p] = fb.param(p.name, prec.master_type(t) if k >= n_in and isinstance(t, TensorType) else t)
    master = {w: env[w] for w in weights}
    state: dict[Value, list[Value]] = {w: [] for w in weights}
    for s in opt.state:
        for w in weights:
            state[w].append(fb.param(f"{s}_{w.name}", master[w].type))
    dev = fwd.params[0].type.device if isinstance(fwd.params[0].type, TensorType) else None
    step = (
        fb.param("step", TensorType(DType.i64, (), dev)) if opt.kind == "adam" and dev is not None else None
    )
    # the compute copies, once per step, before any use (none where the masters are in the
    # compute dtype: the optimizer updates the weights themselves)
    casting = prec.mixed and prec.master is not compute
    if casting:
        for w in weights:
            env[w] = cast(fb, master[w], compute, f"{w.name}_{compute}")
    residuals: list[tuple[Value, ...]] = []
    for call, lg in zip(model.layers, grads, strict=True):
        outs = fb.call(lg.vjp.fwd, *(env[v] for v in call.inputs))
        env[call.outputs[0]] = outs[0]
        residuals.append(outs[lg.vjp.n_outputs :])
    loss = env[model.layers[-1].outputs[0]]
    (dy,) = fb.op("FillLike", loss, names=["dloss"], value=1.0)
    dweight: dict[Value, Value] = {}
    for call, lg, res in zip(reversed(model.layers), reversed(grads), reversed(residuals), strict=True):
        v = lg.vjp
        args = [env[call.inputs[j]] for j in v.bwd_params]
        outs = fb.call(v.bwd, *args, *res, dy, names=[f"d{call.inputs[j].name}" for j in v.wrt])
        for j, g in zip(v.wrt, outs, strict=True):
            if j == 0 and lg.index > 0:
                dy = g
            else:  # a tied weight (used by two layers) gets the sum of their gradients
                w = call.inputs[j]
                prev = dweight.get(w)
                dweight[w] = g if prev is None else fb.op("Add", prev, g, names=[f"d{w.name}"])[0]
    new_w: list[Value] = []
    new_state: list[list[Value]] = [[] for _ in opt.state]

    def master_grad(w: Value) -> Value:
        g = dweight[w]
        return cast(fb, g, prec.master, f"d{w.name}_{prec.master}") if casting else g

    # with clipping every gradient first, then the updates; else weight by weight
    clipped = (
        dict(zip(weights, opt.clip(fb, [master_grad(w) for w in weights]), strict=True))
        if opt.max_norm
        else {}
    )
    for w in weights:
        g = clipped[w] if opt.max_norm else master_grad(w)
        upd = opt.emit(fb, master[w], g, state[w], step)
        new_w.append(upd[0])
        for k, sv in enumerate(upd[1:]):
            new_state[k].append(sv)
    entry = fb.ret(loss, *new_w, *(sv for group in new_state for sv in group))
    return Module((*(f for f in model.module.functions if f is not fwd), *fns, entry))
