"""Nemotron decoders (NVIDIA's Nemotron-3 / Nemotron-4): LayerNorm1p, a squared-ReLU MLP,
grouped-query attention with partial RoPE, no linear biases, untied embeddings.

    func @forward(%ids: i64 (B, S), %labels: i64 (B, S), %tok_emb, <block weights>..., %lnf_scale,
                  %lnf_bias, %wlm) {
      %x0 = @embed(%ids, %tok_emb)                       // Gather (no position embedding)
      %x1 = @block(%x0, %ln1_scale_0, %ln1_bias_0, %wq_0, %wk_0, %wv_0, %wo_0, %ln2_scale_0, ...)
      ...
      %logits = @head(%xL, %lnf_scale, %lnf_bias, %wlm)  // LayerNorm1p, MatMul to the vocab
      %loss = @loss(%logits, %labels)                    // cross entropy (sum) · 1/(B·S)
    }

``@block`` is pre-LN: ``x + Wo·Attn(LN1p(x))`` then ``x + W2·relu(W1·LN1p(x))²``. The MLP is
ungated (two matmuls, no SwiGLU); its activation is one ``SquaredRelu`` op, as Megatron-Core runs
``squared_relu`` (``torch.pow(F.relu(x), 2)`` under its ``jit_fuser``, which is torch.compile from
PyTorch 2.2: one kernel each way, saving the activation's input only; Transformer Engine's layers
do not run it, Megatron-Core's MLP does, after TE's fc1). ``LN1p`` is NeMo's ``layernorm1p``
(``layernorm_zero_centered_gamma``): a LayerNorm with a bias whose weight is stored as ``w``,
initialized to 0, and applied as ``1 + w`` (``LayerNormalization(zero_centered_gamma=1)``, one
kernel like any LayerNorm: the +1 is folded into it), epsilon 1e-5. No linear layer has a bias
(the launcher's ``bias: false``).

Attention is causal and grouped-query (``kv_heads`` key/value heads; ``attention.py``). Positions
are rotary with base ``rope_theta`` 10000 on ``rotary_percent`` of each head's channels (the
recipes' ``rotary_percentage: 0.5``: 50): Megatron-Core rotates the first ``d·pct/100`` channels of
a head in halves (``rotate_half``) and passes the rest through. Here that is one ``Rope`` over the
whole head in halves (pairs ``(i, i + d/2)``) with the frequencies of the rotated pairs and 0 (no
rotation) for the others (its ``freqs``): the channels Megatron-Core rotates together are a fixed
permutation away from these, applied alike to q and k (the columns of wq and wk), so the model is
the same function of its weights up to that relabelling; and Transformer Engine's fused RoPE
(``apply_rope_fusion``) reads and writes the whole head as this op does.

Options as Llama's: ``attention`` (fused or naive), ``qkv`` (split: three GEMMs; fused:
Megatron-Core's ``linear_qkv``, one weight laid out per query group), ``loss``.

Tensor-parallel declarations (Megatron-Core): wq, wk, wv (wqkv) and w1 column-parallel ``S(1)``;
wo and w2 row-parallel ``S(0)``; norms replicated; the embedding sharded on the vocabulary and
``wlm`` column-parallel, the logits reaching the loss sharded on the vocabulary. The activations
between layers are (batch, seq, hidden): ``seq_dim=1`` (sequence parallelism shards it).

Sizes (NeMo-Framework-Launcher 24.07, ``conf/training/nemotron/*.yaml`` at 8325688, and the
reports): ``nemotron-8b`` 32×4096, 32 heads, ffn 16384 (``nemotron_8b.yaml``); ``nemotron-15b``
32×6144, 48 heads, 8 kv heads, ffn 24576 (Nemotron-4 15B: Parmar et al., "Nemotron-4 15B
Technical Report", 2024, Table 1; ``nemotron_15b.yaml``); ``nemotron-22b`` 40×6144, 48 heads,
ffn 24576 (``nemotron_22b.yaml``); ``nemotron-340b`` 96×18432, 96 heads, 8 kv heads, ffn 73728
(Nemotron-4 340B: NVIDIA, "Nemotron-4 340B Technical Report", 2024, Table 1;
``nemotron_340b.yaml``). All: vocabulary 256000 (Nemotron's sentencepiece tokenizer), context
4096, ffn 4·hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

from distir.frontends.zoo._build import LayerCall, LayerFn, check_config, tensor, weight
from distir.frontends.zoo.attention import attention, attention_field, project_qkv, qkv_field, qkv_weights
from distir.frontends.zoo.gpt import VOCAB, assemble_lm, loss_field
from distir.frontends.zoo.model import InputSpec, Model, ModelError, WeightSpec
from distir.ir.dtensor import Replicate, Shard
from distir.ir.function import Function
from distir.ir.types import DType
from distir.ir.values import Value

FAMILY = "nemotron"
R, COL, ROW = Replicate(), Shard(1), Shard(0)
BLOCK_WEIGHTS = ("ln1_scale", "ln1_bias", "wq", "wk", "wv", "wo", "ln2_scale", "ln2_bias", "w1", "w2")
FUSED_WEIGHTS = ("ln1_scale", "ln1_bias", "wqkv", "wo", "ln2_scale", "ln2_bias", "w1", "w2")  # ``qkv=fused``
EPSILON = 1e-5  # the recipes' layernorm_epsilon


@dataclass(frozen=True)
class NemotronConfig:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq: int
    rope_theta: int = 10000  # RoPE's base (Megatron-Core's rotary_base default)
    rotary_percent: int = 50  # the share of each head's channels RoPE rotates, in percent
    attention: str = attention_field()
    loss: str = loss_field()  # the cross entropy's kernel: fp32 (default), fused, torch or parallel
    qkv: str = qkv_field()  # Q, K, V: three GEMMs (split) or one of one weight (fused)

    def __post_init__(self) -> None:
        check_config(FAMILY, self, divides=[("heads", "hidden"), ("kv_heads", "heads")])
        head_dim = self.hidden // self.heads
        if self.rotary_percent > 100 or (head_dim * self.rotary_percent) % 200:
            raise ModelError(
                f"{FAMILY}: rotary_percent={self.rotary_percent} must be at most 100 and rotate an even "
                f"number of the head's {head_dim} channels"
            )


ZOO: dict[str, tuple[NemotronConfig, str]] = {
    "nemotron-8b": (NemotronConfig(32, 4096, 32, 32, 16384, 256000, 4096), "Nemotron 8B (NeMo launcher)"),
    "nemotron-15b": (
        NemotronConfig(32, 6144, 48, 8, 24576, 256000, 4096),
        "Nemotron-4 15B (Parmar et al. 2024)",
    ),
    "nemotron-22b": (NemotronConfig(40, 6144, 48, 48, 24576, 256000, 4096), "Nemotron 22B (NeMo launcher)"),
    "nemotron-340b": (
        NemotronConfig(96, 18432, 96, 8, 73728, 256000, 4096),
        "Nemotron-4 340B (NVIDIA 2024)",
    ),
}


def rope_freqs(head_dim: int, percent: int, theta: float) -> tuple[float, ...] | None:
    """``Rope``'s frequencies (pairs ``(i, i + d/2)``) for a rotation of ``percent`` of the
    head's ``head_dim`` channels: the rotated dimension's ``theta^(-2i/rot)`` for its ``rot/2``
    pairs, 0 for the others (module docstring); None when every channel rotates (the op's
    default frequencies)."""
    if percent == 100:
        return None
    rot = head_dim * percent // 100
    return tuple(theta ** (-2.0 * i / rot) if i < rot // 2 else 0.0 for i in range(head_dim // 2))


def layer_norm_1p(f: LayerFn, x: Value, scale: Value, bias: Value, name: str) -> Value:
    """NeMo's LayerNorm1p: LayerNorm by ``1 + scale`` plus ``bias``, one op."""
    return f("LayerNormalization", x, scale, bias, epsilon=EPSILON, zero_centered_gamma=True, name=name)


