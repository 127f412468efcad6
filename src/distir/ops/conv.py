"""Convolution and pooling (ONNX names): Conv, MaxPool, AveragePool.

Layouts are channels-first with any number of spatial axes: ``X`` is (N, C, D1, ..., Dr) — NCW,
NCHW, NCDHW — and Conv's ``W`` is (M, C/group, K1, ..., Kr). Attributes follow ONNX: ``strides``
and ``dilations`` have one value per spatial axis (default 1s); ``pads`` has the begins of every
spatial axis, then the ends (default 0s). Along one axis the kernel covers the ``extent``
``dilation*(K-1)+1`` and output ``o`` reads the padded positions ``o*stride + j*dilation``, i.e.
unpadded input rows ``o*stride - pad_begin + j*dilation`` for ``j`` in ``[0, K)``.

Pooling with ``ceil_mode=1`` rounds the output size up, but drops a last window that would start
in the end padding (PyTorch's rule, and ONNX's reference since opset 19's ceil fix); positions a
window reaches beyond the end pad are ignored. MaxPool pads with -inf. AveragePool divides by the
number of input elements in the window, or with ``count_include_pad=1`` by the number of its
positions inside the padded input (explicit pads counted, the ceil-mode overhang not); a window
with no element averages to 0. Conv pads with zeros.

References compute in float64 (one pass per kernel offset: a strided view of the padded input, a
batched matmul over the channel groups) and round once to the input dtype. The helpers
``conv_output_size``, ``input_range_for_output`` and ``halo_rows`` give the arithmetic of one
spatial axis for sharding with halo exchange; the window machinery is shared with the gradient ops
in ``distir.ops.grad.conv``. Each op's gradient rule emits its gradient op (ConvGrad, MaxPoolGrad,
AveragePoolGrad) with the forward op's attributes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from distir.ir.ops import Op
from distir.ir.types import TensorType, Type
from distir.ir.values import Attrs, Value
from distir.ops import sharding as sh
from distir.ops._rules import float_input, int_attr, numel, same_dtype
from distir.ops._special import F64, f64
from distir.ops._torch import pad_spatial
from distir.ops.gradrules import GradCtx, first
from distir.ops.registry import AttrSpec, OpDef, TypeCtx, register

if TYPE_CHECKING:
    from distir.backend.context import TorchContext

FAMILY = "conv"


# -- the arithmetic of one spatial axis (for sharding) ----------------------------------------
def conv_output_size(
    in_size: int,
    kernel: int,
    stride: int,
    pad_begin: int,
    pad_end: int,
    dilation: int,
    ceil_mode: bool = False,
) -> int:
    """The output length along one spatial axis of a convolution or pooling window.

    ``floor((in + pads - extent) / stride) + 1`` with ``extent = dilation*(kernel-1) + 1``; with
    ``ceil_mode`` rounded up instead, minus one if the last window would then start in the end
    padding. Raises ``ValueError`` on a kernel, stride or dilation below 1, negative sizes or
    pads, or a kernel extent larger than the padded input.
    """
    if kernel < 1 or stride < 1 or dilation < 1:
        raise ValueError(f"kernel, stride and dilation must be >= 1, got {kernel}, {stride}, {dilation}")
    if in_size < 0 or pad_begin < 0 or pad_end < 0:
        raise ValueError(f"sizes and pads must be >= 0, got {in_size}, {pad_begin}, {pad_end}")
    span = in_size + pad_begin + pad_end - (dilation * (kernel - 1) + 1)
    if span < 0:
        raise ValueError(
            f"kernel extent {dilation * (kernel - 1) + 1} is larger than the padded input "
            f"{in_size + pad_begin + pad_end}"
        )
    if not ceil_mode:
        return span // stride + 1
    out = -(-span // stride) + 1
    if (out - 1) * stride >= in_size + pad_begin:
        out -= 1
    return out


def input_range_for_output(
    out_start: int, out_stop: int, kernel: int, stride: int, pad_begin: int, dilation: int
) -> tuple[int, int]:
    """The half-open range ``[lo, hi)`` of input rows that outputs ``[out_start, out_stop)`` read
    along one spatial axis, in unpadded input coordinates.

    ``lo`` may be negative and ``hi`` may exceed the input length: those rows are padding.
    ``halo_rows(lo, hi, in_size)`` says which rows to take and how to pad them to compute the
    outputs locally. An empty output range gives an empty input range at
    ``out_start * stride - pad_begin``.
    """
    lo = out_start * stride - pad_begin
    if out_stop <= out_start:
        return lo, lo
    return lo, (out_stop - 1) * stride - pad_begin + dilation * (kernel - 1) + 1


def halo_rows(lo: int, hi: int, in_size: int) -> tuple[int, int, int, int]:
    """For the input range ``[lo, hi)`` of ``input_range_for_output``: ``(start, stop, pad_begin,
    pad_end)``, the input rows ``[start, stop)`` that exist and the padding around them, which
    together span ``hi - lo`` rows.

    Running the op on those rows with these pads (and ``ceil_mode=0``) along the axis yields
    exactly the outputs ``[out_start, out_stop)``, equal to the global ones; except AveragePool
    with ``count_include_pad=1`` in ceil mode, where a last window reaching beyond the global
    end pad must not count the overhang.
    """
    start, stop = min(max(lo, 0), in_size), min(max(hi, 0), in_size)
    span = max(hi - lo, 0)
    return start, max(stop, start), min(max(-lo, 0), span), min(max(hi - in_size, 0), span)


# -- window geometry ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Window:
    """A sliding window over the spatial axes: per-axis kernel, strides, pads and dilations."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    dilations: tuple[int, ...]
    ceil_mode: bool = False

    def extent(self, i: int) -> int:
        return self.dilations[i] * (self.kernel[i] - 1) + 1

    def out_shape(self, spatial: Sequence[int]) -> tuple[int, ...]:
        return tuple(
            conv_output_size(
                n,
                self.kernel[i],
                self.strides[i],
                self.pads_begin[i],
                self.pads_end[i],
                self.dilations[i],
                self.ceil_mode,
            )
            for i, n in enumerate(spatial)
        )

    def offsets(self) -> Iterator[tuple[int, ...]]:
        """Kernel offsets in C order (the order of ``W.reshape(M, C/group, -1)``'s last axis)."""
        return itertools.product(*(range(k) for k in self.kernel))

    def view(self, offset: Sequence[int], out: Sequence[int]) -> tuple[slice, ...]:
        """The index of the padded input that kernel ``offset`` meets, for every output."""
        return (
            slice(None),
            slice(None),
            *(
                slice(j * d, j * d + s * (o - 1) + 1, s)
                for j, d, s, o in zip(offset, self.dilations, self.strides, out, strict=True)
            ),
        )


