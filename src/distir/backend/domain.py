"""The torch executor: run one (per-rank or single-device) DistIR program on torch tensors.

``TorchDomain`` gives each primitive op its registry ``torch`` implementation (the abstract
interpreter walks the program, ``distir.interp.loop``); ``run_torch(module, args, ctx)`` runs the
entry. An op without a torch implementation is an ``OpTypeError`` naming it, as the reference
executor does for ops without a reference; so is a tensor result whose shape or dtype is not
its type's (the reference executor checks shapes alike).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from distir.backend.context import TorchContext
from distir.interp.loop import RecursiveCalls, interpret
from distir.ir.dtensor import DTensorType
from distir.ir.function import Function, Module
from distir.ir.ops import Op
from distir.ir.types import DType, ScalarType, TensorType, TupleType, Type
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
        outs = tuple(d.torch(self.ctx, args, op.attrs))
        for v, o in zip(op.outputs, outs, strict=False):
            t = v.type
            if isinstance(t, TensorType) and (
                tuple(o.shape) != t.shape or o.dtype != self.ctx.dtype(t.dtype)
            ):
                raise OpTypeError(
                    f"{op.name}'s torch implementation produced {o.dtype} {tuple(o.shape)} for %{v.name}",
                    None,
                    (t.dtype, t.shape),
                    (o.dtype, tuple(o.shape)),
                )
        return outs


def to_torch(ctx: TorchContext, value: Any, t: Type | None = None) -> Any:
    """A numpy value (array, scalar or tuple of them) as torch tensors on ``ctx.device``; given
    its type ``t``, in ``t``'s dtype (the reference holds bf16 in f32: torch rounds it to bf16)."""
    if isinstance(value, tuple):
        elements = t.elements if isinstance(t, TupleType) else (None,) * len(value)
        return tuple(to_torch(ctx, v, e) for v, e in zip(value, elements, strict=True))
    x = ctx.torch.from_numpy(np.array(value, copy=True)).to(ctx.device)
    if isinstance(t, TensorType | ScalarType | DTensorType):
        x = x.to(ctx.dtype(t.dtype))
    return x


def args_to_torch(ctx: TorchContext, fn: Function, args: Sequence[Any]) -> list[Any]:
    """Numpy arguments of ``fn`` as torch tensors in its parameters' dtypes."""
    return [to_torch(ctx, a, p.type) for a, p in zip(args, fn.params, strict=True)]


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
    """Run ``fn`` (default: the entry) on torch tensors ``args`` (``args_to_torch``); its outputs
    as torch tensors. Not under ``torch.inference_mode``: a few gradient ops (pooling's) run
    torch's autograd on their recomputed forward."""
    fn = fn if fn is not None else module.entry
    outs, _ = interpret(module, fn, list(args), TorchDomain(ctx))
    return outs