def block_fn(cfg: NemotronConfig) -> Function:
    hidden, heads, kv_heads = cfg.hidden, cfg.heads, cfg.kv_heads
    head_dim = hidden // heads
    f = LayerFn("block")
    x = f.param("x")
    p = {n: f.param(n) for n in (FUSED_WEIGHTS if cfg.qkv == "fused" else BLOCK_WEIGHTS)}
    h = layer_norm_1p(f, x, p["ln1_scale"], p["ln1_bias"], "ln1")
    q, k, v = project_qkv(f, h, p, cfg.qkv == "fused", heads, kv_heads, head_dim)
    a = attention(
        f,
        q,
        k,
        v,
        heads=heads,
        head_dim=head_dim,
        kv_heads=kv_heads,
        form=cfg.attention,
        rope_theta=cfg.rope_theta,
        rope_halves=True,
        rope_freqs=rope_freqs(head_dim, cfg.rotary_percent, cfg.rope_theta),
    )
    x = f("Add", x, f("MatMul", a, p["wo"], name="o"), name="x_attn")
    h = layer_norm_1p(f, x, p["ln2_scale"], p["ln2_bias"], "ln2")
    act = f("SquaredRelu", f("MatMul", h, p["w1"], name="fc1"), name="sqrelu")
    return f.ret(f("Add", x, f("MatMul", act, p["w2"], name="fc2"), name="x_mlp"))


