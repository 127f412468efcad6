"""``transgan-hetero``: the TransGAN generator of AMP's heterogeneous-model experiment.

AMP (Li et al., "AMP: Automatically Finding Model Parallel Strategies with Heterogeneity
Awareness", NeurIPS 2022) trains a TransGAN generator to show that uneven layers call for uneven
pipeline stages. This module follows the generator AMP ran, read from its public repository:

- github:DachengLi1/AMP at commit 72eeea45518d88997dd33c0db4a885a7eeec1d15, under
  ``DeepSpeed/DeepSpeedExamples/Megatron-LM-v1.1.5-3D_parallelism/``:
  ``megatron/model/trans_gan_gen.py`` (``ParallelTransGANGeneratorPipe``: the layer list DeepSpeed
  pipelines; ``ParallelTransformerBlock``, ``ParallelTransGanAttention``, ``ParallelTransGANMlp``,
  ``PixelNorm``, ``pixel_upsample``, ``bicubic_upsample``, ``window_partition``),
  ``examples/ds_pretrain_transgan_pipe.sh`` (the run's arguments: ``--bottom_width 9``,
  ``--g_window_size 18``, ``--g_depth 12,0,0,0,0,12``, ``--latent_dim 512``, ``--g_norm pn``,
  ``--gf_dim $NHIDDEN``), ``megatron/arguments.py`` (defaults: ``--g_mlp 4``, ``--g_act gelu``);
  ``src/het_model.py`` (the experiment: ``hidden_size`` 1024 — passed as NHIDDEN —,
  ``depth [12,0,0,0,0,12]``, ``bottom 9``, global batch 64 on 4 × 4 GPUs); the generator's
  ``num_heads`` is its constructor default, 4.
- github:VITA-Group/TransGAN at commit 6b85440ca56716fd7a60bac964466cc0296ce663,
  ``models_search/ViT_custom_local544444_256_rp_noise.py``: the original the AMP file adapts
  (same stages; it upsamples the first stages bicubically, AMP's copy with nearest neighbours).

The generator, with C = ``dim`` and b = ``bottom``::

    stage  resolution  tokens/sample  width  depth  attention
      1        b        b² = 81        C      12    global (81 tokens)
      2        2b       324            C       0
      3        4b       1296           C       0
      4        8b       5184           C/4     0
      5        16b      20736          C/16    0
      6        32b      82944          C/64   12    windows of window² = 324 tokens (256 per image)

    func @forward(%z: (B, latent), <weights>...) {
      %h0 = @stem(%z, %l1_w, %l1_b, %pos_1)   // Linear latent → b²·C, view (B, b², C), + pos_1
      %h1 ... %h12 = @block_1(...)            // 12 blocks of width C on b² tokens
      %u  = @up_6(%h12, %pos_2, ..., %pos_6)  // the five upsamplings (each + its position
                                              // embedding), then the window partition
      %h13 ... %h24 = @block_6(...)           // 12 blocks of width C/64 on (B·nW, window², C/64)
      %img = @to_rgb(%h24, %rgb_w, %rgb_b)    // window reverse, 1×1 conv C/64 → 3: (B, (32b)², 3)
      %loss = @loss(%img)                     // mean of the image (AMP's DummyGenLoss)
    }

Upsampling: stages 1→2→3 double the resolution by nearest-neighbour interpolation at a fixed
width (AMP's ``bicubic_upsample`` calls ``interpolate(scale_factor=2)`` with the default mode,
nearest): a broadcast (``Expand``) of each token to a 2×2 block; stages 3→4→5→6 by pixel shuffle
(width/4, resolution×2): one ``Transpose`` of the tokens' (C/4, 2, 2) channel split into the grid.
A transition through empty stages (depth 0, as stages 2–5 here) is one layer (``@up_k``, k the
next stage with blocks), since there is no block to cut between; a stage with blocks gets its own
``@block_k`` function. Window attention (stages 4–6, when the window is smaller than the grid):
the transition partitions the (B, H·W, C) tokens into (B·nW, window², C) windows (a reshape, a
``Transpose`` and a reshape), the blocks attend within their rows, and the next transition (or
``@to_rgb``) reverses it; windows of the whole grid are global attention.

Blocks (``ParallelTransformerBlock``): ``x + Attn(PixelNorm(x))`` then ``x + MLP(PixelNorm(x))``;
PixelNorm is ``x / sqrt(mean(x², channels) + 1e-8)``, without parameters, written as its
separate ops as PyTorch runs it (without the 1e-8: ``pixel_norm``); attention is non-causal
multi-head (``attention.py``) with a bias on q/k/v (Megatron's ColumnParallelLinear adds it)
and none on the output projection; the MLP is GELU of width ``mlp``·width without biases. (The
repository builds the output projection and both MLP layers with ``skip_bias_add=True`` and
discards the biases they return: those biases are allocated but never change the output, so
they are left out here; ``tests/frontends/test_zoo.py`` counts the repository's parameters and
what is left out.) Tensor-parallel declarations are Megatron's: wq/wk/wv and w1 column-parallel
``S(1)`` (q/k/v biases ``S(0)``), wo and w2 row-parallel ``S(0)``; the stem, the position
embeddings and ``@to_rgb`` replicated (nn.Linear / nn.Parameter / nn.Conv2d in the repository).
The activations change rank and meaning between layers (the latent, tokens, windows), so the
model declares no sequence dim (``seq_dim=None``: no sequence parallelism; AMP's Megatron v1.1.5
has none).

Left out, each small next to the blocks and stated here so the difference is known:
- the relative position bias of every attention (a ((2w−1)², heads) table gathered into
  (heads, w², w²) and added to the scores: 1,156 parameters per stage-1 block, 4,900 per stage-6
  block, and one more elementwise pass over the scores) — the zoo's layer functions carry no
  constant index tensors;
- the per-token noise injection before each attention (``x + randn(B, N, 1)·noise_strength``,
  a scalar parameter initialized to 0): no random op in the registry;
- the window partition/reverse pair the repository runs around the empty stages 4 and 5 (two
  copies that cancel); the ``(x, mask)`` tuples DeepSpeed passes along; the discriminator, which
  AMP's pipeline does not run (its loss is ``mean(generator output)``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import NamedTuple

from distir.frontends.zoo._build import LayerCall, LayerFn, assemble, check_config, tensor, weight
from distir.frontends.zoo.attention import attention, attention_field
from distir.frontends.zoo.model import InputSpec, Model, ModelError, WeightSpec
from distir.ir.dtensor import Placement, Replicate, Shard
from distir.ir.function import Function
from distir.ir.types import DType
from distir.ir.values import Value

FAMILY = "transgan"
R, COL, ROW = Replicate(), Shard(1), Shard(0)


class Upsample(NamedTuple):
    """How the generator enters a stage from the previous one."""

    kind: str  # "nearest": ×2 resolution, same width; "pixel_shuffle": ×2 resolution, width / 4
    width_div: int  # the stage's width is dim // width_div


# stages 2..6 of the repository's generator (stage 1 comes from the stem)
UPSAMPLES = (
    Upsample("nearest", 1),
    Upsample("nearest", 1),
    Upsample("pixel_shuffle", 4),
    Upsample("pixel_shuffle", 16),
    Upsample("pixel_shuffle", 64),
)
STAGES = 1 + len(UPSAMPLES)
WINDOWED_FROM = 4  # stages 4..6 attend within windows (1..3 over the whole grid)


@dataclass(frozen=True)
class TransGANConfig:
    """AMP's experiment by default; ``wide_layers`` / ``narrow_layers`` are the depths of stages
    1 and 6 (``--g_depth 12,0,0,0,0,12``: stages 2–5 are empty)."""

    wide_layers: int = 12
    narrow_layers: int = 12
    dim: int = 1024  # gf_dim: stage 1's width
    bottom: int = 9  # bottom_width: stage 1's resolution
    window: int = 18  # g_window_size
    latent: int = 512  # latent_dim
    heads: int = 4
    mlp: int = 4  # g_mlp: the MLP's width / the block's width
    attention: str = attention_field()

    def __post_init__(self) -> None:
        check_config(FAMILY, self)
        if self.dim % 64:
            raise ModelError(f"{FAMILY}: dim={self.dim} must be a multiple of 64 (stage 6 has width dim/64)")
        if self.narrow % self.heads:
            raise ModelError(f"{FAMILY}: heads={self.heads} must divide narrow={self.narrow} (stage 6)")
        last = self.resolution(STAGES)
        if last % self.window:
            raise ModelError(f"{FAMILY}: window={self.window} must divide stage 6's resolution {last}")

    @property
    def layers(self) -> int:
        return self.wide_layers + self.narrow_layers

    @property
    def hidden(self) -> int:
        return self.dim

    @property
    def narrow(self) -> int:
        return self.width(STAGES)

    def depth(self, stage: int) -> int:
        return {1: self.wide_layers, STAGES: self.narrow_layers}.get(stage, 0)

    def width(self, stage: int) -> int:
        return self.dim if stage == 1 else self.dim // UPSAMPLES[stage - 2].width_div

    def resolution(self, stage: int) -> int:
        return self.bottom << (stage - 1)

    def tokens(self, stage: int) -> int:
        """Tokens per sample (resolution²)."""
        return self.resolution(stage) ** 2

    def window_of(self, stage: int) -> int | None:
        """The attention window's side, or None for attention over the whole grid."""
        res = self.resolution(stage)
        return self.window if stage >= WINDOWED_FROM and self.window < res else None


