"""``transgan-hetero``: the uneven (heterogeneous-layer) model of AMP's evaluation.

AMP (Li et al., "AMP: Automatically Finding Model Parallel Strategies with Heterogeneity
Awareness", NeurIPS 2022) uses a TransGAN generator to show that uneven layers call for uneven
pipeline stages: layers of very different cost. This model keeps exactly that property:

    func @forward(%x: (B, tokens, wide), %y: (B, tokens, narrow), <weights>...) {
      %h1 ... %h12  = @wide_block(...)       // 12 pre-LN transformer blocks of hidden 1024
      %p            = @proj(%h12, %proj_w, %proj_b)   // Linear wide → narrow
      %h13 ... %h24 = @narrow_block(...)     // 12 blocks of hidden 16
      %loss         = @loss(%h24, %y)        // MSELoss(sum) · 1/(B·tokens·narrow)
    }

The blocks are GPT's (``gpt.block_fn``: LayerNorm, multi-head attention, GELU MLP of 4·hidden,
residuals, biases) but *non-causal*, as in a generator; heads = 4 in both halves (TransGAN's).
Weights of block ``i`` are named ``<name>_i`` with i = 0..23 across both halves; tensor-parallel
declarations are GPT's; the projection is replicated; activations are (B, tokens, width):
``seq_dim=1``.

Simplified with respect to TransGAN's generator: no noise-to-tokens MLP at the input (the input
is already a (B, tokens, wide) tensor, TransGAN's 8×8 = 64 tokens of its first stage), no
upsampling (pixel shuffle) between stages — the width change is one linear projection at a
fixed token count — no grid or window attention, no learned position embeddings, no
discriminator and no adversarial loss: an MSE loss against a target tensor stands in for it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from distir.frontends.zoo._build import LayerCall, LayerFn, assemble, check_config, tensor, weight
from distir.frontends.zoo.attention import attention_field
from distir.frontends.zoo.gpt import block_fn, block_weights, linear
from distir.frontends.zoo.mlp import mse_loss_fn
from distir.frontends.zoo.model import InputSpec, Model
from distir.ir.function import Function
from distir.ir.types import DType

FAMILY = "transgan"


@dataclass(frozen=True)
class TransGANConfig:
    wide_layers: int = 12
    narrow_layers: int = 12
    wide: int = 1024
    narrow: int = 16
    heads: int = 4
    tokens: int = 64
    attention: str = attention_field()

    def __post_init__(self) -> None:
        check_config(FAMILY, self, divides=[("heads", "wide"), ("heads", "narrow")])

    @property
    def layers(self) -> int:
        return self.wide_layers + self.narrow_layers


ZOO: dict[str, tuple[TransGANConfig, str]] = {
    "transgan-hetero": (TransGANConfig(), "AMP's uneven TransGAN-like model (Li et al. 2022)"),
}


def proj_fn() -> Function:
    f = LayerFn("proj")
    x, w, b = f.param("x"), f.param("proj_w"), f.param("proj_b")
    return f.ret(linear(f, x, w, b, "p"))


def build(cfg: TransGANConfig, batch: int, dtype: DType = DType.f32, name: str = FAMILY) -> Model:
    t = cfg.tokens
    inputs = (
        InputSpec("x", tensor(dtype, batch, t, cfg.wide)),
        InputSpec("y", tensor(dtype, batch, t, cfg.narrow)),
    )
    wide = block_fn("wide_block", cfg.wide, cfg.heads, causal=False, attention_form=cfg.attention)
    narrow = block_fn("narrow_block", cfg.narrow, cfg.heads, causal=False, attention_form=cfg.attention)
    calls = [LayerCall(wide, block_weights(i, cfg.wide, dtype), f"h{i + 1}") for i in range(cfg.wide_layers)]
    proj_w = (
        weight("proj_w", dtype, (cfg.wide, cfg.narrow), std=1.0 / math.sqrt(cfg.wide)),
        weight("proj_b", dtype, (cfg.narrow,), value=0.0),
    )
    calls.append(LayerCall(proj_fn(), proj_w, "p"))
    for i in range(cfg.wide_layers, cfg.layers):  # block indices continue across the halves
        calls.append(LayerCall(narrow, block_weights(i, cfg.narrow, dtype), f"h{i + 1}"))
    calls.append(LayerCall(mse_loss_fn(batch * t * cfg.narrow), ("y",), "loss"))
    return assemble(name, {"family": FAMILY, **asdict(cfg)}, inputs, calls, seq_dim=1)