def block_weights(i: int, cfg: NemotronConfig, dtype: DType) -> tuple[WeightSpec, ...]:
    h = cfg.hidden
    qkv = qkv_weights(i, cfg.hidden, cfg.heads, cfg.kv_heads, dtype, cfg.qkv == "fused")
    return (
        *norm_weights(f"ln1_{{}}_{i}", h, dtype),
        *qkv,
        weight(f"wo_{i}", dtype, (h, h), ROW),
        *norm_weights(f"ln2_{{}}_{i}", h, dtype),
        weight(f"w1_{i}", dtype, (h, cfg.ffn), COL),
        weight(f"w2_{i}", dtype, (cfg.ffn, h), ROW),
    )


def norm_weights(pattern: str, hidden: int, dtype: DType) -> tuple[WeightSpec, WeightSpec]:
    """A LayerNorm1p's scale (zero-centred: stored 0, applied as 1) and bias, replicated."""
    return (
        weight(pattern.format("scale"), dtype, (hidden,), value=0.0),
        weight(pattern.format("bias"), dtype, (hidden,), value=0.0),
    )


def embed_fn() -> Function:
    f = LayerFn("embed")
    ids, table = f.param("ids"), f.param("tok_emb")
    return f.ret(f("Gather", table, ids, axis=0, name="x"))


def head_fn() -> Function:
    f = LayerFn("head")
    x, scale, bias, wlm = f.param("x"), f.param("lnf_scale"), f.param("lnf_bias"), f.param("wlm")
    return f.ret(f("MatMul", layer_norm_1p(f, x, scale, bias, "lnf"), wlm, name="logits"))


def build(cfg: NemotronConfig, batch: int, dtype: DType = DType.f32, name: str = FAMILY) -> Model:
    h, s, v = cfg.hidden, cfg.seq, cfg.vocab
    inputs = (
        InputSpec("ids", tensor(DType.i64, batch, s), high=v),
        InputSpec("labels", tensor(DType.i64, batch, s), high=v),
    )
    block = block_fn(cfg)
    calls = [LayerCall(embed_fn(), (weight("tok_emb", dtype, (v, h), VOCAB),), "x0")]
    calls += [LayerCall(block, block_weights(i, cfg, dtype), f"x{i + 1}") for i in range(cfg.layers)]
    head_w = (*norm_weights("lnf_{}", h, dtype), weight("wlm", dtype, (h, v), COL))
    calls.append(LayerCall(head_fn(), head_w, "logits"))
    return assemble_lm(name, FAMILY, cfg, inputs, calls, v, batch * s)