ZOO: dict[str, tuple[TransGANConfig, str]] = {
    "transgan-hetero": (
        TransGANConfig(),
        "TransGAN generator of AMP's heterogeneous-model experiment (Li et al. 2022; github:DachengLi1/AMP)",
    ),
}

# a block's parameters after the activation, in order
BLOCK_WEIGHTS = ("wq", "bq", "wk", "bk", "wv", "bv", "wo", "w1", "w2")


def pixel_norm(f: LayerFn, x: Value, name: str) -> Value:
    """``x / sqrt(mean(x², last dim))`` as PyTorch runs ``PixelNorm``: separate ops. (The
    repository adds 1e-8 under the root; no differentiable op adds a constant without a
    constant tensor, and the term only matters for an all-zero token.)"""
    ms = f("ReduceMean", f("Mul", x, x, name=f"{name}_sq"), axes=(-1,), keepdims=1, name=f"{name}_ms")
    return f("Div", x, f("Sqrt", ms, name=f"{name}_rms"), name=name)


def block_fn(name: str, width: int, heads: int, form: str = "fused") -> Function:
    """A generator block on (rows, tokens, width): rows are samples (global attention) or
    windows (window attention), the tokens of a row attend to each other; ``form``: the
    attention's (``fused`` or ``naive``, ``attention.py``)."""
    f = LayerFn(name)
    x = f.param("x")
    p = {n: f.param(n) for n in BLOCK_WEIGHTS}
    h = pixel_norm(f, x, "norm1")
    q, k, v = (f("Add", f("MatMul", h, p[f"w{c}"], name=f"{c}_xw"), p[f"b{c}"], name=c) for c in "qkv")
    a = attention(f, q, k, v, heads=heads, head_dim=width // heads, causal=False, form=form)
    x = f("Add", x, f("MatMul", a, p["wo"], name="o"), name="x_attn")
    h = pixel_norm(f, x, "norm2")
    m = f("Gelu", f("MatMul", h, p["w1"], name="fc1"), name="gelu")
    return f.ret(f("Add", x, f("MatMul", m, p["w2"], name="fc2"), name="x_mlp"))


def block_weights(i: int, width: int, mlp: int, dtype: DType) -> tuple[WeightSpec, ...]:
    """Block ``i``'s weights in ``block_fn``'s parameter order, with their TP placements."""
    h, ff = width, mlp * width
    shapes: dict[str, tuple[tuple[int, ...], Placement, float | None]] = {
        "wq": ((h, h), COL, None),
        "bq": ((h,), ROW, 0.0),
        "wk": ((h, h), COL, None),
        "bk": ((h,), ROW, 0.0),
        "wv": ((h, h), COL, None),
        "bv": ((h,), ROW, 0.0),
        "wo": ((h, h), ROW, None),
        "w1": ((h, ff), COL, None),
        "w2": ((ff, h), ROW, None),
    }
    return tuple(weight(f"{n}_{i}", dtype, s, tp, value=value) for n, (s, tp, value) in shapes.items())


def stem_fn(cfg: TransGANConfig) -> Function:
    """``Linear(latent → b²·C)`` viewed as (B, b², C), plus stage 1's position embedding."""
    f = LayerFn("stem")
    z, w, b, pos = f.param("z"), f.param("l1_w"), f.param("l1_b"), f.param("pos_1")
    h = f("Add", f("MatMul", z, w, name="l1_xw"), b, name="l1")
    x = f("Reshape", h, shape=(-1, cfg.tokens(1), cfg.dim), name="tokens")
    return f.ret(f("Add", x, pos, name="x"))


def upsample(f: LayerFn, x: Value, cfg: TransGANConfig, stage: int) -> Value:
    """(B, tokens(stage-1), width(stage-1)) → (B, tokens(stage), width(stage)) by the
    repository's upsampling into ``stage``."""
    res, c = cfg.resolution(stage - 1), cfg.width(stage - 1)
    n = 4 * res * res
    if UPSAMPLES[stage - 2].kind == "nearest":  # each token copied to a 2×2 block
        grid = f("Reshape", x, shape=(-1, res, 1, res, 1, c), name=f"grid_{stage}")
        big = f("Expand", grid, shape=(1, 1, 2, 1, 2, 1), name=f"nearest_{stage}")
        return f("Reshape", big, shape=(-1, n, c), name=f"up_{stage}")
    # pixel shuffle: channel c'·4 + 2i + j of token (h, w) → channel c' of token (2h+i, 2w+j)
    split = f("Reshape", x, shape=(-1, res, res, c // 4, 2, 2), name=f"grid_{stage}")
    moved = f("Transpose", split, perm=(0, 1, 4, 2, 5, 3), name=f"shuffle_{stage}")
    return f("Reshape", moved, shape=(-1, n, c // 4), name=f"up_{stage}")


def window_partition(f: LayerFn, x: Value, res: int, win: int, c: int) -> Value:
    """(B, res², C) → (B·nW, win², C), windows in row-major order (``window_partition``)."""
    nw = res // win
    grid = f("Reshape", x, shape=(-1, nw, win, nw, win, c), name="wgrid")
    wins = f("Transpose", grid, perm=(0, 1, 3, 2, 4, 5), name="wperm")
    return f("Reshape", wins, shape=(-1, win * win, c), name="windows")


def window_reverse(f: LayerFn, x: Value, res: int, win: int, c: int) -> Value:
    """(B·nW, win², C) → (B, res², C) (``window_reverse``)."""
    nw = res // win
    grid = f("Reshape", x, shape=(-1, nw, nw, win, win, c), name="rgrid")
    back = f("Transpose", grid, perm=(0, 1, 3, 2, 4, 5), name="rperm")
    return f("Reshape", back, shape=(-1, res * res, c), name="image")


def unwindow(f: LayerFn, x: Value, cfg: TransGANConfig, stage: int) -> Value:
    win = cfg.window_of(stage)
    return x if win is None else window_reverse(f, x, cfg.resolution(stage), win, cfg.width(stage))


def up_fn(cfg: TransGANConfig, src: int, dst: int) -> Function:
    """From stage ``src``'s blocks to stage ``dst``'s: reverse ``src``'s windows, upsample and add
    the position embedding of every stage up to ``dst``, partition ``dst``'s windows."""
    f = LayerFn(f"up_{dst}")
    x = unwindow(f, f.param("x"), cfg, src)
    pos = [f.param(f"pos_{k}") for k in range(src + 1, dst + 1)]
    for k, p in zip(range(src + 1, dst + 1), pos, strict=True):
        x = f("Add", upsample(f, x, cfg, k), p, name=f"x_{k}")
    win = cfg.window_of(dst)
    if win is not None:
        x = window_partition(f, x, cfg.resolution(dst), win, cfg.width(dst))
    return f.ret(x)


def to_rgb_fn(cfg: TransGANConfig, last: int) -> Function:
    """The last stage's tokens as an image, then ``Conv2d(width, 3, 1)`` (a per-token linear map):
    (B, resolution², 3)."""
    f = LayerFn("to_rgb")
    x, w, b = f.param("x"), f.param("rgb_w"), f.param("rgb_b")
    img = unwindow(f, x, cfg, last)
    return f.ret(f("Add", f("MatMul", img, w, name="rgb_xw"), b, name="rgb"))


def mean_loss_fn(normalizer: int) -> Function:
    """``DummyGenLoss``: the mean of the generated image, as a sum scaled by ``1/normalizer``."""
    f = LayerFn("loss")
    img = f.param("img")
    total = f("ReduceSum", img, keepdims=0, name="total")
    return f.ret(f("Scale", total, alpha=1.0 / normalizer, name="loss"))


def pos_weight(cfg: TransGANConfig, stage: int, dtype: DType) -> WeightSpec:
    return weight(f"pos_{stage}", dtype, (cfg.tokens(stage), cfg.width(stage)))


def build(cfg: TransGANConfig, batch: int, dtype: DType = DType.f32, name: str = FAMILY) -> Model:
    inputs = (InputSpec("z", tensor(dtype, batch, cfg.latent)),)
    stem_w = (
        weight("l1_w", dtype, (cfg.latent, cfg.tokens(1) * cfg.dim), std=1.0 / math.sqrt(cfg.latent)),
        weight("l1_b", dtype, (cfg.tokens(1) * cfg.dim,), value=0.0),
        pos_weight(cfg, 1, dtype),
    )
    calls = [LayerCall(stem_fn(cfg), stem_w, "h0")]
    prev, i = 1, 0  # the last stage with blocks so far; block index across stages
    for stage in range(1, STAGES + 1):
        if not cfg.depth(stage):
            continue
        if stage > prev:
            pos = tuple(pos_weight(cfg, k, dtype) for k in range(prev + 1, stage + 1))
            calls.append(LayerCall(up_fn(cfg, prev, stage), pos, f"u{stage}"))
            prev = stage
        fn = block_fn(f"block_{stage}", cfg.width(stage), cfg.heads, cfg.attention)
        for _ in range(cfg.depth(stage)):
            calls.append(LayerCall(fn, block_weights(i, cfg.width(stage), cfg.mlp, dtype), f"h{i + 1}"))
            i += 1
    c = cfg.width(STAGES)
    rgb_w = (
        weight("rgb_w", dtype, (c, 3), std=1.0 / math.sqrt(c)),
        weight("rgb_b", dtype, (3,), value=0.0),
    )
    calls.append(LayerCall(to_rgb_fn(cfg, STAGES), rgb_w, "img"))
    calls.append(LayerCall(mean_loss_fn(batch * cfg.tokens(STAGES) * 3), (), "loss"))
    return assemble(name, {"family": FAMILY, **asdict(cfg)}, inputs, calls, ends=(1, 2))
