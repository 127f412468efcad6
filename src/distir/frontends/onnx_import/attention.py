"""The exporter's decomposed scaled-dot-product attention as the fused ``Attention``.

``torch.onnx.export(..., dynamo=True)`` writes ``F.scaled_dot_product_attention`` out: q and kᵀ
each multiplied by √scale, their product, an additive mask, ``Softmax`` over the keys, the NaN
guard (``IsNaN``/``Where``: a fully masked row gives 0) and the product with v, all in the
(B, h, S, d) layout. Run so, it materializes the S×S scores, which no trainer does. A chain of
that shape whose mask is absent or the causal mask (0 on and below the diagonal, −∞ or a finite
value below −10⁴ above it, alike for every batch and head) becomes one ``Attention(causal=...,
scale=...)`` in its BSHD layout — a causal band (0 for i − W < j ≤ i only: Hugging Face's sliding
window) one with ``window=W`` — the head transposes around it cancelled where the chain's
inputs come from one and its result goes to one. The mask, if nothing else reads it, is no longer
a weight. A mask of another shape or pattern (padding), a scale that is not a
constant, or an intermediate read elsewhere leaves the chain as the exporter wrote it.

A mask the exporter computes from the sizes for the whole batch ((B, 1, S, S): Hugging Face's
``sdpa_mask``, a batch index broadcast against the positions) is too large to know at a large
batch (``values.known_limit``). The same file imported at batch 1 knows it (while 1 × S × S is
under that import's limit: S ≤ 8,192); the chains whose mask is causal there
(``fuse_attention``'s result, by graph node) are causal at the larger batch too (``causal_at``)
when the mask there is computed, not read from a weight, and of shape (B, 1, S, S): the graph
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from distir.frontends.onnx_import.values import Program
from distir.ir.ops import Op
from distir.ir.values import Value

BHSD = (0, 2, 1, 3)  # (B, h, S, d) <-> (B, S, h, d)
MASKED = -1e4  # at most this above the diagonal: a causal mask's "minus infinity"


@dataclass(frozen=True, slots=True)
class _Chain:
    q: Value  # (B, h, S, d)
    k: Value
    v: Value
    scale: float
    causal: bool  # a causal mask was added (none: no mask)
    window: int  # the causal mask's band (query i sees keys i − window < j ≤ i); 0: none
    last: Op  # the product with v: its result is the attention's, (B, h, S, d)
    inner: tuple[Op, ...]  # the chain's other ops


class CausalAt(NamedTuple):
    """A chain fused with a causal mask: its graph node (the index of its product with v) and
    the mask's window (0: none)."""

    node: int
    window: int


def fuse_attention(
    program: Program, outputs: tuple[Value, ...], causal_at: Collection[CausalAt] = ()
) -> tuple[CausalAt, ...]:
    """Rewrite every matched chain of ``program`` in place (module docstring). ``causal_at``: the
    chains the same file, imported at a smaller batch, masked causally (the module docstring).
    Returns the chains fused with a causal mask."""
    made, uses = program.dataflow(outputs)
    at = dict(zip(map(id, program.ops), program.origin, strict=True))
    hints = {c.node: c.window for c in causal_at}
    chains = [
        c for op in program.ops if (c := _chain(program, op, made, uses, hints.get(at[id(op)]))) is not None
    ]
    if chains:
        _rewrite(program, chains, made, outputs)
    return tuple(CausalAt(at[id(c.last)], c.window) for c in chains if c.causal)


def _chain(
    program: Program, last: Op, made: dict[Value, Op], uses: dict[Value, int], hint: int | None = None
) -> _Chain | None:
    """The attention chain whose product with v is ``last``, or None (``hint``: the window of a
    mask too large to know that was causal at a smaller batch, the module docstring)."""
    if last.name != "MatMul" or len(last.inputs) != 2 or last.attrs.get("transA") or last.attrs.get("transB"):
        return None
    p, v = last.inputs
    inner: list[Op] = []
    probs = _unguarded(program, p, made, uses, inner)
    sm = made.get(probs)
    if (
        sm is None
        or sm.name != "Softmax"
        or sm.attrs.get("axis") not in (-1, 3)
        or uses.get(probs, 0) != 1 + bool(inner)
    ):
        return None
    inner.append(sm)
    scores, mask = _unmasked(sm.inputs[0], made, uses, inner)
    qk = made.get(scores)
    if (
        qk is None
        or qk.name != "MatMul"
        or qk.attrs.get("transA")
        or qk.attrs.get("transB")
        or uses.get(scores) != 1
    ):
        return None
    inner.append(qk)
    q, cq = _scaled(program, qk.inputs[0], made, uses, inner)
    kt, ck = _scaled(program, qk.inputs[1], made, uses, inner)
    k = _untransposed(program, kt, made, uses, inner)
    if k is None or not _alike(program, q, k, v):
        return None
    window = 0
    if mask is not None:
        got = _causal_window(program, mask, program.type(q).shape[2], hint)
        if got is None:
            return None
        window = got
    return _Chain(q, k, v, cq * ck, mask is not None, window, last, tuple(inner))


