"""The torch executor: run one (per-rank or single-device) DistIR program on torch tensors.

``TorchDomain`` gives each primitive op its registry ``torch`` implementation (the abstract
interpreter walks the program, ``distir.interp.loop``); ``run_torch(module, args, ctx)`` runs the
entry. An op without a torch implementation is an ``OpTypeError`` naming it, as the reference
executor does for ops without a reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from distir.backend.context import TorchContext
from distir.interp.loop import RecursiveCalls, interpret
from distir.ir.function import Function, Module
from distir.ir.ops import Op
from distir.ir.types import DType
from distir.ops.registry import REGISTRY, OpDef, OpTypeError


class TorchDomain(RecursiveCalls[Any]):
    def __init__(self, ctx: TorchContext) -> None:
        self.ctx = ctx
        self._defs: dict[str, OpDef] = {}

    def op(self, op: Op, args: Sequence[Any]) -> Sequence[Any]:
        d = self._defs.get(op.name)
        if d is None:
            d = self._defs[op.name] = REGISTRY[op.name]
        if d.torch is None:
            raise OpTypeError(f"{op.name} has no torch implementation")
        return tuple(d.torch(self.ctx, args, op.attrs))


def to_torch(ctx: TorchContext, value: Any) -> Any:
    """A numpy value (array, scalar or tuple of them) as torch tensors on ``ctx.device``."""
    if isinstance(value, tuple):
        return tuple(to_torch(ctx, v) for v in value)
    return ctx.torch.from_numpy(np.array(value, copy=True)).to(ctx.device)


def to_numpy(value: Any) -> Any:
    """Torch tensors (or tuples of them) back as numpy arrays (bf16 as f32, as the reference)."""
    if isinstance(value, tuple):
        return tuple(to_numpy(v) for v in value)
    t = value.detach().cpu()
    if str(t.dtype) == "torch.bfloat16":
        t = t.float()
    return t.numpy()


def cast_like(ctx: TorchContext, value: Any, dtype: DType) -> Any:
    """``value`` converted to the torch dtype of ``dtype`` (inputs arrive as numpy f32 for bf16)."""
    return value.to(ctx.dtype(dtype))


def run_torch(
    module: Module, args: Sequence[Any], ctx: TorchContext, fn: Function | None = None
) -> tuple[Any, ...]:
    """Run ``fn`` (default: the entry) on torch tensors ``args``; its outputs as torch tensors."""
    fn = fn if fn is not None else module.entry
    outs, _ = interpret(module, fn, list(args), TorchDomain(ctx))
    return outs
