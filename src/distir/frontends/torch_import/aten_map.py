"""The ATen → registry op table: how each ATen op of a traced program is written in DistIR.

``ATEN`` maps an ATen overload packet's name (``aten.linear``, ``aten.scaled_dot_product_attention``)
to an emitter ``(cx, args, kwargs) → result`` that writes registry ops through ``cx`` (an
``Emitter``: ``cx.op(name, *inputs, **attrs)``; tensor arguments arrive as ``Arg``s, which know
their symbolic shape, scalars as Python numbers). It is a decomposition table: an ATen op is one
registry op where one exists (``linear`` → ``MatMul`` (+ ``Add``), ``layer_norm`` →
``LayerNormalization``, ``silu`` → ``Silu``, ``scaled_dot_product_attention`` → the fused
``Attention`` in its BSHD layout between two ``Transpose``s, which ``Emitter`` cancels against
the neighbouring head transposes; ``gelu`` → ``Gelu`` or, approximated by tanh, ``GeluTanh``),
else a few (``rsqrt`` → Pow(x, −½)). A tensor-scalar op takes the scalar through ``FillLike``
(``Scale`` for products and quotients), so no layer depends on the batch or on a device.
``IDENTITY`` ops (aliases, copies, dropout in eval mode, casts to the traced dtype) vanish.

Anything not listed is *unsupported*: the importer lists every such op with its count and
source location (``UnsupportedOpsError``) rather than import a part of the model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from distir.ir.values import Value


class Arg(Protocol):
    """A tensor argument of an ATen op: its value in the layer being written and its shape
    (ints, or ``None`` for a dim that is symbolic: the batch or a multiple of it)."""

    value: Value
    shape: tuple[int | None, ...]
    batch_dims: tuple[bool, ...]  # which dims are exactly the batch


class Emit(Protocol):
    def op(self, name: str, *inputs: Value, **attrs: Any) -> Value: ...
    def ops(self, name: str, *inputs: Value, n: int, **attrs: Any) -> tuple[Value, ...]: ...
    def weight_matrix(self, arg: Arg) -> Value: ...
    def target_shape(self, arg: Arg, shape: Sequence[Any]) -> tuple[int, ...]: ...
    def expand_shape(self, arg: Arg, shape: Sequence[Any]) -> tuple[int, ...]: ...
    def fill(self, like: Value, value: float) -> Value: ...
    def is_tensor(self, x: object) -> bool: ...


Emitter = Callable[[Emit, Sequence[Any], dict[str, Any]], Any]


def _axis(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _v(x: Any) -> Value:
    return x.value  # type: ignore[no-any-return]


# -- products --------------------------------------------------------------------------------
def _linear(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    x, w = a[0], a[1]
    b = a[2] if len(a) > 2 else kw.get("bias")
    y = cx.op("MatMul", _v(x), cx.weight_matrix(w))
    return cx.op("Add", y, _v(b)) if b is not None else y


def _addmm(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    if kw.get("beta", 1) != 1 or kw.get("alpha", 1) != 1:
        raise NotImplementedError("addmm with beta or alpha other than 1")
    b, x, w = a[0], a[1], a[2]
    return cx.op("Add", cx.op("MatMul", _v(x), _v(w)), _v(b))


def _matmul(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    return cx.op("MatMul", _v(a[0]), _v(a[1]))


# -- layout ----------------------------------------------------------------------------------
def _perm_swap(rank: int, i: int, j: int) -> tuple[int, ...]:
    p = list(range(rank))
    p[i], p[j] = p[j], p[i]
    return tuple(p)


def _transpose(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    x = a[0]
    r = len(x.shape)
    return cx.op("Transpose", _v(x), perm=_perm_swap(r, _axis(a[1], r), _axis(a[2], r)))


def _t(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    return cx.op("Transpose", _v(a[0]), perm=(1, 0)) if len(a[0].shape) == 2 else _v(a[0])


def _permute(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    r = len(a[0].shape)
    return cx.op("Transpose", _v(a[0]), perm=tuple(_axis(d, r) for d in a[1]))


def _view(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    shape = cx.target_shape(a[0], a[1])
    same = len(shape) == len(a[0].shape) and all(
        (n is None and t == 0) or n == t for n, t in zip(a[0].shape, shape, strict=True)
    )
    return _v(a[0]) if same else cx.op("Reshape", _v(a[0]), shape=shape)


def _unflatten(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    """``unflatten(x, dim, sizes)`` (nn.MultiheadAttention's packed projection) as a Reshape:
    the dims before ``dim`` copied (0), ``sizes`` in its place, the dims after as they are (a
    symbolic one inferred, -1)."""
    x = a[0]
    r = len(x.shape)
    dim = _axis(a[1], r)
    if any(not isinstance(n, int) for n in a[2]):
        raise NotImplementedError("unflatten into batch-dependent sizes")
    before = [0 if n is None else n for n in x.shape[:dim]]
    after = [-1 if n is None else n for n in x.shape[dim + 1 :]]
    shape = (*before, *(int(n) for n in a[2]), *after)
    if shape.count(-1) > 1:
        raise NotImplementedError(f"an unflatten to {list(shape)} with two batch-dependent dims")
    return cx.op("Reshape", _v(x), shape=shape)


def _unsqueeze(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    return cx.op("Unsqueeze", _v(a[0]), axes=(_axis(a[1], len(a[0].shape) + 1),))


def _squeeze(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    r = len(a[0].shape)
    dims = a[1] if len(a) > 1 else [d for d, n in enumerate(a[0].shape) if n == 1]
    dims = [dims] if isinstance(dims, int) else list(dims)
    axes = tuple(_axis(d, r) for d in dims if a[0].shape[_axis(d, r)] == 1)
    return cx.op("Squeeze", _v(a[0]), axes=axes) if axes else _v(a[0])


def _expand(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    return cx.op("Expand", _v(a[0]), shape=cx.expand_shape(a[0], a[1]))


def _slice(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    x = a[0]
    r = len(x.shape)
    dim = _axis(a[1] if len(a) > 1 else 0, r)
    start = a[2] if len(a) > 2 and a[2] is not None else 0
    end = a[3] if len(a) > 3 and a[3] is not None else None
    step = a[4] if len(a) > 4 else 1
    size = x.shape[dim]
    if size is None:
        raise NotImplementedError("slicing the batch dim")
    start = max(start + size, 0) if start < 0 else start
    end = size if end is None else min(end + size if end < 0 else end, size)
    if start == 0 and end == size and step == 1:
        return _v(x)
    return cx.op("Slice", _v(x), starts=(start,), ends=(end,), axes=(dim,), steps=(step,))


def _select(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    x, dim, i = a[0], _axis(a[1], len(a[0].shape)), a[2]
    size = x.shape[dim]
    if size is None:
        raise NotImplementedError("selecting on the batch dim")
    i = i + size if i < 0 else i
    s = cx.op("Slice", _v(x), starts=(i,), ends=(i + 1,), axes=(dim,))
    return cx.op("Squeeze", s, axes=(dim,))


def _index(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    """``x[..., idx, ...]`` with one index tensor known at import (a constant: Falcon's
    multi-query key and value heads) and the other dims whole: a Slice where the indices are
    consecutive, else a Gather."""
    x, indices = a[0], list(a[1])
    at = [d for d, i in enumerate(indices) if i is not None]
    idx = indices[at[0]] if len(at) == 1 else None
    const = getattr(idx, "const", None)
    if const is None or const.ndim != 1 or const.dtype.kind not in "iu":
        raise NotImplementedError("indexing other than by one constant list of indices")
    dim = at[0]
    size = x.shape[dim]
    if size is None:
        raise NotImplementedError("indexing the batch dim")
    rows = [int(i) + size if i < 0 else int(i) for i in const.tolist()]
    if rows and rows == list(range(rows[0], rows[0] + len(rows))):
        return cx.op("Slice", _v(x), starts=(rows[0],), ends=(rows[0] + len(rows),), axes=(dim,))
    return cx.op("Gather", _v(x), _v(idx), axis=dim)


def _cat(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    xs = a[0]
    dim = a[1] if len(a) > 1 else kw.get("dim", 0)
    return cx.op("Concat", *(_v(x) for x in xs), axis=_axis(dim, len(xs[0].shape)))


def _stack(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    xs = a[0]
    dim = _axis(a[1] if len(a) > 1 else kw.get("dim", 0), len(xs[0].shape) + 1)
    return cx.op("Concat", *(cx.op("Unsqueeze", _v(x), axes=(dim,)) for x in xs), axis=dim)


def _flatten(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    """``flatten(x, start, end)`` as a Reshape: the dims before ``start`` copied (0), those from
    ``start`` to ``end`` one dim (-1 if the batch is among them), the dims after as they are."""
    x = a[0]
    r = len(x.shape)
    if r == 0:
        return cx.op("Reshape", _v(x), shape=(1,))
    start = _axis(a[1] if len(a) > 1 else 0, r)
    end = _axis(a[2] if len(a) > 2 else -1, r)
    merged = x.shape[start : end + 1]
    size = -1 if None in merged else int(math.prod(merged))
    shape = (
        *(0 if n is None else n for n in x.shape[:start]),
        size,
        *(-1 if n is None else n for n in x.shape[end + 1 :]),
    )
    if shape.count(-1) > 1:
        raise NotImplementedError(f"a flatten to {list(shape)} with two batch-dependent dims")
    return cx.op("Reshape", _v(x), shape=shape)


def _split(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> tuple[Value, ...]:
    x, size = a[0], a[1]
    dim = _axis(a[2] if len(a) > 2 else kw.get("dim", 0), len(x.shape))
    total = x.shape[dim]
    if total is None:
        raise NotImplementedError("splitting the batch dim")
    sizes = list(size) if isinstance(size, list | tuple) else [size] * (total // size)
    if not isinstance(size, list | tuple) and total % size:
        sizes.append(total % size)
    return cx.ops("Split", _v(x), n=len(sizes), dim=dim, sizes=tuple(sizes))


def _chunk(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> tuple[Value, ...]:
    """``chunk(x, n, dim)``: pieces of ceil(size / n) along ``dim``, the last what remains
    (fewer than n pieces when they run out, as torch's)."""
    x, n = a[0], a[1]
    dim = _axis(a[2] if len(a) > 2 else kw.get("dim", 0), len(x.shape))
    total = x.shape[dim]
    if total is None:
        raise NotImplementedError("chunking the batch dim")
    step = -(-total // n)
    return _split(cx, (x, step, dim), {})


# -- normalization, attention, embedding -------------------------------------------------------
def _layer_norm(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    x, shape = a[0], a[1]
    w = a[2] if len(a) > 2 else None
    b = a[3] if len(a) > 3 else None
    eps = a[4] if len(a) > 4 else 1e-5
    if w is None:
        raise NotImplementedError("layer_norm without a weight")
    ins = (_v(x), _v(w)) + ((_v(b),) if b is not None else ())
    return cx.op("LayerNormalization", *ins, axis=-len(shape), epsilon=float(eps))


def _rms_norm(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    x, shape = a[0], a[1]
    w = a[2] if len(a) > 2 else None
    eps = a[3] if len(a) > 3 and a[3] is not None else 1e-6
    if w is None or len(shape) != 1:
        raise NotImplementedError("rms_norm without a weight or over several dims")
    return cx.op("RMSNormalization", _v(x), _v(w), epsilon=float(eps))


BHSD = (0, 2, 1, 3)  # (B, h, S, d) ↔ (B, S, h, d): a swap of dims 1 and 2, its own inverse


def _sdpa(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    q, k, v = a[0], a[1], a[2]
    names = ("attn_mask", "dropout_p", "is_causal", "scale")
    opt = {n: (a[3 + i] if len(a) > 3 + i else kw.get(n)) for i, n in enumerate(names)}
    if opt["attn_mask"] is not None:
        raise NotImplementedError(
            "scaled_dot_product_attention with a mask or bias tensor other than the causal mask "
            "(padding, ALiBi biases, a sliding window): only causal or unmasked attention imports"
        )
    if len(q.shape) != 4:
        raise NotImplementedError("scaled_dot_product_attention on other than (B, h, S, d)")
    attrs: dict[str, Any] = {"causal": bool(opt["is_causal"])}
    if opt["scale"] is not None:
        attrs["scale"] = float(opt["scale"])
    if opt["dropout_p"]:
        attrs["dropout"] = float(opt["dropout_p"])
    qs, ks, vs = (cx.op("Transpose", _v(t), perm=BHSD) for t in (q, k, v))
    out, _ = cx.ops("Attention", qs, ks, vs, n=2, **attrs)
    return cx.op("Transpose", out, perm=BHSD)


def _distir_sdpa(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    """``distir::sdpa(q, k, v, causal, window, softcap, scale)`` (``hf._attention_op``): attention
    with a sliding window or capped scores, (B, h, S, d) each side."""
    q, k, v = a[0], a[1], a[2]
    attrs: dict[str, Any] = {"causal": bool(a[3]), "scale": float(a[6])}
    if int(a[4]):
        attrs["window"] = int(a[4])
    if float(a[5]):
        attrs["softcap"] = float(a[5])
    qs, ks, vs = (cx.op("Transpose", _v(t), perm=BHSD) for t in (q, k, v))
    out, _ = cx.ops("Attention", qs, ks, vs, n=2, **attrs)
    return cx.op("Transpose", out, perm=BHSD)


def _embedding(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    """``embedding(w, ids, padding_idx)``: a Gather; a padding index (``nn.Embedding``'s
    ``padding_idx``: that row gets no gradient) is the Gather's ``padding``, which its gradient
    leaves zero, as torch's embedding backward does (no extra pass over the output)."""
    pad = a[2] if len(a) > 2 else kw.get("padding_idx", -1)
    extra = {"padding": int(pad)} if pad is not None and pad >= 0 else {}
    return cx.op("Gather", _v(a[0]), _v(a[1]), axis=0, **extra)


def _softmax(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    return cx.op("Softmax", _v(a[0]), axis=_axis(a[1], len(a[0].shape)))


def _reduce(name: str) -> Emitter:
    def emit(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
        x = a[0]
        dims = a[1] if len(a) > 1 else kw.get("dim")
        keep = a[2] if len(a) > 2 else kw.get("keepdim", False)
        if "dtype" in kw and kw["dtype"] is not None:
            raise NotImplementedError(f"{name} with a dtype")
        attrs: dict[str, Any] = {"keepdims": int(bool(keep))}
        if dims is not None and list(dims) != []:
            dims = [dims] if isinstance(dims, int) else dims
            attrs["axes"] = tuple(_axis(d, len(x.shape)) for d in dims)
        return cx.op(name, _v(x), **attrs)

    return emit


# -- elementwise -----------------------------------------------------------------------------
def _binary(name: str) -> Emitter:
    """A tensor-tensor op, or tensor-scalar through ``FillLike`` (``Scale`` for Mul and Div)."""

    def emit(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
        x, y = a[0], a[1]
        if kw.get("alpha", 1) != 1 or kw.get("rounding_mode") is not None:
            raise NotImplementedError(f"{name} with alpha or rounding_mode")
        tx, ty = cx.is_tensor(x), cx.is_tensor(y)
        if tx and ty:
            return cx.op(name, _v(x), _v(y))
        t, s, t_first = (x, y, True) if tx else (y, x, False)
        s = float(s)
        if name == "Mul":
            return cx.op("Scale", _v(t), alpha=s)
        if name == "Div" and t_first:
            return cx.op("Scale", _v(t), alpha=1.0 / s)
        if (name == "Add" and s == 0.0) or (name == "Sub" and s == 0.0 and t_first):
            return _v(t)
        c = cx.fill(_v(t), s)
        return cx.op(name, _v(t), c) if t_first else cx.op(name, c, _v(t))

    return emit


def _rsub(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    y: Value = _binary("Sub")(cx, (a[1], a[0]), kw)
    return y


def _unary(name: str) -> Emitter:
    def emit(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
        return cx.op(name, _v(a[0]))

    return emit


def _pow(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    x, e = a[0], a[1]
    if cx.is_tensor(e):
        return cx.op("Pow", _v(x), _v(e))
    if float(e) == 1.0:
        return _v(x)
    if float(e) == 2.0:
        return cx.op("Mul", _v(x), _v(x))
    return cx.op("Pow", _v(x), cx.fill(_v(x), float(e)))


def _rsqrt(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    return cx.op("Pow", _v(a[0]), cx.fill(_v(a[0]), -0.5))


def _silu(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    """``F.silu``: one ``Silu`` (one kernel each way, saving its input only), not x·sigmoid(x)."""
    return cx.op("Silu", _v(a[0]))


def _gelu(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    approx = kw.get("approximate", a[1] if len(a) > 1 else "none")
    return cx.op("Gelu" if approx == "none" else "GeluTanh", _v(a[0]))


def _where(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    c, x, y = a[0], a[1], a[2]
    xv = _v(x) if cx.is_tensor(x) else cx.fill(_v(y), float(x))
    yv = _v(y) if cx.is_tensor(y) else cx.fill(_v(x), float(y))
    return cx.op("Where", _v(c), xv, yv)


def _identity(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Any:
    return a[0]


def _dropout(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Any:
    train = a[2] if len(a) > 2 else kw.get("train", False)
    if train:
        raise NotImplementedError("dropout in training mode (trace in eval mode)")
    return a[0]


def _moe(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Value:
    """``distir::moe`` (a mixture-of-experts block traced as a leaf: ``moe``) → ``MoE``."""
    top_k = a[5] if len(a) > 5 else kw["top_k"]
    normalize = a[6] if len(a) > 6 else kw["normalize"]
    return cx.op("MoE", *(_v(x) for x in a[:5]), top_k=int(top_k), normalize=bool(normalize))


def _getitem(cx: Emit, a: Sequence[Any], kw: dict[str, Any]) -> Any:
    return a[0][a[1]]


# ops that produce no value of the program (shape checks)
DROPPED = frozenset(
    {"aten._assert_tensor_metadata", "aten._assert_scalar", "aten.sym_constrain_range_for_size"}
)
IDENTITY = frozenset(
    {"aten.alias", "aten.contiguous", "aten.clone", "aten.detach", "aten.lift_fresh_copy", "aten.type_as"}
)

ATEN: dict[str, Emitter] = {
    "aten.linear": _linear,
    "aten.addmm": _addmm,
    "aten.mm": _matmul,
    "aten.bmm": _matmul,
    "aten.matmul": _matmul,
    "aten.t": _t,
    "aten.numpy_T": _t,
    "aten.transpose": _transpose,
    "aten.permute": _permute,
    "aten.view": _view,
    "aten.reshape": _view,
    "aten._unsafe_view": _view,
    "aten.unflatten": _unflatten,
    "aten.unsqueeze": _unsqueeze,
    "aten.squeeze": _squeeze,
    "aten.expand": _expand,
    "aten.broadcast_to": _expand,
    "aten.slice": _slice,
    "aten.select": _select,
    "aten.index": _index,
    "aten.cat": _cat,
    "aten.stack": _stack,
    "aten.flatten": _flatten,
    "aten.split": _split,
    "aten.split_with_sizes": _split,
    "aten.chunk": _chunk,
    "aten.layer_norm": _layer_norm,
    "aten.rms_norm": _rms_norm,
    "aten.scaled_dot_product_attention": _sdpa,
    "distir.sdpa": _distir_sdpa,
    "aten.embedding": _embedding,
    "aten.softmax": _softmax,
    "aten._softmax": _softmax,
    "aten.mean": _reduce("ReduceMean"),
    "aten.sum": _reduce("ReduceSum"),
    "aten.amax": _reduce("ReduceMax"),
    "aten.add": _binary("Add"),
    "aten.add_": _binary("Add"),  # in place on a value nothing else reads (Falcon's residual)
    "aten.sub": _binary("Sub"),
    "aten.mul": _binary("Mul"),
    "aten.div": _binary("Div"),
    "aten.rsub": _rsub,
    "aten.neg": _unary("Neg"),
    "aten.exp": _unary("Exp"),
    "aten.log": _unary("Log"),
    "aten.sqrt": _unary("Sqrt"),
    "aten.tanh": _unary("Tanh"),
    "aten.reciprocal": _unary("Reciprocal"),
    "aten.sin": _unary("Sin"),
    "aten.cos": _unary("Cos"),
    "aten.sigmoid": _unary("Sigmoid"),
    "aten.relu": _unary("Relu"),
    "aten.rsqrt": _rsqrt,
    "aten.pow": _pow,
    "aten.silu": _silu,
    "aten.gelu": _gelu,
    "aten.where": _where,
    "aten.dropout": _dropout,
    "distir.moe": _moe,
    **{name: _identity for name in IDENTITY},
}

GETITEM = _getitem
IDENTITY_EMITTER = _identity