def _unguarded(
    program: Program, p: Value, made: dict[Value, Op], uses: dict[Value, int], inner: list[Op]
) -> Value:
    """The probabilities under the NaN guard ``Where(IsNaN(x), 0, x)``, else ``p`` itself."""
    where = made.get(p)
    if where is None or where.name != "Where" or uses.get(p) != 1:
        return p
    cond, zero, x = where.inputs
    isnan, known = made.get(cond), program.known(zero)
    if known is None or known.size != 1 or float(known.reshape(())) != 0.0:
        return p
    if isnan is None or isnan.name != "IsNaN" or isnan.inputs[0] is not x or uses.get(cond) != 1:
        return p
    inner += [where, isnan]
    return x


def _unmasked(
    s: Value, made: dict[Value, Op], uses: dict[Value, int], inner: list[Op]
) -> tuple[Value, Value | None]:
    """(scores, the additive mask) of ``Add(scores, mask)``, else (``s``, None)."""
    add = made.get(s)
    if add is None or add.name != "Add" or uses.get(s) != 1:
        return s, None
    a, b = add.inputs
    if made.get(a) is not None and made[a].name == "MatMul":
        inner.append(add)
        return a, b
    return s, None


def _scaled(
    program: Program, x: Value, made: dict[Value, Op], uses: dict[Value, int], inner: list[Op]
) -> tuple[Value, float]:
    """(the tensor, the factor) of ``Mul(tensor, scalar constant)``, else (``x``, 1)."""
    mul = made.get(x)
    if mul is None or mul.name != "Mul" or uses.get(x) != 1:
        return x, 1.0
    for t, c in (mul.inputs, mul.inputs[::-1]):
        known = program.known(c)
        if known is not None and known.size == 1 and program.known(t) is None:
            inner.append(mul)
            return t, float(known.reshape(()))
    return x, 1.0


def _untransposed(
    program: Program, kt: Value, made: dict[Value, Op], uses: dict[Value, int], inner: list[Op]
) -> Value | None:
    """k of kᵀ = its last two axes swapped: ``Transpose(k, (0, 1, 3, 2))``, or the exporter's
    ``Reshape(Transpose(Reshape(k, (-1, S, d)), (0, 2, 1)), (B, h, d, S))``."""
    op = made.get(kt)
    if op is None or uses.get(kt) != 1:
        return None
    if op.name == "Transpose" and op.attrs.get("perm") == (0, 1, 3, 2):
        inner.append(op)
        return op.inputs[0]
    if op.name != "Reshape":
        return None
    t = made.get(op.inputs[0])
    if t is None or t.name != "Transpose" or t.attrs.get("perm") != (0, 2, 1) or uses.get(op.inputs[0]) != 1:
        return None
    r = made.get(t.inputs[0])
    if r is None or r.name != "Reshape" or uses.get(t.inputs[0]) != 1:
        return None
    k = r.inputs[0]
    b, h, s, d = program.type(k).shape
    if program.type(kt).shape != (b, h, d, s):
        return None
    inner += [op, t, r]
    return k


def _alike(program: Program, q: Value, k: Value, v: Value) -> bool:
    """q, k, v of one (B, h, S, d) shape and a float dtype (the fused op's heads, no GQA here)."""
    tq, tk, tv = (program.type(x) for x in (q, k, v))
    return (
        tq.rank == 4
        and tq.dtype.is_float
        and tq.shape == tk.shape == tv.shape
        and tq.dtype == tk.dtype == tv.dtype
    )


def _causal_window(program: Program, mask: Value, s: int, hint: int | None) -> int | None:
    """The window of ``mask``'s known value if it is the causal mask over ``s`` positions (0: no
    window), else None; a value too large to know (computed from the sizes, not read from a
    weight) takes the ``hint`` (the module docstring)."""
    value = program.known(mask)
    if value is None:
        value = next((p.value for v, p in program.params if v is mask), None)
    if value is None:
        t = program.type(mask)
        weight = any(v is mask for v, _ in program.params)
        computed = not weight and t.rank == 4 and t.shape[-2:] == (s, s) and t.shape[1] == 1
        return hint if computed else None
    return causal_window(np.asarray(value), s)


def causal_mask(m: np.ndarray, s: int) -> bool:
    """``m`` (…, s, s) is the additive causal mask without a window (``causal_window``)."""
    return causal_window(m, s) == 0


