"""A transformer's shape as the trainers' model arguments name it (Megatron-LM's, torchtitan's)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A transformer's shape as the trainers' model arguments name it (``None``: not a transformer
    family a trainer ships: the DistIR paper's MLP, TransGAN)."""

    family: str  # gpt or llama
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    seq: int
    vocab: int
    tied: bool  # the output head shares the embedding's weight
    rope_theta: int | None  # Llama's RoPE base; None: learned absolute positions (GPT)
    dropout: float
    norm_eps: float = 1e-5  # the norms' epsilon
    rope_scaling: float | None = None  # Llama 3.1's rope-scaling factor; None: unscaled
