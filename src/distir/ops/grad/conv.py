"""Gradient ops of convolution and pooling (family ``grad``): ConvGrad, MaxPoolGrad,
AveragePoolGrad, in the forward op's attribute conventions, on the window machinery of
``distir.ops.conv``. References compute in float64 and round once."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from distir.ir.types import Type
from distir.ir.values import Attrs
from distir.ops import sharding as sh
from distir.ops._rules import (
    int_attr,
    numel,
    same_dtype,
)
from distir.ops._special import F64, f64
from distir.ops._torch import vjp
from distir.ops.conv import (
    AVERAGE_POOL_ATTRS,
    CONV_ATTRS,
    MAX_POOL_ATTRS,
    Window,
    avg_pool_counts,
    conv_macs,
    conv_types,
    grouped,
    max_pool_forward,
    pad_for,
    pool_flops,
    pool_types,
    pool_window,
    torch_avg_pool,
    torch_max_pool,
    torch_pad_for,
    window_of,
)
from distir.ops.grad.family import FAMILY
from distir.ops.registry import OpDef, TypeCtx, register

if TYPE_CHECKING:
    from distir.backend.context import TorchContext


def scatter_windows(
    parts: Iterator[tuple[tuple[int, ...], F64]], x_shape: Sequence[int], win: Window, out: Sequence[int]
) -> F64:
    """The adjoint of gathering windows: adds each offset's part (shaped like the output) into the
    padded input, then crops the padding away. Returns an array of ``x_shape``."""
    padded = [
        max(n + b + e, (o - 1) * s + win.extent(i))
        for i, (n, b, e, o, s) in enumerate(
            zip(x_shape[2:], win.pads_begin, win.pads_end, out, win.strides, strict=True)
        )
    ]
    g = np.zeros((*x_shape[:2], *padded))
    for offset, part in parts:
        g[win.view(offset, out)] += part
    crop = tuple(slice(b, b + n) for b, n in zip(win.pads_begin, x_shape[2:], strict=True))
    return g[(slice(None), slice(None), *crop)]


def conv_backward(dy: F64, x: F64, w: F64, win: Window, group: int) -> tuple[F64, F64, F64]:
    """(dX, dW, dB) of ``Y = Conv(X, W, B)`` for the incoming gradient ``dy``."""
    m, out = w.shape[0], dy.shape[2:]
    xp = pad_for(x, win, out, 0.0)
    wk = w.reshape(group, m // group, w.shape[1], math.prod(w.shape[2:]))
    dyg = grouped(dy, group)  # (N, g, M/g, P)
    dw = np.zeros_like(wk)
    offsets = list(win.offsets())
    for k, offset in enumerate(offsets):
        xs = grouped(xp[win.view(offset, out)], group)  # (N, g, C/g, P)
        dw[..., k] = np.sum(dyg @ xs.swapaxes(-1, -2), axis=0)
    xshape = (x.shape[0], x.shape[1], *out)
    parts = ((o, (wk[..., k].swapaxes(-1, -2) @ dyg).reshape(xshape)) for k, o in enumerate(offsets))
    dx = scatter_windows(parts, x.shape, win, out)
    db = np.sum(dy, axis=(0, *range(2, dy.ndim)))
    return dx, dw.reshape(w.shape), db


def max_pool_backward(dy: F64, x: F64, win: Window) -> F64:
    _, arg = max_pool_forward(x, win)
    out = dy.shape[2:]
    parts = ((o, np.where(arg == k, dy, 0.0)) for k, o in enumerate(win.offsets()))
    return scatter_windows(parts, x.shape, win, out)


def avg_pool_backward(dy: F64, x_shape: Sequence[int], win: Window, include_pad: bool) -> F64:
    g = dy / avg_pool_counts(x_shape, win, include_pad)
    return scatter_windows(((o, g) for o in win.offsets()), x_shape, win, dy.shape[2:])


def _check_dy(ctx: TypeCtx, shape: tuple[int, ...]) -> None:
    """dY (input 0) has X's dtype (input 1) and the forward output's shape."""
    same_dtype(ctx, [1, 0])
    dy = ctx.tensor(0)
    if dy.shape != shape:
        msg = f"{ctx.op.name}: dY has shape {dy.shape} but the forward output has {shape}"
        ctx.fail(msg, 0, shape, dy.shape)


def _conv_grad_rule(ctx: TypeCtx) -> Sequence[Type]:
    x, w, shape = conv_types(ctx, 1, 2, None)
    _check_dy(ctx, shape)
    return (ctx.out(x.dtype, x.shape), ctx.out(x.dtype, w.shape), ctx.out(x.dtype, (w.shape[0],)))


def _pool_grad_rule(ctx: TypeCtx) -> Sequence[Type]:
    x, shape = pool_types(ctx, 1)
    _check_dy(ctx, shape)
    return (ctx.out(x.dtype, x.shape),)


def _conv_grad(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x, w = np.asarray(args[1]), np.asarray(args[2])
    win, group = window_of(attrs, w.shape[2:]), int_attr(attrs, "group", 1)
    return tuple(g.astype(x.dtype) for g in conv_backward(f64(args[0]), f64(x), f64(w), win, group))


def _max_pool_grad(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[1])
    return (max_pool_backward(f64(args[0]), f64(x), pool_window(attrs)).astype(x.dtype),)


def _avg_pool_grad(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[1])
    include = bool(int_attr(attrs, "count_include_pad", 0))
    return (avg_pool_backward(f64(args[0]), x.shape, pool_window(attrs), include).astype(x.dtype),)


CONV_GRAD = register(
    OpDef(
        name="ConvGrad",
        family=FAMILY,
        inputs=("dY", "X", "W"),
        outputs=("dX", "dW", "dB"),
        infer=_conv_grad_rule,
        attrs=dict(CONV_ATTRS),
        reference=_conv_grad,
        flops=lambda ins, outs, attrs: 4.0 * conv_macs(ins[0], ins[2]) + numel(ins[0]),
        doc="Gradients of Conv(X, W, B) w.r.t. X, W and B (dB has shape (M,), whether or not the "
        "forward had a bias).",
        sharding=sh.windowed_grad("conv"),
    )
)

MAX_POOL_GRAD = register(
    OpDef(
        name="MaxPoolGrad",
        family=FAMILY,
        inputs=("dY", "X"),
        outputs=("dX",),
        infer=_pool_grad_rule,
        attrs=dict(MAX_POOL_ATTRS),
        reference=_max_pool_grad,
        flops=lambda ins, outs, attrs: pool_flops(2.0, ins[0], attrs),
        doc="Routes each dY to the position of its window's maximum in X (the first one on ties); "
        "recomputes the forward.",
        sharding=sh.windowed_grad("pool"),
    )
)

AVERAGE_POOL_GRAD = register(
    OpDef(
        name="AveragePoolGrad",
        family=FAMILY,
        inputs=("dY", "X"),
        outputs=("dX",),
        infer=_pool_grad_rule,
        attrs=dict(AVERAGE_POOL_ATTRS),
        reference=_avg_pool_grad,
        flops=lambda ins, outs, attrs: pool_flops(1.0, ins[0], attrs),
        doc="Spreads each dY / (its window's divisor) over the window's positions in X (only X's "
        "shape is read).",
        sharding=sh.windowed_grad("pool"),
    )
)


# -- torch implementations (contract: distir.ops._torch) ----------------------------------------
def _conv_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """torch's convolution backward on the padded input; dX is its unpadded part."""
    dy, x, w = xs
    win = window_of(attrs, tuple(w.shape[2:]))
    r = len(win.kernel)
    zeros, group = [0] * r, int_attr(attrs, "group", 1)
    xp = torch_pad_for(ctx, x, win, 0.0)
    dxp, dw, db = ctx.torch.ops.aten.convolution_backward(
        dy, xp, w, [w.shape[0]], win.strides, zeros, win.dilations, False, zeros, group, [True, True, True]
    )
    crop = tuple(slice(b, b + n) for b, n in zip(win.pads_begin, x.shape[2:], strict=True))
    return (dxp[(slice(None), slice(None), *crop)], dw, db)


def _max_pool_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    dy, x = xs
    win = pool_window(attrs)
    return (vjp(ctx, lambda t: torch_max_pool(ctx, t, win), x, dy),)


def _avg_pool_grad_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    dy, x = xs
    win, include = pool_window(attrs), bool(int_attr(attrs, "count_include_pad", 0))
    return (vjp(ctx, lambda t: torch_avg_pool(ctx, t, win, include), x, dy),)


CONV_GRAD.fill("torch", _conv_grad_torch)
MAX_POOL_GRAD.fill("torch", _max_pool_grad_torch)
AVERAGE_POOL_GRAD.fill("torch", _avg_pool_grad_torch)

__all__ = ["avg_pool_backward", "conv_backward", "max_pool_backward", "scatter_windows"]
