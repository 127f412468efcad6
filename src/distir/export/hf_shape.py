"""Hugging Face configs as the model arguments Megatron-LM and torchtitan build from.

A config of the Llama architecture (``model_type`` llama or mistral) is a ``ModelShape`` of the
llama family when the trainers' Llama is that model: SwiGLU (``hidden_act`` silu), no bias in
the attention and MLP projections, one head size (``head_dim`` absent or hidden / heads),
RMSNorm, rotary positions without scaling or with Llama 3.1's (``rope_type`` llama3 with its low
and high frequency factors 1 and 4 over 8,192 original positions, which Megatron-LM's
``--use-rope-scaling`` implements: only the factor is an argument), and attention over the whole
sequence (no sliding window shorter than it). The sequence is the import's (``hf:PATH:seq=N``,
else the config's context length). Any other config has a reason why not, which the export
states.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from distir.export.shape import ModelShape

LLAMA_TYPES = ("llama", "mistral")
REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
# Llama 3.1's rope scaling as Megatron-LM applies it under --use-rope-scaling (its factor the
# only argument: --rope-scaling-factor)
LLAMA3_SCALING = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


class HFShape(NamedTuple):
    shape: ModelShape | None
    why: str  # why there is no shape ("" when there is)


def hf_shape(text: str) -> HFShape:
    """The ``ModelShape`` of the ``hf:`` model string ``text`` (module docstring), or why not."""
    from distir.frontends.torch_import.hf import read_config
    from distir.frontends.torch_import.source import hf_path

    path, seq = hf_path(text.strip())
    raw = read_config(path)
    length = seq or raw.get("max_position_embeddings")
    why = _unlike_llama(raw, length if isinstance(length, int) else None)
    if why:
        return HFShape(None, f"a {raw.get('model_type')} config {why}")
    heads = int(raw["num_attention_heads"])
    shape = ModelShape(
        family="llama",
        layers=int(raw["num_hidden_layers"]),
        hidden=int(raw["hidden_size"]),
        heads=heads,
        kv_heads=int(raw.get("num_key_value_heads") or heads),
        ffn=int(raw["intermediate_size"]),
        seq=int(length) if isinstance(length, int) else 0,
        vocab=int(raw["vocab_size"]),
        tied=bool(raw.get("tie_word_embeddings", False)),
        rope_theta=int(raw.get("rope_theta", 10000.0)),
        dropout=float(raw.get("attention_dropout", 0.0)),
        norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
        rope_scaling=_scaling_factor(raw.get("rope_scaling")),
    )
    if shape.seq < 1:
        return HFShape(None, "without a sequence length (give hf:PATH:seq=N)")
    return HFShape(shape, "")


def _unlike_llama(raw: dict[str, Any], length: int | None) -> str:
    """Why the config, run over ``length`` positions, is not the trainers' Llama ("" when it is)."""
    if raw.get("model_type") not in LLAMA_TYPES:
        return "(only the Llama architecture's, llama and mistral, map to their arguments)"
    missing = [k for k in REQUIRED if not isinstance(raw.get(k), int)]
    if missing:
        return f"without {', '.join(missing)}"
    if raw.get("hidden_act", "silu") != "silu":
        return f"with hidden_act {raw.get('hidden_act')!r} (their Llama is SwiGLU: silu)"
    if raw.get("attention_bias") or raw.get("mlp_bias"):
        return "with biases in its projections (their Llama has none)"
    head_dim = raw.get("head_dim")
    if head_dim is not None and head_dim * raw["num_attention_heads"] != raw["hidden_size"]:
        return f"with head_dim {head_dim} other than hidden_size / num_attention_heads"
    window = raw.get("sliding_window")
    if isinstance(window, int) and (length is None or window < length):
        return f"with a sliding window of {window} positions, shorter than the sequence"
    scaling = raw.get("rope_scaling")
    if scaling is not None and _scaling_factor(scaling) is None:
        return f"with rope_scaling {scaling!r} (Llama 3.1's llama3 type is the one they implement)"
    return ""


def _scaling_factor(scaling: object) -> float | None:
    """Llama 3.1's rope-scaling factor, or None (no scaling, or another kind)."""
    if not isinstance(scaling, dict):
        return None
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = scaling.get("factor")
    if kind != "llama3" or not isinstance(factor, int | float):
        return None
    if any(scaling.get(k) != v for k, v in LLAMA3_SCALING.items()):
        return None
    return float(factor)
