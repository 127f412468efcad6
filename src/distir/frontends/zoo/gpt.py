"""GPT-2 / GPT-3 style decoder-only transformers.

    func @forward(%ids: i64 (B, S), %labels: i64 (B, S), %wte, %wpe, <block weights>..., %lnf_scale,
                  %lnf_bias, %wlm) {
      %x0 = @embed(%ids, %wte, %wpe)              // Gather(wte, ids) + wpe[0:S] (broadcast Add)
      %x1 = @block(%x0, <16 weights of layer 0>)  // ... one call per layer
      %logits = @head(%xL, %lnf_scale, %lnf_bias, %wlm)   // LayerNorm, MatMul to the vocab
      %loss = @loss(%logits, %labels)             // cross entropy (sum) · 1/(B·S), vocab-parallel
    }

``@block`` is pre-LN: ``x + Attn(LN1(x))`` then ``x + MLP(LN2(x))`` with causal multi-head
attention (``attention.py``: the fused op by default, ``attention=naive`` the explicit form) and
a GELU MLP of width 4·hidden; every projection has a bias. ``dropout=p`` (default 0: no Dropout
op at all) applies Megatron-LM's hidden dropout — the attention output projection's and the MLP's
results each through ``Dropout`` before the residual add, whose bool mask (1 byte per element)
the backward keeps — and passes ``dropout=p`` to the fused ``Attention`` (its FLOPs and memory
do not change: FlashAttention regenerates its mask; the naive form drops the probabilities
with a ``Dropout`` of its own, an S×S mask). Embedding dropout is not modelled.
The output projection ``wlm`` (hidden, vocab) is a weight of its own — *untied* from ``wte`` —
so the parameter count is the published one plus hidden·vocab; ``tied=1`` ties them as GPT-2
does: the head multiplies by ``wte``ᵀ (``Model.tied``; its gradient is the sum of the
embedding's and the head's). GELU is the exact (erf) one of the registry.

Tensor-parallel declarations (Megatron-LM): wq/wk/wv (``qkv=fused``: wqkv, one weight of 3·hidden
columns, per head [q, k, v], and bqkv: ``attention.split_qkv``) and w1 column-parallel ``S(1)``
with their biases ``S(0)``; wo and w2 row-parallel ``S(0)`` with replicated biases; norms and ``wpe``
replicated; Megatron-LM's vocabulary-parallel embedding, head and cross entropy: ``wte`` sharded
on the vocabulary ``S(0)``, ``wlm`` column-parallel ``S(1)``, and the logits reach the loss
sharded on the vocabulary (``Model.loss_input_tp``). The activations between layers are
(batch, seq, hidden): ``seq_dim=1`` (sequence parallelism shards it).

Sizes: ``gpt2-117m`` and ``gpt2-1.6b`` are GPT-2's smallest and largest (Radford et al.,
"Language Models are Unsupervised Multitask Learners", 2019, Table 2: 12×768 and 48×1600,
context 1024, vocabulary 50257; the paper's "117M" counts 124M with tied embeddings);
``gpt2-13b`` and ``gpt2-175b`` are GPT-3 13B and 175B (Brown et al., "Language Models are
Few-Shot Learners", 2020, Table 2.1: 40×5140 → 5120 as commonly trained, 40 heads; 96×12288,
96 heads; context 2048) with GPT-2's vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from distir.frontends.zoo._build import (
    LayerCall,
    LayerFn,
    assemble,
    check_config,
    probability_field,
    tensor,
    weight,
)
from distir.frontends.zoo.attention import attention, attention_field, qkv_field, split_qkv
from distir.frontends.zoo.model import InputSpec, Model, WeightSpec
from distir.ir.dtensor import Placement, Replicate, Shard
from distir.ir.function import Function
from distir.ir.types import DType
from distir.ir.values import Value

FAMILY = "gpt"
R, COL, ROW = Replicate(), Shard(1), Shard(0)
LOSS_FORMS = ("fp32", "fused", "torch", "parallel")
VOCAB = Shard(0)  # an embedding table (vocab, hidden) sharded on the vocabulary
LOGITS = Shard(2)  # the loss layer's input, logits (batch, seq, vocab), sharded on the vocabulary


def loss_field() -> Any:
    """The ``loss`` option of a language model's config: the cross entropy's kernel,
    ``fp32`` (default), ``fused``, ``torch`` or ``parallel`` (``token_loss_fn``); an enumerated
    field."""
    return field(default="fp32", metadata={"choices": LOSS_FORMS})


def loss_input(form: str) -> Placement:
    """``Model.loss_input_tp`` of a ``loss`` option: the logits sharded on the vocabulary, but
    for ``torch`` (whole)."""
    return R if form == "torch" else LOGITS


def loss_dtype(form: str) -> DType | None:
    """``Model.loss_dtype`` of a ``loss`` option: fused computes in fp32 by itself."""
    return DType.f32 if form == "fused" else None


@dataclass(frozen=True)
class GPTConfig:
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int = 50257
    attention: str = attention_field()
    tied: bool = False  # GPT-2's tied embedding: the head multiplies by wteᵀ (``tied=1``)
    dropout: float = probability_field()  # hidden and attention dropout (``dropout=0.1``)
    loss: str = loss_field()  # the cross entropy's kernel: fp32 (default), fused, torch or parallel
    # llm-foundry's flash attention: q, k, v unpadded and the output padded around the kernel
    # (``unpad=1``; ``attention.py``)
    unpad: bool = False
    # Q, K, V: three GEMMs (split, default) or one of one weight laid out per head (``qkv=fused``)
    qkv: str = qkv_field()

    def __post_init__(self) -> None:
        check_config(FAMILY, self, divides=[("heads", "hidden")])


ZOO: dict[str, tuple[GPTConfig, str]] = {
    "gpt2-117m": (GPTConfig(12, 768, 12, 1024), "GPT-2 small (Radford et al. 2019)"),
    "gpt2-1.6b": (GPTConfig(48, 1600, 25, 1024), "GPT-2 XL (Radford et al. 2019)"),
    "gpt2-13b": (GPTConfig(40, 5120, 40, 2048), "GPT-3 13B (Brown et al. 2020)"),
    "gpt2-175b": (GPTConfig(96, 12288, 96, 2048), "GPT-3 175B (Brown et al. 2020)"),
}

# @block's parameters after the activation, in order (``qkv=fused``: ``QKV_FUSED`` for the six
# of ``QKV_SPLIT``)
QKV_SPLIT = ("wq", "bq", "wk", "bk", "wv", "bv")
QKV_FUSED = ("wqkv", "bqkv")
BLOCK_WEIGHTS = (
    "ln1_scale",
    "ln1_bias",
    *QKV_SPLIT,
    "wo",
    "bo",
    "ln2_scale",
    "ln2_bias",
    "w1",
    "b1",
    "w2",
    "b2",
)


def weight_names(qkv: str) -> tuple[str, ...]:
    """@block's weights, in order, for the model's ``qkv`` option."""
    if qkv == "split":
        return BLOCK_WEIGHTS
    return (*BLOCK_WEIGHTS[:2], *QKV_FUSED, *BLOCK_WEIGHTS[2 + len(QKV_SPLIT) :])


def linear(f: LayerFn, x: Value, w: Value, b: Value, name: str) -> Value:
    return f("Add", f("MatMul", x, w, name=f"{name}_xw"), b, name=name)


def dropout(f: LayerFn, x: Value, p: float, name: str) -> Value:
    """``x`` through Dropout (its mask a value of the program, 1 byte per element), or ``x``
    itself when ``p`` is 0."""
    if p <= 0.0:
        return x
    y, _ = f.results("Dropout", x, names=(name, f"{name}_mask"), p=p)
    return y


def block_fn(
    name: str,
    hidden: int,
    heads: int,
    causal: bool = True,
    attention_form: str = "fused",
    p_drop: float = 0.0,
    unpad: bool = False,
    qkv: str = "split",
) -> Function:
    """The pre-LN transformer block; ``attention_form`` is the model's ``attention`` option,
    ``p_drop`` its ``dropout``: as Megatron-LM, the output projection's and the MLP's results
    go through Dropout before each residual add (bias+dropout+add, one fused kernel), and the
    attention drops probabilities with the same p; ``unpad`` the model's ``unpad`` option,
    ``qkv`` its ``qkv`` (``fused``: one projection ``wqkv``, ``bqkv``, split by ``split_qkv``)."""
    f = LayerFn(name)
    x = f.param("x")
    p = {n: f.param(n) for n in weight_names(qkv)}
    h = f("LayerNormalization", x, p["ln1_scale"], p["ln1_bias"], name="ln1")
    if qkv == "fused":
        q, k, v = split_qkv(f, linear(f, h, p["wqkv"], p["bqkv"], "qkv"), heads, heads, hidden // heads)
    else:
        q = linear(f, h, p["wq"], p["bq"], "q")
        k = linear(f, h, p["wk"], p["bk"], "k")
        v = linear(f, h, p["wv"], p["bv"], "v")
    a = attention(
        f,
        q,
        k,
        v,
        heads=heads,
        head_dim=hidden // heads,
        causal=causal,
        form=attention_form,
        dropout=p_drop,
        unpad=unpad,
    )
    x = f("Add", x, dropout(f, linear(f, a, p["wo"], p["bo"], "o"), p_drop, "o_drop"), name="x_attn")
    h = f("LayerNormalization", x, p["ln2_scale"], p["ln2_bias"], name="ln2")
    m = f("Gelu", linear(f, h, p["w1"], p["b1"], "fc1"), name="gelu")
    return f.ret(
        f("Add", x, dropout(f, linear(f, m, p["w2"], p["b2"], "fc2"), p_drop, "fc2_drop"), name="x_mlp")
    )


def block_weights(
    i: int, hidden: int, dtype: DType, std: float = 0.02, qkv: str = "split"
) -> tuple[WeightSpec, ...]:
    """Layer ``i``'s weights in ``@block``'s parameter order, with their TP placements (``qkv``:
    the model's option; the fused weight is column-parallel too, over whole heads)."""
    h, ff = hidden, 4 * hidden
    shapes: dict[str, tuple[tuple[int, ...], Placement, float | None]] = {
        "ln1_scale": ((h,), R, 1.0),
        "ln1_bias": ((h,), R, 0.0),
        "wq": ((h, h), COL, None),
        "bq": ((h,), ROW, 0.0),
        "wk": ((h, h), COL, None),
        "bk": ((h,), ROW, 0.0),
        "wv": ((h, h), COL, None),
        "bv": ((h,), ROW, 0.0),
        "wqkv": ((h, 3 * h), COL, None),
        "bqkv": ((3 * h,), ROW, 0.0),
        "wo": ((h, h), ROW, None),
        "bo": ((h,), R, 0.0),
        "ln2_scale": ((h,), R, 1.0),
        "ln2_bias": ((h,), R, 0.0),
        "w1": ((h, ff), COL, None),
        "b1": ((ff,), ROW, 0.0),
        "w2": ((ff, h), ROW, None),
        "b2": ((h,), R, 0.0),
    }
    specs = ((n, *shapes[n]) for n in weight_names(qkv))
    return tuple(weight(f"{n}_{i}", dtype, shape, tp, std=std, value=value) for n, shape, tp, value in specs)


def embed_fn(seq: int) -> Function:
    f = LayerFn("embed")
    ids, wte, wpe = f.param("ids"), f.param("wte"), f.param("wpe")
    tok = f("Gather", wte, ids, axis=0, name="tok")  # (B, S, H)
    pos = f("Slice", wpe, starts=(0,), ends=(seq,), axes=(0,), name="pos")  # (S, H)
    return f.ret(f("Add", tok, pos, name="x"))


def head_fn() -> Function:
    f = LayerFn("head")
    x, scale, bias, wlm = f.param("x"), f.param("lnf_scale"), f.param("lnf_bias"), f.param("wlm")
    h = f("LayerNormalization", x, scale, bias, name="lnf")
    return f.ret(f("MatMul", h, wlm, name="logits"))


def tied_head_fn() -> Function:
    """The head of a tied model: LayerNorm, then the logits from the token embedding ``wte``
    (vocab, hidden) read transposed (``transB``: a GEMM flag, as Megatron-LM's
    ``F.linear(h, wte)``, not a copy) — sharded on the vocabulary, it gives logits sharded alike."""
    f = LayerFn("head")
    x, scale, bias, wte = f.param("x"), f.param("lnf_scale"), f.param("lnf_bias"), f.param("wte")
    h = f("LayerNormalization", x, scale, bias, name="lnf")
    return f.ret(f("MatMul", h, wte, transB=1, name="logits"))


def token_loss_fn(vocab: int, normalizer: int, form: str = "fp32") -> Function:
    """``@loss(logits (B, S, V), labels (B, S))``: the summed cross entropy of the B·S tokens,
    scaled by ``1/normalizer``, written as Megatron-LM's vocabulary-parallel cross entropy so that
    logits sharded on the vocabulary stay sharded: with the row max as a shift (a constant for
    the gradient), ``nll = log Σ exp(logits − max) − (logits[label] − max)``. Sharded on V, the
    max, the sum of exponentials and the picked logit are pending reductions of B·S numbers
    (AllReduce max, sum, sum), never the logits; the gradient (softmax − one-hot, scaled) is
    computed on each device's piece. Replicated, it is the same cross entropy.

    ``form`` is the model's ``loss`` option (``loss_field``): ``fp32`` computes in the logits'
    dtype, which mixed precision makes fp32 by casting the logits first (``with_fp32_loss``, as
    Megatron-LM and torchtitan do); ``fused`` reads the logits in their own dtype and
    accumulates in fp32 inside (``SoftmaxCrossEntropyParts(acc=f32)``: flash-attn's fused cross
    entropy, llm-foundry's default), so no fp32 copy of the logits exists and their gradient
    comes back in the compute dtype; ``torch`` is ``F.cross_entropy`` on the fp32 logits as
    torchtitan (without loss parallelism) and Hugging Face models run it — ``LogSoftmax``, whose
    fp32 output is saved, then ``NegativeLogLikelihoodLoss``, whose gradient is dense — and,
    having no vocabulary-parallel form, takes the logits whole (``loss_input``); ``parallel`` is
    ``F.cross_entropy`` under torch's ``loss_parallel`` (``parallel_loss_fn``), as torchtitan runs
    it with tensor parallelism: the fp32 logits stay sharded on the vocabulary."""
    if form == "parallel":
        return parallel_loss_fn(vocab, normalizer)
    if form == "torch":
        f = LayerFn("loss")
        logits, labels = f.param("logits"), f.param("labels")
        scores = f("Reshape", logits, shape=(-1, vocab), name="scores")
        targets = f("Reshape", labels, shape=(-1,), name="targets")
        logp = f("LogSoftmax", scores, axis=1, name="logp")
        total = f("NegativeLogLikelihoodLoss", logp, targets, reduction="sum", name="total")
        return f.ret(f("Scale", total, alpha=1.0 / normalizer, name="loss"))
    f = LayerFn("loss")
    logits, labels = f.param("logits"), f.param("labels")
    scores = f("Reshape", logits, shape=(-1, vocab), name="scores")  # (B·S, V)
    targets = f("Reshape", labels, shape=(-1,), name="targets")  # (B·S,)
    peak = f("StopGradient", f("ReduceMax", scores, axes=(1,), keepdims=0, name="max"), name="shift")
    acc = {"acc": DType.f32} if form == "fused" else {}
    sumexp, picked = f.results(
        "SoftmaxCrossEntropyParts", scores, peak, targets, names=("sumexp", "picked"), **acc
    )
    nll = f("Sub", f("Log", sumexp, name="lse"), picked, name="nll")
    total = f("ReduceSum", nll, keepdims=0, name="total")
    return f.ret(f("Scale", total, alpha=1.0 / normalizer, name="loss"))


def parallel_loss_fn(vocab: int, normalizer: int) -> Function:
    """The ``parallel`` loss form: ``F.cross_entropy`` on the fp32 logits under
    ``torch.distributed.tensor.parallel.loss_parallel()`` (torch/distributed/tensor/parallel/
    loss.py), op by op. ``_log_softmax``: the row max (``amax``; sharded on V, a pending max:
    one all-reduce of B·S numbers), ``shifted = x − max``, ``exp(shifted)`` summed (a pending
    sum, an all-reduce), its log, ``shifted − logsumexp``: the log-probabilities, the one tensor
    the backward keeps. ``_nll_loss_forward``: the label's log-probability gathered through a
    masked partial and all-reduced (``NllLossParts``, a pending sum). The backward is torch's
    fused one (``NllLossPartsGrad``): the log-softmax's normalizer enters it as a constant
    (``StopGradient``), so the subtractions pass the gradient through unchanged, as torch's
    ``_log_softmax_backward_handler`` returns it as it comes."""
    f = LayerFn("loss")
    # on (B, S, V) rows as they come: torch flattens (B, S) into a view of each rank's own rows,
    # which in the global program would merge dims that data and context parallelism both shard
    scores, targets = f.param("logits"), f.param("labels")
    peak = f("StopGradient", f("ReduceMax", scores, axes=(-1,), keepdims=1, name="max"), name="shift")
    shifted = f("Sub", scores, peak, name="shifted")
    sumexp = f("ReduceSum", f("Exp", shifted, name="exp"), axes=(-1,), keepdims=1, name="sumexp")
    # the normalizer a constant for the gradient: nothing of it is saved for the backward
    lse = f("StopGradient", f("Log", sumexp, name="logsum"), name="lse")
    logp = f("Sub", shifted, lse, name="logp")
    nll = f("NllLossParts", logp, targets, name="nll")
    total = f("ReduceSum", nll, keepdims=0, name="total")
    return f.ret(f("Scale", total, alpha=1.0 / normalizer, name="loss"))


def build(cfg: GPTConfig, batch: int, dtype: DType = DType.f32, name: str = FAMILY) -> Model:
    h, s, v = cfg.hidden, cfg.seq, cfg.vocab
    inputs = (
        InputSpec("ids", tensor(DType.i64, batch, s), high=v),
        InputSpec("labels", tensor(DType.i64, batch, s), high=v),
    )
    block = block_fn(
        "block", h, cfg.heads, attention_form=cfg.attention, p_drop=cfg.dropout, unpad=cfg.unpad, qkv=cfg.qkv
    )
    wte = weight("wte", dtype, (v, h), VOCAB)
    calls = [LayerCall(embed_fn(s), (wte, weight("wpe", dtype, (s, h))), "x0")]
    for i in range(cfg.layers):
        calls.append(LayerCall(block, block_weights(i, h, dtype, qkv=cfg.qkv), f"x{i + 1}"))
    lnf = (weight("lnf_scale", dtype, (h,), value=1.0), weight("lnf_bias", dtype, (h,), value=0.0))
    if cfg.tied:  # the same spec again: the weight is tied (``Model.tied``)
        calls.append(LayerCall(tied_head_fn(), (*lnf, wte), "logits"))
    else:
        calls.append(LayerCall(head_fn(), (*lnf, weight("wlm", dtype, (h, v), COL)), "logits"))
    return assemble_lm(name, FAMILY, cfg, inputs, calls, v, batch * s)


def assemble_lm(
    name: str,
    family: str,
    cfg: Any,
    inputs: Sequence[InputSpec],
    calls: Sequence[LayerCall],
    vocab: int,
    tokens: int,
) -> Model:
    """A language model's layer calls (embedding, blocks, head) followed by the token loss in the
    config's ``loss`` form (normalized by the global batch's ``tokens``), assembled: activations
    (batch, seq, hidden), the embedding with the first chunk, head and loss with the last."""
    loss = LayerCall(token_loss_fn(vocab, tokens, cfg.loss), ("labels",), "loss")
    return assemble(
        name,
        {"family": family, **asdict(cfg)},
        inputs,
        [*calls, loss],
        seq_dim=1,
        ends=(1, 2),
        loss_input_tp=loss_input(cfg.loss),
        loss_dtype=loss_dtype(cfg.loss),
    )
