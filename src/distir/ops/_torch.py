"""Shared helpers for writing ops' torch implementations (the registry's ``torch`` slot).

An implementation is ``impl(ctx, inputs, attrs) -> outputs`` (``TorchImpl``): ``ctx`` is a
``distir.backend.context.TorchContext`` (``ctx.torch`` is the torch module: op families never
import torch themselves), ``inputs`` torch tensors in the op's dtypes (0-d tensors for scalars,
tuples for tuples). An implementation computes in the op's dtype as the trainers' kernels do:
elementwise ops and matrix products in that dtype (bf16 really in bf16), row-wise reductions
(norms, softmax, losses, their gradients) accumulate half types (f16, bf16) in f32 and round
once (``upcast``/``like``), as torch's and Apex's fused kernels do. It never modifies its
inputs; results may be views of them (values of a program are never mutated).

Helpers here are about torch only; each op's implementation lives in its family's file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from distir.ir.values import Attrs

if TYPE_CHECKING:
    from distir.backend.context import TorchContext

TorchImpl = Callable[["TorchContext", Sequence[Any], Attrs], tuple[Any, ...]]


def is_half(ctx: TorchContext, x: Any) -> bool:
    """Whether ``x`` holds a 16-bit float (f16 or bf16)."""
    return x.dtype in (ctx.torch.float16, ctx.torch.bfloat16)


def upcast(ctx: TorchContext, x: Any) -> Any:
    """``x`` in f32 when it is a 16-bit float, else itself: what fused kernels accumulate in."""
    return x.float() if is_half(ctx, x) else x


def like(y: Any, x: Any) -> Any:
    """``y`` rounded to ``x``'s dtype (once, at the end of an upcast computation)."""
    return y.to(x.dtype)


def unary(f: Callable[[TorchContext, Any], Any]) -> TorchImpl:
    """An implementation of a one-input, one-result op from ``f(ctx, x)``."""

    def impl(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
        return (f(ctx, xs[0]),)

    return impl


def binary(f: Callable[[TorchContext, Any, Any], Any]) -> TorchImpl:
    """An implementation of a two-input, one-result op from ``f(ctx, a, b)``."""

    def impl(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
        return (f(ctx, xs[0], xs[1]),)

    return impl


def pad_spatial(ctx: TorchContext, x: Any, begins: Sequence[int], ends: Sequence[int], value: float) -> Any:
    """``x`` (N, C, *S) padded along its spatial axes by ``begins``/``ends`` (an end may be
    negative: that many trailing rows are cropped)."""
    widths: list[int] = []
    for b, e in zip(reversed(begins), reversed(ends), strict=True):
        widths += [b, e]
    if not any(widths):
        return x
    return ctx.torch.nn.functional.pad(x, widths, value=value)


def sum_to(x: Any, shape: Sequence[int]) -> Any:
    """``x`` summed over the axes along which ``shape`` was broadcast to ``x.shape``."""
    lead = x.dim() - len(shape)
    if lead:
        x = x.sum(dim=tuple(range(lead)))
    ones = tuple(i for i, d in enumerate(shape) if d == 1 and x.shape[i] != 1)
    return x.sum(dim=ones, keepdim=True) if ones else x


def local_rows(ctx: TorchContext, idx: Any, rows: Any, n: int) -> tuple[Any, Any]:
    """Torch's ``distir.ops.shape.select.local_rows``: indices (i64, negatives counted from the
    table's size) into a piece of ``n`` rows at ``rows=[start, total]`` (None: the whole table
    of ``n`` rows), and the mask of those the piece holds (None: all)."""
    i = idx.to(ctx.torch.int64)
    total, start = (n, 0) if rows is None else (int(rows[1]), int(rows[0]))
    i = ctx.torch.where(i < 0, i + total, i)
    if rows is None:
        return i, None
    local = i - start
    mask = (local >= 0) & (local < n)
    return ctx.torch.where(mask, local, ctx.torch.zeros_like(local)), mask


def vjp(ctx: TorchContext, f: Callable[[Any], Any], x: Any, dy: Any) -> Any:
    """The gradient of ``f`` at ``x`` against ``dy`` by torch's autograd (for gradient ops whose
    forward has no backward kernel of its own exposed: pooling)."""
    with ctx.torch.enable_grad():
        xg = x.detach().requires_grad_(True)
        (dx,) = ctx.torch.autograd.grad(f(xg), xg, dy)
    return dx


__all__ = [
    "TorchImpl",
    "binary",
    "is_half",
    "like",
    "local_rows",
    "pad_spatial",
    "sum_to",
    "unary",
    "upcast",
    "vjp",
]
