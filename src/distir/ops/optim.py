"""Optimizer update ops. ``SGD(w, g, lr)`` gives ``w - lr * g``; Adam lives here too (training
steps use them as the weight-update op, the paper's ``Optimizer``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from distir.ir.types import Type
from distir.ir.values import Attrs
from distir.ops import sharding as sh
from distir.ops._rules import float_attr, float_input, numel, same_dtype, same_shape
from distir.ops._torch import like, upcast
from distir.ops.registry import AttrSpec, CostClass, OpDef, TypeCtx, register

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
        },
        reference=_adam_ref,
        flops=lambda ins, outs, attrs: 10.0 * numel(ins[0]),
        doc="Adam (Kingma & Ba) with bias correction; step is the 1-based step count: "
        "m' = b1 m + (1-b1) g, v' = b2 v + (1-b2) g^2, "
        "w' = w - lr (m'/(1-b1^step)) / (sqrt(v'/(1-b2^step)) + epsilon).",
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


SGD.fill("torch", lambda ctx, xs, attrs: (ctx.torch.add(xs[0], xs[1], alpha=-float_attr(attrs, "lr", 0.01)),))
ADAM.fill("torch", _adam_torch)