def int_tuple(v: object) -> tuple[int, ...]:
    """An ``ints`` attribute value (checked by the verifier) as a tuple of ints."""
    assert isinstance(v, tuple), v
    return tuple(x for x in v if isinstance(x, int))


def window_of(attrs: Attrs, kernel: Sequence[int]) -> Window:
    """A reference's view of the window attributes (the rule has checked them)."""
    r = len(kernel)

    def ints(name: str, n: int, default: int) -> tuple[int, ...]:
        v = attrs.get(name)
        return (default,) * n if v is None else int_tuple(v)

    pads = ints("pads", 2 * r, 0)
    return Window(
        tuple(kernel),
        ints("strides", r, 1),
        pads[:r],
        pads[r:],
        ints("dilations", r, 1),
        bool(int_attr(attrs, "ceil_mode", 0)),
    )


def pool_window(attrs: Attrs) -> Window:
    return window_of(attrs, int_tuple(attrs.get("kernel_shape")))


# -- padding and gathering windows --------------------------------------------------------------
def pad_for(x: F64, win: Window, out: Sequence[int], value: float, tail: float | None = None) -> F64:
    """``x`` padded by the explicit pads with ``value``, then at the ends with ``tail`` (default
    ``value``) as far as ceil-mode windows reach beyond the end pads."""
    widths = [(0, 0), (0, 0), *zip(win.pads_begin, win.pads_end, strict=True)]
    xp = np.pad(x, widths, constant_values=value)
    extra = [(0, 0), (0, 0)]
    for i, n in enumerate(xp.shape[2:]):
        extra.append((0, max(0, (out[i] - 1) * win.strides[i] + win.extent(i) - n)))
    if any(e for _, e in extra):
        xp = np.pad(xp, extra, constant_values=value if tail is None else tail)
    return xp


