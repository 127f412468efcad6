"""Patterns the ATen table cannot see op by op: RMSNorm written out, Hugging Face's rotary
position embedding, and GELU's tanh approximation written out.

``w · (x · rsqrt(mean(x², -1) + eps))`` (Llama's ``RMSNorm``, casts to float32 and back in
between: identities here) becomes one ``RMSNormalization(x, w, epsilon=eps)``, the fused kernel
trainers run (one read of x, no saved intermediates).

``x·cos + rotate_half(x)·sin`` (``rotate_half(x) = cat(-x[..., d/2:], x[..., :d/2])``) with
``cos`` and ``sin`` constants of the program (tables computed from a rotary module's buffers)
becomes one ``Rope(halves=true, freqs=...)``: the inverse frequencies are read off the tables
(the angle at position 1) and the whole tables are checked against them, so a schedule with an
attention scaling (YaRN's) or positions not starting at 0 is left to the op-by-op path. GPT-J's
``x·cos + rotate_every_two(x)·sin`` (``flatten(stack([-x[..., 1::2], x[..., ::2]], -1), -2)``,
tables with each angle twice in a row) is the same with pairs (2i, 2i+1): ``Rope(halves=false)``. Without
this, every layer would carry the (S, d) tables as constants and the 7 elementwise ops around
them; with it, an imported Llama is written as the zoo's.

``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`` (Hugging Face's ``NewGELUActivation``, GPT-2's
``gelu_new``, written out in Python: seven ATen ops on scalars) becomes one ``GeluTanh(x)``, the
op ``F.gelu(x, approximate="tanh")`` is: one kernel each way, its input saved. Op by op, each
scalar would be a tensor of x's size (``FillLike``), the exponent saved for the backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from distir.ops._special import GELU_TANH_COEFF, GELU_TANH_ROOT

# the tables are computed in float32: the angle p·f of position p carries a rounding error of
# about p·|f|·6e-8 (5e-4 at position 8191, 8e-3 at 131,071), which an exact rotation does not
# have; the check allows TOLERANCE plus ANGLE_ULPS float32 ulps of the table's largest angle
TOLERANCE = 2e-3
ANGLE_ULPS = 2.0
CHECK_ROWS = 8192  # table rows checked at a time: float64 temporaries of that many rows, not of S


@dataclass(frozen=True, slots=True)
class RopeMatch:
    x: Any  # the rotated tensor's node
    seq_axis: int  # 1 (B, S, h, d) or 2 (B, h, S, d)
    freqs: tuple[float, ...]
    interior: tuple[Any, ...]  # the pattern's nodes other than the final add
    halves: bool = True  # pairs (i, i + d/2) (rotate_half), else (2i, 2i + 1) (rotate_every_two)


@dataclass(frozen=True, slots=True)
class RMSMatch:
    x: Any  # the normalized tensor's node
    weight: Any  # the scale's node
    eps: float
    interior: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class GeluMatch:
    x: Any  # the activation's input node
    interior: tuple[Any, ...]


CASTS = ("aten.to", "aten._to_copy")


def _through_casts(n: Any, seen: list[Any]) -> Any:
    while _packet(n) in CASTS and hasattr(n, "op"):
        seen.append(n)
        n = n.args[0]
    return n


def match_rms_norm(mul: Any, is_param: Callable[[Any], bool]) -> RMSMatch | None:
    """The RMSNorm whose final product with its weight is ``mul``, or None (module docstring)."""
    if not _is(mul, "aten.mul") or len(mul.args) != 2:
        return None
    for w, y in (mul.args, mul.args[::-1]):
        if not (hasattr(w, "op") and is_param(w) and w.meta["val"].ndim == 1 and hasattr(y, "op")):
            continue
        seen: list[Any] = []
        y = _through_casts(y, seen)
        if not _is(y, "aten.mul") or len(y.args) != 2:
            continue
        for x, r in (y.args, y.args[::-1]):
            found = _rsqrt_mean_square(r, x, seen) if hasattr(r, "op") else None
            if found is not None:
                return RMSMatch(x, w, found, (y, *seen))
    return None


def _scalar_op(n: Any, name: str, value: float) -> Any:
    """The tensor operand of ``name(tensor, value)`` (either order), else None."""
    if not _is(n, name) or len(n.args) != 2 or n.kwargs.get("alpha", 1) != 1:
        return None
    a, b = n.args
    for t, c in ((a, b), (b, a)):
        if hasattr(t, "op") and isinstance(c, float | int) and abs(float(c) - value) <= 1e-7 * abs(value):
            return t
    return None


def match_gelu_tanh(mul: Any) -> GeluMatch | None:
    """The tanh-approximated GELU whose final product is ``mul``, or None (module docstring)."""
    if not _is(mul, "aten.mul") or len(mul.args) != 2 or not all(hasattr(a, "op") for a in mul.args):
        return None
    for half, one in (mul.args, mul.args[::-1]):
        x = _scalar_op(half, "aten.mul", 0.5)
        th = _scalar_op(one, "aten.add", 1.0)
        if x is None or not _is(th, "aten.tanh"):
            continue
        factored = _gelu_factored(th.args[0], x)
        if factored is not None:
            return GeluMatch(x, (half, one, th, *factored))
        inner = _scalar_op(th.args[0], "aten.mul", GELU_TANH_ROOT)
        if not _is(inner, "aten.add") or len(inner.args) != 2 or x not in inner.args:
            continue
        cube_term = inner.args[1] if inner.args[0] is x else inner.args[0]
        cube = _scalar_op(cube_term, "aten.mul", GELU_TANH_COEFF)
        if _is(cube, "aten.pow") and cube.args[0] is x and cube.args[1] == 3:
            return GeluMatch(x, (half, one, th, th.args[0], inner, cube_term, cube))
    return None


def _gelu_factored(n: Any, x: Any) -> tuple[Any, ...] | None:
    """The nodes of ``(√(2/π)·x)·(1 + (0.044715·x)·x)`` (BLOOM's ``bloom_gelu_forward``), the
    argument of GELU's tanh with x factored out, else None."""
    if not _is(n, "aten.mul") or len(n.args) != 2 or not all(hasattr(a, "op") for a in n.args):
        return None
    for rx, poly in (n.args, n.args[::-1]):
        if _scalar_op(rx, "aten.mul", GELU_TANH_ROOT) is not x:
            continue
        sq = _scalar_op(poly, "aten.add", 1.0)
        if not _is(sq, "aten.mul") or len(sq.args) != 2:
            continue
        for ax, other in (sq.args, sq.args[::-1]):
            if other is x and hasattr(ax, "op") and _scalar_op(ax, "aten.mul", GELU_TANH_COEFF) is x:
                return (n, rx, poly, sq, ax)
    return None


def _rsqrt_mean_square(r: Any, x: Any, seen: list[Any]) -> float | None:
    """eps when ``r`` is ``rsqrt(mean(x², -1, keepdim) + eps)``; adds its nodes to ``seen``."""
    if not _is(r, "aten.rsqrt"):
        return None
    add = r.args[0]
    if not _is(add, "aten.add") or len(add.args) != 2 or not isinstance(add.args[1], float | int):
        return None
    mean = add.args[0]
    if (
        not _is(mean, "aten.mean")
        or len(mean.args) < 3
        or list(mean.args[1]) not in ([-1], [x.meta["val"].ndim - 1])
    ):
        return None
    sq = mean.args[0]
    if not (_is(sq, "aten.pow") and sq.args[1] == 2 and sq.args[0] is x) or not mean.args[2]:
        return None
    seen += [r, add, mean, sq]
    return float(add.args[1])


def _packet(n: Any) -> str:
    pk = getattr(n.target, "_overloadpacket", None)
    return str(pk) if pk is not None else ""


def _is(n: Any, name: str) -> bool:
    return hasattr(n, "op") and n.op == "call_function" and _packet(n) == name


def _mul_parts(n: Any, is_const: Callable[[Any], bool]) -> tuple[Any, Any] | None:
    """(tensor, constant) of ``mul(tensor, constant)`` in either order."""
    if not _is(n, "aten.mul") or len(n.args) != 2:
        return None
    a, b = n.args
    if hasattr(b, "op") and is_const(b) and hasattr(a, "op") and not is_const(a):
        return a, b
    if hasattr(a, "op") and is_const(a) and hasattr(b, "op") and not is_const(b):
        return b, a
    return None


def _rotate_half_of(n: Any) -> tuple[Any, tuple[Any, ...]] | None:
    """x and the nodes of ``cat([-x[..., h:], x[..., :h]], -1)``."""
    if not _is(n, "aten.cat") or len(n.args[0]) != 2:
        return None
    neg, lo = n.args[0]
    dim = n.args[1] if len(n.args) > 1 else 0
    if not (_is(neg, "aten.neg") and _is(lo, "aten.slice")):
        return None
    hi = neg.args[0]
    if not _is(hi, "aten.slice") or hi.args[0] is not lo.args[0]:
        return None
    x = lo.args[0]
    d = int(x.meta["val"].shape[-1])
    h = d // 2
    rank = x.meta["val"].ndim
    last = {-1, rank - 1}
    ok = (
        dim in last
        and lo.args[1] in last
        and hi.args[1] in last
        and list(lo.args[2:4]) == [0, h]
        and hi.args[2] == h
        and (len(hi.args) < 4 or hi.args[3] >= d)
    )
    return (x, (n, neg, lo, hi)) if ok else None


def _rotate_every_two_of(n: Any) -> tuple[Any, tuple[Any, ...]] | None:
    """x and the nodes of ``flatten(stack([-x[..., 1::2], x[..., ::2]], -1), -2)`` (GPT-J's
    ``rotate_every_two``: the pair (x₂ᵢ, x₂ᵢ₊₁) → (−x₂ᵢ₊₁, x₂ᵢ))."""
    if not _is(n, "aten.flatten") or not _is(n.args[0], "aten.stack"):
        return None
    stack = n.args[0]
    if len(stack.args[0]) != 2:
        return None
    neg, even = stack.args[0]
    if not (_is(neg, "aten.neg") and _is(even, "aten.slice") and _is(neg.args[0], "aten.slice")):
        return None
    odd = neg.args[0]
    x = even.args[0]
    if odd.args[0] is not x:
        return None
    rank = x.meta["val"].ndim
    last = {-1, rank - 1}
    d = int(x.meta["val"].shape[-1])

    def every_other(sl: Any, start: int) -> bool:
        a = list(sl.args[1:]) + [None] * (5 - len(sl.args))
        return a[0] in last and (a[1] or 0) == start and (a[2] is None or a[2] >= d) and a[3] == 2

    dims = (stack.args[1] if len(stack.args) > 1 else 0, n.args[1] if len(n.args) > 1 else 0)
    end = n.args[2] if len(n.args) > 2 else -1
    ok = dims[0] in (-1, rank) and dims[1] in (-2, rank - 1) and end in (-1, rank)
    return (x, (n, stack, neg, odd, even)) if ok and every_other(even, 0) and every_other(odd, 1) else None


def _table(c: Any, x_shape: tuple[int, ...]) -> tuple[np.ndarray, int] | None:
    """The (S, d) table of a constant broadcast against x (B, ., ., d), and x's seq axis (in the
    constant's float dtype: ``_freqs`` widens the rows it reads)."""
    arr = np.asarray(c.detach().cpu().numpy() if hasattr(c, "detach") else c)
    if not np.issubdtype(arr.dtype, np.floating):
        return None
    if arr.ndim != 4 or arr.shape[0] != 1 or arr.shape[-1] != x_shape[-1]:
        return None
    for axis in (1, 2):
        other = 3 - axis
        if arr.shape[other] == 1 and arr.shape[axis] == x_shape[axis]:
            return arr.reshape(arr.shape[axis], arr.shape[-1]), axis
    return None


def match_rope(
    add: Any,
    const: Callable[[Any], Any],
    is_const: Callable[[Any], bool],
    memo: dict[tuple[str, str], Any] | None = None,
) -> RopeMatch | None:
    """The rotary embedding whose final ``add`` is ``add``, or None (module docstring);
    ``memo`` keeps the tables' check by the (cos, sin) nodes' names."""
    memo = {} if memo is None else memo
    if not _is(add, "aten.add") or len(add.args) != 2 or add.kwargs.get("alpha", 1) != 1:
        return None
    for first, second in (add.args, add.args[::-1]):
        p1, p2 = _mul_parts(first, is_const), _mul_parts(second, is_const)
        if p1 is None or p2 is None:
            continue
        (x, cos_node), (rot, sin_node) = p1, p2
        halves = True
        rh = _rotate_half_of(rot)
        if rh is None:
            halves, rh = False, _rotate_every_two_of(rot)
        if rh is None or rh[0] is not x:
            continue
        shape = tuple(int(d) if isinstance(d, int) else -1 for d in x.meta["val"].shape)
        key = (cos_node.name, sin_node.name)
        if key not in memo:
            memo[key] = _freqs(const(cos_node), const(sin_node), shape, halves)
        found = memo[key]
        if found is None:
            continue
        freqs, axis = found
        return RopeMatch(x, axis, freqs, (first, second, *rh[1]), halves)
    return None


def _freqs(
    cos: Any, sin: Any, x_shape: tuple[int, ...], halves: bool = True
) -> tuple[tuple[float, ...], int] | None:
    """The frequencies and x's seq axis of tables whose row p is cos/sin(p·fᵢ), the d/2 angles
    laid out twice (halves) or each twice in a row (interleaved pairs), else None."""
    tc, ts = _table(cos, x_shape), _table(sin, x_shape)
    if tc is None or ts is None or tc[1] != ts[1] or tc[0].shape[0] < 2:
        return None
    (c, axis), (s, _) = tc, ts
    n, d = c.shape
    h = d // 2
    pick = np.s_[:h] if halves else np.s_[0::2]
    f = np.arctan2(s[1, pick].astype(np.float64), c[1, pick].astype(np.float64))
    if np.any(f < 0):
        return None
    p = 2
    while p < n:  # refine: the angle at position p is p·f up to whole turns
        got = np.arctan2(s[p, pick].astype(np.float64), c[p, pick].astype(np.float64))
        turns = np.round((p * f - got) / (2 * np.pi))
        f = (got + 2 * np.pi * turns) / p
        p *= 2
    largest = float((n - 1) * np.abs(f).max(initial=0.0))  # the table's largest angle
    atol = TOLERANCE + ANGLE_ULPS * float(np.spacing(np.float32(largest)))
    for lo in range(0, n, CHECK_ROWS):
        hi = min(n, lo + CHECK_ROWS)
        ang = np.arange(lo, hi)[:, None] * f[None, :]
        ang = np.concatenate([ang, ang], -1) if halves else np.repeat(ang, 2, axis=-1)
        ok_cos = np.allclose(c[lo:hi].astype(np.float64), np.cos(ang), atol=atol)
        if not (ok_cos and np.allclose(s[lo:hi].astype(np.float64), np.sin(ang), atol=atol)):
            return None
    return tuple(float(v) for v in f), axis


# -- attention written out ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class EagerAttentionMatch:
    q: Any  # the (B, h, S, d) query, key and value nodes
    k: Any
    v: Any
    scale: float
    causal: bool
    alibi: tuple[float, ...] | None  # ALiBi's slopes, one per head
    interior: tuple[Any, ...]
    bias: tuple[Any, ...]  # the nodes computing the bias from sizes (not emitted)
    window: int = 0  # a sliding window (GPT-Neo's local layers), 0: none


VIEWS = ("aten.view", "aten.reshape", "aten._unsafe_view")
PASSING = (*VIEWS, *CASTS, "aten.dropout", "aten.contiguous", "aten.clone")


def _through(n: Any, names: tuple[str, ...], seen: list[Any]) -> Any:
    while hasattr(n, "op") and _packet(n) in names:
        seen.append(n)
        n = n.args[0]
    return n


def _heads_of(n: Any, seen: list[Any]) -> Any:
    """The (B, h, S, d) node whose reshape to (B·h, S, d) is ``n``, else None."""
    if _packet(n) not in VIEWS or not hasattr(n.args[0], "op"):
        return None
    x = n.args[0]
    xs, ns = x.meta["val"].shape, n.meta["val"].shape
    if len(xs) != 4 or len(ns) != 3 or list(xs[2:]) != list(ns[1:]):
        return None
    seen.append(n)
    return x


def match_eager_attention(
    view: Any, const: Callable[[Any], Any], computable: Callable[[Any], tuple[Any, ...] | None]
) -> EagerAttentionMatch | None:
    """Attention written out as BLOOM's: ``bmm(softmax(view(baddbmm(bias, q, kᵀ, alpha)) +
    mask), v)`` on heads merged into the batch ((B·h, S, d)), viewed back to (B, h, S, d) by
    ``view``; the bias (ALiBi's slope·j, or none) computed from sizes alone (``computable``
    gives its nodes) and the mask absent or the causal one (``is_causal_mask``). Else None."""
    if _packet(view) not in VIEWS or not _is(view.args[0], "aten.bmm") or len(view.meta["val"].shape) != 4:
        return None
    bmm = view.args[0]
    seen: list[Any] = [bmm]
    v = _heads_of(bmm.args[1], seen)
    probs = _through(bmm.args[0], PASSING, seen)
    if v is None or not _is(probs, "aten.softmax") or probs.args[1] not in (-1, 3):
        return None
    seen.append(probs)
    logits, mask = probs.args[0], None
    if _is(logits, "aten.add") and len(logits.args) == 2:
        seen.append(logits)
        logits, mask = logits.args
    scores = _through(logits, VIEWS, seen)
    if not _is(scores, "aten.baddbmm") or scores.kwargs.get("beta", 1) != 1:
        return None
    seen.append(scores)
    bias, q3, kt = scores.args[:3]
    q = _heads_of(q3, seen)
    if not _is(kt, "aten.transpose") or sorted(a % 3 for a in kt.args[1:3]) != [1, 2]:
        return None
    seen.append(kt)
    k = _heads_of(kt.args[0], seen)
    bias_nodes = computable(bias)
    causal = mask is not None and hasattr(mask, "op") and is_causal_mask(const(mask))
    if q is None or k is None or bias_nodes is None or (mask is not None and not causal):
        return None
    shape = q.meta["val"].shape
    if k.meta["val"].shape != shape or v.meta["val"].shape != shape:
        return None
    slopes = _alibi_slopes(const(bias), int(shape[1]), int(shape[2]))
    if slopes is None:
        return None
    alpha = float(scores.kwargs.get("alpha", 1.0))
    return EagerAttentionMatch(q, k, v, alpha, causal, slopes or None, tuple(seen), bias_nodes)


def match_masked_attention(
    mm: Any, const: Callable[[Any], Any], computable: Callable[[Any], tuple[Any, ...] | None]
) -> EagerAttentionMatch | None:
    """Attention written out on (B, h, S, d) heads as GPT-Neo's: ``matmul(softmax(where(keep,
    matmul(q, kᵀ), min) [+ mask]), v)``, q and k perhaps cast to f32, no scale; ``keep`` (a slice of
    a boolean buffer) and the additive mask computed from sizes and buffers alone, together the
    causal mask or a causal sliding window (``band_window``). Else None."""
    if not _is(mm, "aten.matmul") or len(mm.meta["val"].shape) != 4:
        return None
    seen: list[Any] = []  # the nodes under ``mm``, which becomes the Attention
    v = mm.args[1]
    probs = _through(mm.args[0], PASSING, seen)
    if not _is(probs, "aten.softmax") or probs.args[1] not in (-1, 3):
        return None
    seen.append(probs)
    logits, masks, masking = probs.args[0], [], []
    if _is(logits, "aten.add") and len(logits.args) == 2 and hasattr(logits.args[1], "op"):
        seen.append(logits)
        masks.append(logits.args[1])
        logits = logits.args[0]
    if not _is(logits, "aten.where") or len(logits.args) != 3:
        return None
    seen.append(logits)
    keep, scores, fill = logits.args
    masking += [keep, fill]
    if not _is(scores, "aten.matmul"):
        return None
    seen.append(scores)
    q = _through(scores.args[0], CASTS, seen)
    kt = scores.args[1]
    if not _is(kt, "aten.transpose") or sorted(a % 4 for a in kt.args[1:3]) != [2, 3]:
        return None
    seen.append(kt)
    k = _through(kt.args[0], CASTS, seen)
    shape = q.meta["val"].shape
    if len(shape) != 4 or k.meta["val"].shape != shape or v.meta["val"].shape != shape:
        return None
    nodes = [computable(x) for x in (*masking, *masks)]
    if any(found is None for found in nodes):
        return None
    window = band_window([const(x) for x in (keep, *masks)], const(fill), int(shape[2]))
    if window is None:
        return None
    bias = tuple(x for found in nodes for x in found or ())
    return EagerAttentionMatch(q, k, v, 1.0, True, None, tuple(seen), bias, window)


def band_window(masks: Sequence[Any], fill: Any, seq: int) -> int | None:
    """The window of a causal band that a boolean keep-mask and additive masks (each (…, S, S),
    alike for every batch row and head) let through, with ``fill`` (a scalar at most
    ``MASKED``) where the keep-mask is false: 0 for the plain causal mask, W when query i sees keys
    i − W < j ≤ i with W < S; None for any other pattern."""
    import torch

    if not isinstance(fill, torch.Tensor) or fill.numel() != 1 or float(fill) > MASKED:
        return None
    allowed = torch.ones(seq, seq, dtype=torch.bool)
    for m in masks:
        if not isinstance(m, torch.Tensor) or m.ndim < 2 or tuple(m.shape[-2:]) != (seq, seq):
            return None
        m = m.detach().cpu()
        if m.dtype == torch.bool:
            rows = m.reshape(-1, seq, seq)
        elif m.is_floating_point() and bool(torch.all((m == 0) | (m <= MASKED))):
            rows = (m == 0).reshape(-1, seq, seq)
        else:
            return None
        if not bool(torch.all(rows == rows[:1])):
            return None
        allowed &= rows[0]
    w = int(allowed[-1].sum()) if seq else 0
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    band = causal & ~torch.ones(seq, seq, dtype=torch.bool).tril(-w) if 0 < w < seq else causal
    return (w if 0 < w < seq else 0) if bool(torch.equal(allowed, band)) else None


def _alibi_slopes(bias: Any, heads: int, seq: int) -> tuple[float, ...] | None:
    """The slopes of a (B·h, 1, S) bias whose head i's row is c + slope_i·j, the same for every
    sample; () for a zero bias; None for any other."""
    arr = np.asarray(
        bias.detach().cpu().double().numpy() if hasattr(bias, "detach") else bias, dtype=np.float64
    )
    if arr.ndim != 3 or arr.shape[1] != 1 or arr.shape[2] != seq or arr.shape[0] % heads:
        return None
    rows = arr.reshape(-1, heads, seq)
    if not np.array_equal(rows, np.broadcast_to(rows[:1], rows.shape)):
        return None
    rows = rows[0]
    if not rows.any():
        return ()
    slopes = rows[:, 1] - rows[:, 0] if seq > 1 else np.zeros(heads)
    want = rows[:, :1] + slopes[:, None] * np.arange(seq)[None, :]
    if not np.allclose(rows, want, rtol=1e-5, atol=1e-6 * max(1.0, float(np.abs(rows).max()))):
        return None
    return tuple(float(s) for s in slopes)


# an additive attention mask's value that hides a key: exp of it is 0 in every float format
MASKED = -1e4


def is_causal_mask(mask: Any) -> bool:
    """Whether an attention mask (…, S, S), the same for every batch row and head, lets query i
    see keys 0..i only: a boolean lower triangle, or 0 on and below the diagonal and a large
    negative number above it (what a model's ``sdpa`` or eager path builds)."""
    import torch

    if not isinstance(mask, torch.Tensor) or mask.ndim < 2 or mask.shape[-1] != mask.shape[-2]:
        return False
    m = mask.detach().cpu()
    if m.dtype == torch.bool:
        allowed = m
    elif m.is_floating_point():
        allowed = m == 0
        if not bool(torch.all(allowed | (m <= MASKED))):
            return False
    else:
        return False
    size = m.shape[-1]
    return bool(torch.equal(allowed, torch.ones(size, size, dtype=torch.bool).tril().expand_as(allowed)))
