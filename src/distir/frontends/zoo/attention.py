"""Multi-head (and grouped-query) scaled dot-product attention, written into a layer function.

Two forms (a model's ``attention`` option): ``fused`` (the default) is the registry's
``Attention`` op on the heads in the BSHD layout, as FlashAttention runs it (no S×S value; its
backward recomputes the scores), ``naive`` the explicit computation below. Both give the same
numbers. Fused:

    Reshape(q, shape=(0, 0, heads, head_dim)), k and v alike (kv_heads)      (B, S, h, d)
    out, lse = Attention(q, k, v; causal) → Reshape(shape=(0, 0, heads·head_dim))

The projections feeding it are three GEMMs or, with a model's ``qkv=fused``, one
(``split_qkv``: its output split per query group into views, each a reshape away from its heads).

With ``rope_theta`` (Llama, Nemotron), q and k are rotated by ``Rope`` right after the head
split, in either form.

Naive. Shapes: ``q`` is (B, S, heads·head_dim), ``k`` and ``v`` are (B, S, kv_heads·head_dim). Heads are
split with the shape-attribute ``Reshape`` and ``0`` for the batch and sequence dims (copied
from the input), so nothing here depends on the batch size:

    Reshape(q, shape=(0, 0, heads, head_dim)) → Transpose(0, 2, 1, 3)          (B, h, S, d)
    Reshape(k, ...)                            → Transpose(0, 2, 3, 1)          (B, h, d, S)
    scores = Scale(MatMul(q, kᵀ), alpha=1/sqrt(head_dim)) → CausalMask → Softmax(axis=3)
    MatMul(probs, v) → Transpose(0, 2, 1, 3) → Reshape(shape=(0, 0, heads·head_dim))

Grouped-query attention repeats each of the ``kv_heads`` key/value heads ``heads/kv_heads``
times (query head ``i`` reads kv head ``i // (heads/kv_heads)``, as Llama's ``repeat_kv``):
``Unsqueeze`` a group axis after the kv-head axis, ``Concat`` copies along it, ``Reshape`` the
(kv_heads, group) pair into heads. The kv-head axis stays a dim of its own until that last
reshape, so a tensor-parallel shard of the kv heads carries through to the query heads.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from distir.frontends.zoo._build import LayerFn, inv_sqrt, weight
from distir.frontends.zoo.model import WeightSpec
from distir.ir.dtensor import Shard
from distir.ir.types import DType
from distir.ir.values import Value

ATTENTION_FORMS = ("fused", "naive")
QKV_FORMS = ("split", "fused")  # three projections; one GEMM of one weight, per query group


def attention_field() -> Any:
    """The ``attention`` option of a transformer config: ``fused`` (default: the registry's
    ``Attention`` op, as FlashAttention runs it) or ``naive`` (the explicit QKᵀ, softmax, ·V);
    an enumerated field (``check_config`` and the model-string parser read its ``choices``)."""
    return field(default="fused", metadata={"choices": ATTENTION_FORMS})


def qkv_field() -> Any:
    """The ``qkv`` option of a transformer config: ``split`` (default: Q, K and V three GEMMs of
    three weights, as torchtitan's ``wq``, ``wk``, ``wv``) or ``fused`` (one GEMM of one weight,
    ``qkv_columns``, as Megatron-Core's ``linear_qkv``, llm-foundry's ``Wqkv``, GPT-2's
    ``c_attn``); an enumerated field."""
    return field(default="split", metadata={"choices": QKV_FORMS})


def qkv_columns(heads: int, kv_heads: int, head_dim: int) -> int:
    """The fused projection's width, ``(heads + 2·kv_heads)·head_dim``."""
    return (heads + 2 * kv_heads) * head_dim


def split_qkv(f: LayerFn, qkv: Value, heads: int, kv_heads: int, head_dim: int) -> tuple[Value, Value, Value]:
    """Q, K, V out of the fused projection (B, S, ``qkv_columns``), whose columns are laid out
    per query group as Megatron-Core's ``linear_qkv`` weight: kv head ``j`` is preceded by its
    ``heads/kv_heads`` query heads and followed by its value head, ``[q_{jg} … q_{jg+g-1}, k_j,
    v_j]``. ``Reshape`` to (B, S, kv_heads, (g+2)·head_dim), then ``Split`` the last dim into
    views (``view=1``: torch.split's, no copy): q (B, S, kv_heads, g·head_dim), k and v (B, S,
    kv_heads, head_dim), each a reshape away from its heads. A column shard of the weight over
    whole groups (the TP degree dividing kv_heads) gives each rank its query heads with their
    own kv head: the kv-head axis carries the shard through the split."""
    group = heads // kv_heads
    grouped = f("Reshape", qkv, shape=(0, 0, kv_heads, (group + 2) * head_dim), name="qkv_groups")
    sizes = (group * head_dim, head_dim, head_dim)
    q, k, v = f.results("Split", grouped, names=("q", "k", "v"), dim=3, sizes=sizes, view=1)
    return q, k, v