def causal_window(m: np.ndarray, s: int) -> int | None:
    """The window W if ``m`` (…, s, s) is an additive causal mask — 0 where key j may be seen by
    query i (j ≤ i, and i − W < j when W > 0), at most ``MASKED`` elsewhere, alike for every
    leading index (batch, head) — 0 for one without a window (or one as long as ``s``), None
    for any other. Checked in blocks of rows (8,192 positions without an 8,192² temporary)."""
    if m.ndim < 2 or m.shape[-2:] != (s, s):
        return None
    rows = np.asarray(m).reshape(-1, s, s)
    first, cols = rows[0], np.arange(s)
    window = int(np.count_nonzero(first[-1] == 0))  # the last query sees min(W, s) keys
    if not 0 < window <= s:
        return None
    for lo in range(0, s, _ROWS):
        hi = min(lo + _ROWS, s)
        block = first[lo:hi]
        i = np.arange(lo, hi)[:, None]
        seen = (cols[None, :] <= i) & (cols[None, :] > i - window)
        if not np.all(np.where(seen, block == 0, block <= MASKED)):
            return None
        if not np.all(rows[1:, lo:hi] == block):
            return None
    return 0 if window == s else window


_ROWS = 256  # rows of a mask checked at once (``causal_mask``)


def _rewrite(
    program: Program, chains: list[_Chain], made: dict[Value, Op], outputs: tuple[Value, ...]
) -> None:
    """Each chain's ops replaced by one ``Attention`` (and the transposes it still needs) where
    its product with v was; what no longer has a reader dropped, the mask weight with it."""
    by_last = {id(c.last): c for c in chains}
    drop = {id(op) for c in chains for op in c.inner}
    ops, origins = program.ops, program.origin
    program.ops, program.origin = [], []
    subst: dict[Value, Value] = {}
    back: dict[Value, Value] = {}  # an emitted (B, h, S, d) result -> the attention's BSHD one
    for op, k in zip(ops, origins, strict=True):
        if id(op) in drop:
            continue
        c = by_last.get(id(op))
        op = Op(op.name, tuple(subst.get(v, v) for v in op.inputs), op.outputs, op.attrs)
        if op.name == "Transpose" and op.attrs.get("perm") == BHSD and op.inputs[0] in back:
            subst[op.outputs[0]] = back[op.inputs[0]]  # the head transpose after it: cancelled
            continue
        if c is None:
            program.ops.append(op)
            program.origin.append(k)
            continue
        where = f"node #{k} (attention)"
        q = _bshd(program, subst.get(c.q, c.q), made, k, where)
        key, v = (
            _bshd(program, _unrepeated(program, subst.get(x, x), made), made, k, where) for x in (c.k, c.v)
        )
        attrs = {"causal": c.causal, "scale": c.scale} | ({"window": c.window} if c.window else {})
        o, _ = program.emit("Attention", (q, key, v), attrs, ["attention", "lse"], k, where)
        (out,) = program.emit("Transpose", (o,), {"perm": BHSD}, [op.outputs[0].name], k, where)
        subst[op.outputs[0]] = out
        back[out] = o
    program.drop_dead(tuple(subst.get(v, v) for v in outputs))


def _unrepeated(program: Program, x: Value, made: dict[Value, Op]) -> Value:
    """The (B, h_kv, S, d) keys or values that ``x`` (B, h, S, d) repeats per query group, as
    Hugging Face's ``repeat_kv`` writes it (``Unsqueeze`` at dim 2, ``Expand`` of that dim to
    h / h_kv, ``Reshape`` merging it into the heads), else ``x``: the fused attention reads the
    groups' keys and values itself (GQA), as the trainers' kernels do."""
    reshape = made.get(x)
    expand = made.get(reshape.inputs[0]) if reshape is not None and reshape.name == "Reshape" else None
    unsq = made.get(expand.inputs[0]) if expand is not None and expand.name == "Expand" else None
    if unsq is None or unsq.name != "Unsqueeze" or unsq.attrs.get("axes") not in ((2,), [2]):
        return x
    kv, out = program.type(unsq.inputs[0]), program.type(x)
    b, hk, s, d = kv.shape if kv.rank == 4 else (0, 0, 0, 0)
    repeated = program.type(expand.outputs[0]).shape  # type: ignore[union-attr]
    if kv.rank != 4 or hk == 0 or out.shape[1] % hk or repeated != (b, hk, out.shape[1] // hk, s, d):
        return x
    return x if out.shape != (b, out.shape[1], s, d) else unsq.inputs[0]


def _bshd(program: Program, x: Value, made: dict[Value, Op], k: int, where: str) -> Value:
    """``x`` (B, h, S, d) in the BSHD layout: the input of the head transpose that made it, else
    a Transpose of it."""
    t = made.get(x)
    if t is not None and t.name == "Transpose" and t.attrs.get("perm") == BHSD:
        return t.inputs[0]
    (y,) = program.emit("Transpose", (x,), {"perm": BHSD}, [f"{x.name}_bshd"], k, where)
    return y
