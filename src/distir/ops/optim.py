"""Optimizer update ops. ``SGD(w, g, lr)`` gives ``w - lr * g``; Adam lives here too (training
steps use them as the weight-update op, the paper's ``Optimizer``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from distir.ir.types import Type
from distir.ir.values import Attrs
from distir.ops._rules import numel, same_dtype
from distir.ops.registry import AttrSpec, OpDef, TypeCtx, register

FAMILY = "optim"


def _sgd_rule(ctx: TypeCtx) -> Sequence[Type]:
    same_dtype(ctx, [0, 1])
    w, g = ctx.tensor(0), ctx.tensor(1)
    if w.shape != g.shape:
        ctx.fail("SGD gradient shape differs from the weight's", 1, w.shape, g.shape)
    return (ctx.out(w.dtype, w.shape),)


def _sgd_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    w, g = np.asarray(args[0]), np.asarray(args[1])
    lr: Any = attrs.get("lr", 0.01)
    return ((w - lr * g).astype(w.dtype, copy=False),)


SGD = register(OpDef(
    name="SGD", family=FAMILY, inputs=("weight", "grad"), outputs=("new_weight",), infer=_sgd_rule,
    attrs={"lr": AttrSpec("float", 0.01)}, reference=_sgd_ref,
    flops=lambda ins, outs, attrs: 2.0 * numel(outs[0]),
    doc="Plain SGD step: new_weight = weight - lr * grad.",
))