def project_qkv(
    f: LayerFn, h: Value, p: dict[str, Value], fused: bool, heads: int, kv_heads: int, head_dim: int
) -> tuple[Value, Value, Value]:
    """Q, K, V of the normed input ``h``: one GEMM of ``p["wqkv"]`` split per query group
    (``fused``, ``split_qkv``) or three GEMMs of ``p["wq"]``, ``p["wk"]``, ``p["wv"]``."""
    if fused:
        return split_qkv(f, f("MatMul", h, p["wqkv"], name="qkv"), heads, kv_heads, head_dim)
    return (
        f("MatMul", h, p["wq"], name="q"),
        f("MatMul", h, p["wk"], name="k"),
        f("MatMul", h, p["wv"], name="v"),
    )


def qkv_weights(
    i: int, hidden: int, heads: int, kv_heads: int, dtype: DType, fused: bool
) -> tuple[WeightSpec, ...]:
    """Block ``i``'s Q, K, V projection weights, column-parallel: ``wqkv_i`` over whole query
    groups (``fused``, ``qkv_columns``) or ``wq_i``, ``wk_i``, ``wv_i``."""
    head_dim, col = hidden // heads, Shard(1)
    if fused:
        return (weight(f"wqkv_{i}", dtype, (hidden, qkv_columns(heads, kv_heads, head_dim)), col),)
    kv = kv_heads * head_dim
    return (
        weight(f"wq_{i}", dtype, (hidden, hidden), col),
        weight(f"wk_{i}", dtype, (hidden, kv), col),
        weight(f"wv_{i}", dtype, (hidden, kv), col),
    )


def split_heads(f: LayerFn, x: Value, heads: int, head_dim: int, name: str) -> Value:
    """(B, S, heads·head_dim) → (B, S, heads, head_dim); from ``split_qkv``'s (B, S, kv_heads,
    g·head_dim) alike."""
    return f("Reshape", x, shape=(0, 0, heads, head_dim), name=name)


def repeat_kv(f: LayerFn, x: Value, kv_heads: int, group: int, head_dim: int, name: str) -> Value:
    """(B, S, kv_heads, head_dim) → (B, S, kv_heads·group, head_dim), each kv head repeated
    ``group`` times in a row."""
    if group == 1:
        return x
    u = f("Unsqueeze", x, axes=(3,), name=f"{name}_g")  # (B, S, kv, 1, d)
    copies = f("Concat", *([u] * group), axis=3, name=f"{name}_rep")  # (B, S, kv, group, d)
    return f("Reshape", copies, shape=(0, 0, kv_heads * group, head_dim), name=f"{name}_heads")


def expand_kv(f: LayerFn, x: Value, kv_heads: int, group: int, head_dim: int, name: str) -> Value:
    """(B, S, kv_heads, head_dim) → (B, S, kv_heads·group, head_dim) as torchtitan's ``repeat_kv``
    runs it: ``unsqueeze(3).expand(...).reshape(...)``, whose reshape of the expanded view
    copies it (one kernel reading the kv heads and writing ``group`` times their bytes; its
    gradient sums the group axis, one reduction, as PyTorch's expand backward ``sum_to_size``)."""
    if group == 1:
        return x
    u = f("Unsqueeze", x, axes=(3,), name=f"{name}_g")  # (B, S, kv, 1, d)
    copies = f("Expand", u, shape=(1, 1, 1, group, 1), name=f"{name}_rep")  # (B, S, kv, group, d)
    return f("Reshape", copies, shape=(0, 0, kv_heads * group, head_dim), name=f"{name}_heads")


def rope(f: LayerFn, x: Value, theta: float, f32_from: DType | None, name: str, **pairs: Any) -> Value:
    """``Rope`` of ``x``; with ``f32_from`` (``x``'s dtype) in f32: ``x`` cast to f32 first and
    the result cast back to ``f32_from`` (layer functions are untyped: the caller names it).
    ``pairs``: the op's ``halves`` and ``freqs`` attributes, when given."""
    if f32_from is None:
        return f("Rope", x, theta=theta, name=name, **pairs)
    y = f("Rope", f("Cast", x, to=DType.f32, name=f"{name}_f32"), theta=theta, name=f"{name}_rot", **pairs)
    return f("Cast", y, to=f32_from, name=name)


