"""The contract of gradient rules (the registry's ``grad`` slot) and helpers shared by them.

A gradient rule is ``rule(ctx, op, douts) -> dins``:
- ``op`` is the forward ``Op`` (its inputs and outputs are forward values);
- ``douts`` holds one cotangent per forward result (``None`` where it is zero);
- the rule returns one cotangent per forward input: a backward value, or ``None`` when the input
  is not differentiable (integer indices, shapes) or its gradient is zero.
The rule emits backward ops with ``ctx.op(...)`` (same calling convention as
``FunctionBuilder.op``); it reads a forward value only through ``ctx.primal(v)`` — the autodiff
engine decides whether that value is saved from the forward pass or recomputed — and asks for
forward types with ``ctx.type(v)`` (concrete: autodiff runs on typed functions, so shapes are
known). Rules never create constants on a device: they build everything from the values they get
(e.g. ``FillLike``, ``Scale``), which keeps backward code placement-agnostic (sharding works on it).

Each op's rule is filled in its family's file, beside the op (``REGISTRY["Relu"].fill("grad",
rule)``); ops without a rule (shapes, constants, communication, optimizers, gradient ops,
``FillLike``) are not differentiable. The helpers below are shared by the rules: ``unbroadcast``
sums a cotangent back to the shape numpy broadcasting grew an input from, ``reshape`` reshapes
to a concrete shape (Reshape's attribute form, which materialization localizes per device),
``zeros_like``, ``is_float`` and ``first``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from distir.ir.ops import Op
from distir.ir.types import TensorType
from distir.ir.values import Value


class GradCtx(Protocol):
    def op(self, name: str, *inputs: Value, n_out: int | None = None, **attrs: object) -> tuple[Value, ...]:
        """Emit a backward op; returns its results."""
        ...

    def primal(self, v: Value) -> Value:
        """The forward value ``v``, usable in backward code."""
        ...

    def type(self, v: Value) -> TensorType:
        """The (global, concrete) type of forward value ``v``."""
        ...


GradRule = Callable[[GradCtx, Op, Sequence[Value | None]], Sequence[Value | None]]


class NotDifferentiableError(ValueError):
    """Autodiff met an op without a gradient rule on a path that needs one."""


# -- helpers shared by the rules ----------------------------------------------------------------
def is_float(ctx: GradCtx, v: Value) -> bool:
    """Whether forward value ``v`` can carry a gradient (integer and bool tensors cannot)."""
    return ctx.type(v).dtype.is_float


def reshape(ctx: GradCtx, v: Value, shape: Sequence[int]) -> Value:
    """``v`` reshaped to the concrete ``shape`` (Reshape's attribute form; a 0 is a literal size)."""
    target = tuple(int(d) for d in shape)
    if 0 in target:
        (out,) = ctx.op("Reshape", v, shape=target, allowzero=1)
    else:
        (out,) = ctx.op("Reshape", v, shape=target)
    return out


def unbroadcast(ctx: GradCtx, dy: Value, shape: Sequence[int], dy_shape: Sequence[int]) -> Value:
    """The cotangent ``dy`` (of shape ``dy_shape``) of a value that numpy broadcasting grew from
    ``shape`` to ``dy_shape``, summed back to ``shape``: over the leading dims broadcasting added
    and over the dims where ``shape`` has 1 and ``dy_shape`` does not. Emits nothing when the
    shapes are equal."""
    shape, dy_shape = tuple(shape), tuple(dy_shape)
    lead = len(dy_shape) - len(shape)
    if lead < 0:
        raise ValueError(f"unbroadcast: {dy_shape} cannot be a broadcast of {shape}")
    inner = tuple(i for i, d in enumerate(shape) if d == 1 and dy_shape[lead + i] != 1)
    # two plain reductions rather than one and a reshape: every dim that is not reduced keeps
    # its sharding through ReduceSum (a reshape dropping leading 1s may not); the leading dims
    # first, as they usually shrink the tensor most
    if lead:
        (dy,) = ctx.op("ReduceSum", dy, axes=tuple(range(lead)), keepdims=0)
    if inner:
        (dy,) = ctx.op("ReduceSum", dy, axes=inner, keepdims=1)
    return dy


def zeros_like(ctx: GradCtx, v: Value) -> Value:
    """Zeros shaped like ``v`` (any value usable in backward code), made without a constant."""
    (out,) = ctx.op("FillLike", v, value=0.0)
    return out


def first(douts: Sequence[Value | None]) -> Value:
    """The cotangent of a single-result op (autodiff calls rules only when some cotangent is
    given, so for one result it is never None)."""
    dy = douts[0]
    if dy is None:
        raise ValueError("a gradient rule of a single-result op was called without a cotangent")
    return dy
