"""Llama-style decoders: RMSNorm, SwiGLU MLP, grouped-query attention, no biases.

    func @forward(%ids: i64 (B, S), %labels: i64 (B, S), %tok_emb, <block weights>..., %norm, %wlm) {
      %x0 = @embed(%ids, %tok_emb)                       // Gather (no position embedding)
      %x1 = @block(%x0, %attn_norm_0, %wq_0, %wk_0, %wv_0, %wo_0, %ffn_norm_0, %w1_0, %w3_0, %w2_0)
      ...
      %logits = @head(%xL, %norm, %wlm)                  // RMSNorm, MatMul to the vocab
      %loss = @loss(%logits, %labels)                    // cross entropy (sum) · 1/(B·S)
    }

``@block`` is ``x + Wo·Attn(RMSNorm(x))`` then ``x + W2·(silu(W1·h) ⊙ W3·h)`` with
``h = RMSNorm(x)`` and ``silu(a) = a·Sigmoid(a)`` (one ``Silu`` op: ``silu=fused``, below).
Attention is causal and grouped-query: the ``kv_heads`` key/value heads are each repeated
``heads/kv_heads`` times (``attention.py``; ``attention=fused`` by default, ``naive`` the
explicit form). Position information is Llama's rotary embedding (``Rope`` on q and k after the
head split, Meta's interleaved pairs) with base
``rope_theta``: 10000 for Llama 2, 500000 for Llama 3 (the released configs).

Simplified with respect to Llama: RMSNorm epsilon 1e-5. ``wlm`` is untied from the token
embedding, as in Llama.

Two options say how eager PyTorch runs a layer (which kernels, hence which costs), as
torchtitan's Llama does without ``torch.compile`` (torchtitan/models/norms.py ``RMSNorm`` and
torchtitan/models/llama/model.py ``apply_rotary_emb`` at 9dec370, the version of its published
H100 benchmarks). ``norm=composite``: RMSNorm as that module's separate ops, ``x.float()``,
``pow(2).mean(-1, keepdim=True)``, the root, the product, ``type_as(x)`` and the product with
the weight: ``Cast`` to f32, ``Mul(x, x)``, ``ReduceMean``, ``Sqrt``, ``Div``, ``Cast`` back,
``Mul`` by the weight (the epsilon is left out: no differentiable op adds a constant without a
constant tensor; it matters for an all-zero token only). ``rope=fp32``: q and k cast to f32
before the rotation and back after (``xq.float()``, the complex product, ``type_as``). The
defaults (``norm=fused``, ``rope=fused``) are one ``RMSNormalization`` and one ``Rope`` in the
model's dtype, as fused kernels and ``torch.compile`` run them. The casts are there for a model
in bf16 or f16 only (``x.float()`` upcasts the low-precision activations; an f32 or f64 model
runs the same ops without them). ``Mul(x, x)`` reads ``x`` twice where ``pow(2)`` reads it once:
4 bytes per element more than the module moves. ``silu=fused`` (the default): SwiGLU's
``F.silu(w1(x))`` as one ``Silu`` op (one kernel forward, one backward, saving its input, as
PyTorch runs it, eager or not, and Megatron-LM's fused SwiGLU); ``silu=composite``: ``a·Sigmoid(a)``
(two ops, each a kernel of its own when nothing fuses them, the sigmoid saved too).
``kv=copy``: grouped-query attention's k and v repeated to ``heads`` heads before the fused
kernel, as torchtitan's ``repeat_kv`` (``unsqueeze(3).expand(...).reshape(...)``: the reshape of
the expanded view copies it) does before ``F.scaled_dot_product_attention``: an ``Expand`` each
forward (reads the kv heads, writes ``heads/kv_heads`` times their bytes), a ``ReduceSum`` of the
group axis each backward. The default (``native``) hands the kernel the kv heads themselves, as
flash-attn and SDPA's ``enable_gqa`` read them.

Tensor-parallel declarations (Megatron-LM / Llama's model-parallel layers): wq, wk, wv, w1, w3
column-parallel ``S(1)``; wo, w2 row-parallel ``S(0)``; norms replicated; the embedding sharded
on the vocabulary and ``wlm`` column-parallel, the logits reaching the loss sharded on the
vocabulary (Megatron-LM's vocabulary-parallel layers, as GPT's). A column shard of wk/wv splits
whole kv heads when the TP degree divides kv_heads. ``qkv=fused`` computes q, k and v as one
GEMM of one column-parallel weight ``wqkv`` laid out per query group (``attention.split_qkv``,
Megatron-Core's ``linear_qkv``), where the default has torchtitan's three. The activations
between layers are (batch, seq, hidden): ``seq_dim=1``.

Sizes (Touvron et al., "Llama 2: Open Foundation and Fine-Tuned Chat Models", 2023, and the
released configs; Meta, "The Llama 3 Herd of Models", 2024, Table 3): ``llama2-7b`` 32×4096,
32 heads, ffn 11008, vocabulary 32000, context 4096; ``llama2-13b`` 40×5120, 40 heads, ffn 13824;
``llama2-70b`` 80×8192, 64 heads, 8 kv heads, ffn 28672; ``llama3-8b`` 32×4096, 32 heads, 8 kv
heads, ffn 14336, vocabulary 128256, context 8192; ``llama3-405b`` 126×16384, 128 heads, 8 kv
heads, ffn 53248, vocabulary 128256, context 8192 (the 8192 of its pre-training; Table 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from distir.frontends.zoo._build import LayerCall, LayerFn, check_config, tensor, weight
from distir.frontends.zoo.attention import attention, attention_field, project_qkv, qkv_field, qkv_weights
from distir.frontends.zoo.gpt import VOCAB, assemble_lm, loss_field
from distir.frontends.zoo.model import InputSpec, Model, ModelError, WeightSpec
from distir.ir.dtensor import Replicate, Shard
from distir.ir.function import Function
from distir.ir.types import DType
from distir.ir.values import Value

FAMILY = "llama"
R, COL, ROW = Replicate(), Shard(1), Shard(0)
BLOCK_WEIGHTS = ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w1", "w3", "w2")
FUSED_WEIGHTS = ("attn_norm", "wqkv", "wo", "ffn_norm", "w1", "w3", "w2")  # ``qkv=fused``
NORM_FORMS = ("fused", "composite")  # one RMSNormalization; eager PyTorch's separate ops
SILU_FORMS = ("composite", "fused")  # a·Sigmoid(a) as two ops; one Silu (F.silu)
ROPE_FORMS = ("fused", "fp32")  # Rope in the model's dtype; cast to f32 and back around it
KV_FORMS = ("native", "copy")  # the kernel reads the kv heads; repeat_kv copies them first
LOW_PRECISION = (DType.bf16, DType.f16)  # the dtypes the eager forms upcast to f32


def _choice(default: str, choices: tuple[str, ...]) -> Any:
    return field(default=default, metadata={"choices": choices})


@dataclass(frozen=True)
class LlamaConfig:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq: int
    rope_theta: int = 10000  # RoPE's base: 10000 (Llama 2), 500000 (Llama 3)
    attention: str = attention_field()
    loss: str = loss_field()  # the cross entropy's kernel: fp32 (default), fused, torch or parallel
    norm: str = _choice("fused", NORM_FORMS)  # RMSNorm: one op or eager PyTorch's (module doc)
    rope: str = _choice("fused", ROPE_FORMS)  # RoPE in the model's dtype or in f32 (module doc)
    silu: str = _choice("fused", SILU_FORMS)  # SwiGLU's silu: one Silu op or Mul·Sigmoid
    kv: str = _choice("native", KV_FORMS)  # grouped kv heads: read by the kernel or copied (doc)
    qkv: str = qkv_field()  # Q, K, V: three GEMMs (split) or one of one weight (fused; doc)

    def __post_init__(self) -> None:
        check_config(FAMILY, self, divides=[("heads", "hidden"), ("kv_heads", "heads")])
        if (self.hidden // self.heads) % 2:
            raise ModelError(
                f"{FAMILY}: head_dim = hidden/heads = {self.hidden // self.heads} must be even (RoPE)"
            )


ZOO: dict[str, tuple[LlamaConfig, str]] = {
    "llama2-7b": (LlamaConfig(32, 4096, 32, 32, 11008, 32000, 4096), "Llama 2 7B (Touvron et al. 2023)"),
    "llama2-13b": (LlamaConfig(40, 5120, 40, 40, 13824, 32000, 4096), "Llama 2 13B (Touvron et al. 2023)"),
    "llama2-70b": (LlamaConfig(80, 8192, 64, 8, 28672, 32000, 4096), "Llama 2 70B (Touvron et al. 2023)"),
    "llama3-8b": (
        LlamaConfig(32, 4096, 32, 8, 14336, 128256, 8192, rope_theta=500000),
        "Llama 3 8B (Meta 2024)",
    ),
    "llama3-405b": (
        LlamaConfig(126, 16384, 128, 8, 53248, 128256, 8192, rope_theta=500000),
        "Llama 3 405B (Meta 2024)",
    ),
}


def rms_norm(f: LayerFn, x: Value, scale: Value, form: str, dtype: DType, name: str) -> Value:
    """RMSNorm of ``x`` (activations of ``dtype``) by ``scale``: one ``RMSNormalization``
    (``form="fused"``) or the separate ops of torchtitan's eager ``RMSNorm`` (``composite``:
    ``(x.float() / sqrt(mean(x.float()²))).type_as(x) · scale``; module docstring)."""
    if form == "fused":
        return f("RMSNormalization", x, scale, name=name)
    low = dtype in LOW_PRECISION
    xf = f("Cast", x, to=DType.f32, name=f"{name}_f32") if low else x
    ms = f("ReduceMean", f("Mul", xf, xf, name=f"{name}_sq"), axes=(-1,), keepdims=1, name=f"{name}_ms")
    y = f("Div", xf, f("Sqrt", ms, name=f"{name}_rms"), name=f"{name}_n")
    y = f("Cast", y, to=dtype, name=f"{name}_cast") if low else y
    return f("Mul", y, scale, name=name)


def block_fn(cfg: LlamaConfig, dtype: DType = DType.f32) -> Function:
    """One decoder layer on activations of ``dtype`` (the dtype the eager forms cast back to)."""
    hidden, heads, kv_heads = cfg.hidden, cfg.heads, cfg.kv_heads
    f = LayerFn("block")
    x = f.param("x")
    p = {n: f.param(n) for n in (FUSED_WEIGHTS if cfg.qkv == "fused" else BLOCK_WEIGHTS)}
    h = rms_norm(f, x, p["attn_norm"], cfg.norm, dtype, "attn_in")
    q, k, v = project_qkv(f, h, p, cfg.qkv == "fused", heads, kv_heads, hidden // heads)
    a = attention(
        f,
        q,
        k,
        v,
        heads=heads,
        head_dim=hidden // heads,
        kv_heads=kv_heads,
        form=cfg.attention,
        rope_theta=cfg.rope_theta,
        rope_f32_from=dtype if cfg.rope == "fp32" and dtype in LOW_PRECISION else None,
        kv_copy=cfg.kv == "copy",
    )
    x = f("Add", x, f("MatMul", a, p["wo"], name="o"), name="x_attn")
    h = rms_norm(f, x, p["ffn_norm"], cfg.norm, dtype, "ffn_in")
    gate = f("MatMul", h, p["w1"], name="gate")
    if cfg.silu == "fused":
        silu = f("Silu", gate, name="silu")
    else:
        silu = f("Mul", gate, f("Sigmoid", gate, name="sig"), name="silu")
    up = f("MatMul", h, p["w3"], name="up")
    down = f("MatMul", f("Mul", silu, up, name="swiglu"), p["w2"], name="down")
    return f.ret(f("Add", x, down, name="x_mlp"))


def block_weights(i: int, cfg: LlamaConfig, dtype: DType) -> tuple[WeightSpec, ...]:
    h = cfg.hidden
    qkv = qkv_weights(i, cfg.hidden, cfg.heads, cfg.kv_heads, dtype, cfg.qkv == "fused")
    return (
        weight(f"attn_norm_{i}", dtype, (h,), value=1.0),
        *qkv,
        weight(f"wo_{i}", dtype, (h, h), ROW),
        weight(f"ffn_norm_{i}", dtype, (h,), value=1.0),
        weight(f"w1_{i}", dtype, (h, cfg.ffn), COL),
        weight(f"w3_{i}", dtype, (h, cfg.ffn), COL),
        weight(f"w2_{i}", dtype, (cfg.ffn, h), ROW),
    )


def embed_fn() -> Function:
    f = LayerFn("embed")
    ids, table = f.param("ids"), f.param("tok_emb")
    return f.ret(f("Gather", table, ids, axis=0, name="x"))


def head_fn(norm: str = "fused", dtype: DType = DType.f32) -> Function:
    f = LayerFn("head")
    x, scale, wlm = f.param("x"), f.param("norm"), f.param("wlm")
    return f.ret(f("MatMul", rms_norm(f, x, scale, norm, dtype, "normed"), wlm, name="logits"))


def build(cfg: LlamaConfig, batch: int, dtype: DType = DType.f32, name: str = FAMILY) -> Model:
    h, s, v = cfg.hidden, cfg.seq, cfg.vocab
    inputs = (
        InputSpec("ids", tensor(DType.i64, batch, s), high=v),
        InputSpec("labels", tensor(DType.i64, batch, s), high=v),
    )
    block = block_fn(cfg, dtype)
    calls = [LayerCall(embed_fn(), (weight("tok_emb", dtype, (v, h), VOCAB),), "x0")]
    calls += [LayerCall(block, block_weights(i, cfg, dtype), f"x{i + 1}") for i in range(cfg.layers)]
    head_w = (weight("norm", dtype, (h,), value=1.0), weight("wlm", dtype, (h, v), COL))
    calls.append(LayerCall(head_fn(cfg.norm, dtype), head_w, "logits"))
    return assemble_lm(name, FAMILY, cfg, inputs, calls, v, batch * s)