def attention(
    f: LayerFn,
    q: Value,
    k: Value,
    v: Value,
    *,
    heads: int,
    head_dim: int,
    kv_heads: int | None = None,
    causal: bool = True,
    form: str = "fused",
    rope_theta: float | None = None,
    dropout: float = 0.0,
    rope_f32_from: DType | None = None,
    unpad: bool = False,
    kv_copy: bool = False,
    rope_halves: bool = False,
    rope_freqs: tuple[float, ...] | None = None,
) -> Value:
    """Attention over already-projected ``q``, ``k``, ``v``; returns (B, S, heads·head_dim)
    (before the output projection). ``form`` is ``fused`` or ``naive``; ``rope_theta`` (if
    given) rotates q and k by position first; ``dropout`` > 0 drops attention probabilities
    (the fused op's ``dropout`` attribute; in the naive form a ``Dropout`` after the softmax);
    ``rope_f32_from`` (if given: the activations' dtype) rotates in f32, q and k cast to f32
    and back (torchtitan's ``xq.float()`` ... ``type_as(xq)``: ``rope``); ``unpad`` (fused form)
    copies q, k, v in and the output out as llm-foundry's ``flash_attn_fn`` does around
    flash-attn's variable-length kernel (``UnpadTokens``, ``PadTokens``: ``bert_padding``'s
    ``index_first_axis`` and ``pad_input``, every token kept); ``kv_copy`` (fused form) repeats
    the kv heads into copies before the kernel, as torchtitan's ``repeat_kv`` does before SDPA
    (``expand_kv``), where the default hands the kernel the kv heads themselves;
    ``rope_halves`` rotates the pairs ``(i, i + d/2)`` (Megatron-Core's ``rotate_half``) where
    the default rotates ``(2i, 2i + 1)`` (Meta's Llama), and ``rope_freqs`` gives each pair's
    frequency (``Rope``'s ``freqs``; a 0 leaves the pair as it is: a partial rotation)."""
    kv = heads if kv_heads is None else kv_heads
    group = heads // kv
    qh = split_heads(f, q, heads, head_dim, "qh")
    kh = split_heads(f, k, kv, head_dim, "kh")
    if rope_theta is not None:
        pairs: dict[str, Any] = {"halves": True} if rope_halves else {}
        if rope_freqs is not None:
            pairs["freqs"] = rope_freqs
        qh = rope(f, qh, float(rope_theta), rope_f32_from, "q_rope", **pairs)
        kh = rope(f, kh, float(rope_theta), rope_f32_from, "k_rope", **pairs)
    vh = split_heads(f, v, kv, head_dim, "vh")
    if form == "fused":
        drop = {"dropout": dropout} if dropout > 0.0 else {}
        if kv_copy:
            kh = expand_kv(f, kh, kv, group, head_dim, "k")
            vh = expand_kv(f, vh, kv, group, head_dim, "v")
        if unpad:
            qh, kh, vh = (f("UnpadTokens", x, name=f"{x.name}_unpad") for x in (qh, kh, vh))
        out, _ = f.results("Attention", qh, kh, vh, names=["ctx", "lse"], causal=causal, **drop)
        if unpad:
            out = f("PadTokens", out, name="ctx_pad")
        return f("Reshape", out, shape=(0, 0, heads * head_dim), name="attn")
    kh = repeat_kv(f, kh, kv, group, head_dim, "k")
    vh = repeat_kv(f, vh, kv, group, head_dim, "v")
    qt = f("Transpose", qh, perm=(0, 2, 1, 3), name="qt")  # (B, h, S, d)
    kt = f("Transpose", kh, perm=(0, 2, 3, 1), name="kt")  # (B, h, d, S)
    vt = f("Transpose", vh, perm=(0, 2, 1, 3), name="vt")  # (B, h, S, d)
    scores = f("MatMul", qt, kt, name="scores")  # (B, h, S, S)
    scores = f("Scale", scores, alpha=inv_sqrt(head_dim), name="scaled")
    if causal:
        scores = f("CausalMask", scores, name="masked")
    probs = f("Softmax", scores, axis=3, name="probs")
    if dropout > 0.0:
        probs, _ = f.results("Dropout", probs, names=["probs_drop", "probs_mask"], p=dropout)
    ctx = f("MatMul", probs, vt, name="ctx")  # (B, h, S, d)
    merged = f("Transpose", ctx, perm=(0, 2, 1, 3), name="ctx_t")  # (B, S, h, d)
    return f("Reshape", merged, shape=(0, 0, heads * head_dim), name="attn")