# -- Conv -----------------------------------------------------------------------------------------
def grouped(a: F64, group: int) -> F64:
    """(N, C, *S) -> (N, group, C/group, prod(S))."""
    return a.reshape(a.shape[0], group, a.shape[1] // group, math.prod(a.shape[2:]))


def conv_forward(x: F64, w: F64, b: F64 | None, win: Window, group: int) -> F64:
    n, m = x.shape[0], w.shape[0]
    out = win.out_shape(x.shape[2:])
    xp = pad_for(x, win, out, 0.0)
    wk = w.reshape(group, m // group, w.shape[1], math.prod(win.kernel))  # (g, M/g, C/g, prod(K))
    y = np.zeros((n, group, m // group, math.prod(out)))
    for k, offset in enumerate(win.offsets()):
        y += wk[..., k] @ grouped(xp[win.view(offset, out)], group)
    y = y.reshape(n, m, *out)
    if b is not None:
        y += b.reshape(m, *(1,) * len(out))
    return y


# -- pooling ----------------------------------------------------------------------------------------
def max_pool_forward(x: F64, win: Window) -> tuple[F64, np.ndarray]:
    """(Y, the index of the winning kernel offset per output; the first on ties)."""
    out = win.out_shape(x.shape[2:])
    xp = pad_for(x, win, out, -np.inf)
    best = np.full((*x.shape[:2], *out), -np.inf)
    arg = np.zeros(best.shape, dtype=np.int64)
    for k, offset in enumerate(win.offsets()):
        v = xp[win.view(offset, out)]
        better = v > best
        best = np.where(better, v, best)
        arg[better] = k
    return best, arg


def avg_pool_counts(x_shape: Sequence[int], win: Window, include_pad: bool) -> F64:
    """The divisor of every output (shape (1, 1, *out)); at least 1."""
    out = win.out_shape(x_shape[2:])
    ones = np.ones((1, 1, *x_shape[2:]))
    inside = pad_for(ones, win, out, 1.0 if include_pad else 0.0, tail=0.0)
    cnt = sum((inside[win.view(o, out)] for o in win.offsets()), np.zeros((1, 1, *out)))
    return np.maximum(cnt, 1.0)


def avg_pool_forward(x: F64, win: Window, include_pad: bool) -> F64:
    out = win.out_shape(x.shape[2:])
    xp = pad_for(x, win, out, 0.0)
    total = sum((xp[win.view(o, out)] for o in win.offsets()), np.zeros((*x.shape[:2], *out)))
    return total / avg_pool_counts(x.shape, win, include_pad)


# -- type rules -------------------------------------------------------------------------------------
def _ints_attr(ctx: TypeCtx, name: str, n: int, default: int, lo: int, what: str) -> tuple[int, ...]:
    if name not in ctx.op.attrs:
        return (default,) * n
    v = ctx.attr(name)
    if v is None:
        return (default,) * n
    v = tuple(v)
    if len(v) != n:
        ctx.fail(f"{ctx.op.name}: {name} needs {what}, got {len(v)} values", None, n, len(v))
    if any(x < lo for x in v):
        ctx.fail(f"{ctx.op.name}: {name} must all be >= {lo}", None, f">= {lo}", v)
    return v


def spatial_input(ctx: TypeCtx, i: int) -> TensorType:
    """Input ``i``: a float tensor (N, C, D1, ..., Dr) with r >= 1."""
    x = float_input(ctx, i, ctx.op.inputs[i].rstrip("?"))
    if x.rank < 3:
        ctx.fail(
            f"{ctx.op.name} needs X of rank >= 3 (N, C, spatial...), got shape {x.shape}", i, ">= 3", x.rank
        )
    return x


def check_window(ctx: TypeCtx, xi: int, kernel: tuple[int, ...], pool: bool) -> tuple[int, ...]:
    """Checks the window attributes against X's spatial shape; returns the output spatial shape."""
    x = ctx.tensor(xi)
    r, name = x.rank - 2, ctx.op.name
    per_axis = f"{r} values (one per spatial axis)"
    pads = _ints_attr(ctx, "pads", 2 * r, 0, 0, f"{2 * r} values (begins, then ends)")
    win = Window(
        kernel,
        _ints_attr(ctx, "strides", r, 1, 1, per_axis),
        pads[:r],
        pads[r:],
        _ints_attr(ctx, "dilations", r, 1, 1, per_axis),
        bool(ctx.attr("ceil_mode")) if "ceil_mode" in ctx.op.attrs else False,
    )
    for i, n in enumerate(x.shape[2:]):
        ext, b, e = win.extent(i), win.pads_begin[i], win.pads_end[i]
        if pool and max(b, e) >= ext:
            ctx.fail(
                f"{name}: pads ({b}, {e}) of spatial axis {i} must be smaller than the kernel extent {ext}",
                None,
                f"< {ext}",
                (b, e),
            )
        if n + b + e < ext:
            ctx.fail(
                f"{name}: the kernel (extent {ext}) is larger than the padded input along spatial "
                f"axis {i} ({n} + pads {b}, {e} = {n + b + e})",
                xi,
                f">= {ext}",
                n + b + e,
            )
    return win.out_shape(x.shape[2:])


def conv_types(
    ctx: TypeCtx, xi: int, wi: int, bi: int | None
) -> tuple[TensorType, TensorType, tuple[int, ...]]:
    """Checks Conv's X, W (and bias); returns (X, W, the output shape)."""
    x, w = spatial_input(ctx, xi), ctx.tensor(wi)
    same_dtype(ctx, [xi, wi])
    if w.rank != x.rank:
        ctx.fail(
            f"{ctx.op.name}: W must have the rank of X ({x.rank}), got shape {w.shape}", wi, x.rank, w.rank
        )
    group, (n, c), m = ctx.attr("group"), x.shape[:2], w.shape[0]
    if group < 1 or c % group:
        ctx.fail(
            f"{ctx.op.name}: group {group} does not divide the {c} input channels",
            None,
            f"a divisor of {c}",
            group,
        )
    if w.shape[1] != c // group:
        ctx.fail(
            f"{ctx.op.name}: channel mismatch: W has {w.shape[1]} input channels per group, but X has "
            f"{c} channels in {group} group(s)",
            wi,
            c // group,
            w.shape[1],
        )
    if m % group:
        ctx.fail(
            f"{ctx.op.name}: group {group} does not divide the {m} output channels of W",
            wi,
            f"a multiple of {group}",
            m,
        )
    kernel = w.shape[2:]
    if min(kernel) < 1:
        ctx.fail(f"{ctx.op.name}: W has an empty kernel {kernel}", wi, "kernel sizes >= 1", kernel)
    ks = ctx.attr("kernel_shape")
    if ks is not None and tuple(ks) != kernel:
        ctx.fail(
            f"{ctx.op.name}: kernel_shape {tuple(ks)} does not match W's kernel {kernel}",
            wi,
            tuple(ks),
            kernel,
        )
    if bi is not None and bi < len(ctx.types):
        same_dtype(ctx, [xi, bi])
        bias = ctx.tensor(bi)
        if bias.shape != (m,):
            ctx.fail(
                f"{ctx.op.name}: bias B must have shape ({m},) (W's output channels)", bi, (m,), bias.shape
            )
    return x, w, (n, m, *check_window(ctx, xi, kernel, pool=False))


def pool_types(ctx: TypeCtx, xi: int) -> tuple[TensorType, tuple[int, ...]]:
    """Checks a pool's X and kernel_shape; returns (X, the output shape)."""
    x = spatial_input(ctx, xi)
    kernel = tuple(ctx.attr("kernel_shape"))
    if len(kernel) != x.rank - 2:
        ctx.fail(
            f"{ctx.op.name}: kernel_shape has {len(kernel)} values but X has {x.rank - 2} spatial axes",
            None,
            x.rank - 2,
            len(kernel),
        )
    if min(kernel) < 1:
        ctx.fail(f"{ctx.op.name}: kernel_shape must all be >= 1", None, ">= 1", kernel)
    return x, (*x.shape[:2], *check_window(ctx, xi, kernel, pool=True))


def _conv_rule(ctx: TypeCtx) -> Sequence[Type]:
    x, _, shape = conv_types(ctx, 0, 1, 2)
    return (ctx.out(x.dtype, shape),)


def _pool_rule(ctx: TypeCtx) -> Sequence[Type]:
    x, shape = pool_types(ctx, 0)
    return (ctx.out(x.dtype, shape),)


# -- references and costs ---------------------------------------------------------------------------
def _conv_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x, w = np.asarray(args[0]), np.asarray(args[1])
    b = f64(args[2]) if len(args) > 2 and args[2] is not None else None
    y = conv_forward(f64(x), f64(w), b, window_of(attrs, w.shape[2:]), int_attr(attrs, "group", 1))
    return (y.astype(x.dtype),)


def _max_pool_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[0])
    return (max_pool_forward(f64(x), pool_window(attrs))[0].astype(x.dtype),)


def _avg_pool_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    x = np.asarray(args[0])
    y = avg_pool_forward(f64(x), pool_window(attrs), bool(int_attr(attrs, "count_include_pad", 0)))
    return (y.astype(x.dtype),)


def shape_of(t: Type) -> tuple[int, ...]:
    return t.shape if isinstance(t, TensorType) else ()


def conv_macs(y: Type, w: Type) -> float:
    """Multiply-adds of a convolution: N*M*prod(out) * (C/group)*prod(kernel)."""
    return float(numel(y) * math.prod(shape_of(w)[1:]))


def _conv_flops(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    return 2.0 * conv_macs(outs[0], ins[1]) + (numel(outs[0]) if len(ins) > 2 else 0.0)


def pool_flops(per_window_element: float, y: Type, attrs: Attrs) -> float:
    return per_window_element * math.prod(int_tuple(attrs.get("kernel_shape", ()))) * numel(y)


WINDOW_ATTRS = {
    "strides": AttrSpec("ints", None),
    "pads": AttrSpec("ints", None),
}
CONV_ATTRS = {
    **WINDOW_ATTRS,
    "dilations": AttrSpec("ints", None),
    "group": AttrSpec("int", 1),
    "kernel_shape": AttrSpec("ints", None),
}
_KERNEL = {"kernel_shape": AttrSpec("ints")}
_CEIL = {"ceil_mode": AttrSpec("int", 0, (0, 1))}
MAX_POOL_ATTRS = {**_KERNEL, **WINDOW_ATTRS, "dilations": AttrSpec("ints", None), **_CEIL}
AVERAGE_POOL_ATTRS = {**_KERNEL, **WINDOW_ATTRS, **_CEIL, "count_include_pad": AttrSpec("int", 0, (0, 1))}

CONV = register(
    OpDef(
        name="Conv",
        family=FAMILY,
        inputs=("X", "W", "B?"),
        outputs=("Y",),
        infer=_conv_rule,
        attrs=dict(CONV_ATTRS),
        reference=_conv_ref,
        flops=_conv_flops,
        doc="N-d grouped convolution (cross-correlation) of X (N, C, *S) with W (M, C/group, *K), "
        "zero padding, plus the optional bias B (M,) (ONNX Conv).",
        sharding=sh.windowed("conv"),
    )
)
MAX_POOL = register(
    OpDef(
        name="MaxPool",
        family=FAMILY,
        inputs=("X",),
        outputs=("Y",),
        infer=_pool_rule,
        attrs=dict(MAX_POOL_ATTRS),
        reference=_max_pool_ref,
        flops=lambda ins, outs, attrs: pool_flops(1.0, outs[0], attrs),
        doc="The maximum over each window of X, padding with -inf (ONNX MaxPool, without Indices).",
        sharding=sh.windowed("pool"),
    )
)
AVERAGE_POOL = register(
    OpDef(
        name="AveragePool",
        family=FAMILY,
        inputs=("X",),
        outputs=("Y",),
        infer=_pool_rule,
        attrs=dict(AVERAGE_POOL_ATTRS),
        reference=_avg_pool_ref,
        flops=lambda ins, outs, attrs: pool_flops(1.0, outs[0], attrs),
        doc="The mean over each window of X; pads count only with count_include_pad=1 (ONNX AveragePool).",
        sharding=sh.windowed("pool"),
    )
)

__all__ = [
    "AVERAGE_POOL_ATTRS",
    "CONV_ATTRS",
    "MAX_POOL_ATTRS",
    "Window",
    "avg_pool_forward",
    "check_window",
    "conv_forward",
    "conv_macs",
    "conv_output_size",
    "conv_types",
    "grouped",
    "halo_rows",
    "input_range_for_output",
    "max_pool_forward",
    "pool_flops",
    "pool_types",
    "pool_window",
    "shape_of",
    "spatial_input",
    "torch_avg_pool",
    "torch_max_pool",
    "torch_pad_for",
    "window_of",
]


# -- gradient rules (contract: distir.ops.gradrules): each emits the matching gradient op of
# ``distir.ops.grad.conv`` with the forward op's attributes
Grads = Sequence[Value | None]


def _conv_grad(ctx: GradCtx, op: Op, douts: Grads) -> Grads:
    """ConvGrad gives (dX, dW, dB); dB only when the forward had a bias."""
    x, w = ctx.primal(op.inputs[0]), ctx.primal(op.inputs[1])
    attrs: dict[str, Any] = dict(op.attrs.items())
    dx, dw, db = ctx.op("ConvGrad", first(douts), x, w, **attrs)
    return [dx, dw, db][: len(op.inputs)]


def _pool_grad(grad_op: str) -> object:
    def rule(ctx: GradCtx, op: Op, douts: Grads) -> Grads:
        attrs: dict[str, Any] = dict(op.attrs.items())
        return ctx.op(grad_op, first(douts), ctx.primal(op.inputs[0]), **attrs)

    return rule


# -- torch implementations (contract: distir.ops._torch) --------------------------------------------
def torch_pad_for(ctx: TorchContext, x: Any, win: Window, value: float) -> Any:
    """``pad_for`` on torch: ``x`` padded (or cropped at the end) so that the window's outputs
    tile it exactly, as an unpadded floor-mode op takes it (ceil mode and asymmetric pads are
    then nobody's business but this padding)."""
    out = win.out_shape(tuple(x.shape[2:]))
    ends = [
        (o - 1) * s + win.extent(i) - n - b
        for i, (o, s, n, b) in enumerate(zip(out, win.strides, x.shape[2:], win.pads_begin, strict=True))
    ]
    return pad_spatial(ctx, x, win.pads_begin, ends, value)


def _conv_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    x, w = xs[0], xs[1]
    b = xs[2] if len(xs) > 2 else None
    win = window_of(attrs, tuple(w.shape[2:]))
    r = len(win.kernel)
    xp = torch_pad_for(ctx, x, win, 0.0)
    group = int_attr(attrs, "group", 1)
    y = ctx.torch.ops.aten.convolution(xp, w, b, win.strides, [0] * r, win.dilations, False, [0] * r, group)
    return (y,)


def torch_max_pool(ctx: TorchContext, x: Any, win: Window) -> Any:
    """MaxPool on torch (1 to 3 spatial axes), padding with -inf."""
    f = getattr(ctx.torch.nn.functional, f"max_pool{len(win.kernel)}d")
    return f(torch_pad_for(ctx, x, win, -math.inf), win.kernel, win.strides, 0, win.dilations)


def torch_avg_pool(ctx: TorchContext, x: Any, win: Window, include_pad: bool) -> Any:
    """AveragePool on torch: window sums of the zero-padded input over the reference's divisors
    (``avg_pool_counts``)."""
    f = getattr(ctx.torch.nn.functional, f"avg_pool{len(win.kernel)}d")
    sums = f(torch_pad_for(ctx, x, win, 0.0), win.kernel, win.strides, 0) * math.prod(win.kernel)
    counts = avg_pool_counts(tuple(x.shape), win, include_pad)
    return sums / ctx.torch.from_numpy(counts).to(device=x.device, dtype=x.dtype)


def _max_pool_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    return (torch_max_pool(ctx, xs[0], pool_window(attrs)),)


def _avg_pool_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    include = bool(int_attr(attrs, "count_include_pad", 0))
    return (torch_avg_pool(ctx, xs[0], pool_window(attrs), include),)


CONV.fill("torch", _conv_torch)
MAX_POOL.fill("torch", _max_pool_torch)
AVERAGE_POOL.fill("torch", _avg_pool_torch)
CONV.fill("grad", _conv_grad)
MAX_POOL.fill("grad", _pool_grad("MaxPoolGrad"))
AVERAGE_POOL.fill("grad", _pool_grad("AveragePoolGrad"))
