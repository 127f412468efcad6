"""Hugging Face models from their config: ``hf:PATH`` (a ``config.json`` or a directory holding
one) → the transformers causal-LM built from it with parameters on the meta device (random
init that never happens, no weights read, no network: ``HF_HUB_OFFLINE=1``) and its example
inputs (token ids of shape (2, seq)).

``seq`` is the config's context length (``max_position_embeddings``, GPT-2's ``n_positions``)
unless given (``hf:PATH:seq=2048``).

Attention runs through distir's own attention function (registered with transformers'
``AttentionInterface`` as ``distir``): ``scaled_dot_product_attention`` with ``is_causal`` and
grouped-query heads, no mask tensor — the fused ``Attention`` op of the registry. A model that
does not call the interface (Falcon) runs its ``sdpa`` path, whose causal mask the importer
recognizes; one with neither its eager path (BLOOM's attention written out with ALiBi biases,
which the importer makes one ``Attention``). transformers' warnings are held back while a model
is built and traced (``quiet``). A sliding window shorter than the sequence (Mistral's, the
local layers of Gemma's) and a cap of the attention scores (Gemma 2's softcapping) pass through
the interface as a custom op (``distir::sdpa``), which imports as ``Attention(causal, window,
softcap)``; a model that needs a mask tensor (padding), attention sinks, or a window outside the
interface, fails to import with that reason. Mixture-of-experts configs import when
their blocks are Mixtral's (a top-k router and SwiGLU experts: traced as one ``MoE`` op each,
``moe``); others (a shared expert) are refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from distir.frontends.torch_import.errors import SourceError, first_line
from distir.frontends.torch_import.trace import params_on_meta
from distir.limits import MAX_DIM, MAX_LAYERS, exceeds, over

ATTENTION = "distir"
# config keys of rotary positions (computed for any position: such a model runs past its declared
# context); a model without them reads a learned position table, which has no row past it
ROTARY_KEYS = ("rope_theta", "rope_scaling", "rotary_emb_base")


def config_path(path: str) -> Path:
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise SourceError(f"hf:{path}: no such file (expected a config.json or a directory holding one)")
    return p


def read_config(path: str) -> dict[str, Any]:
    p = config_path(path)
    try:
        raw = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SourceError(f"hf:{path}: {p} is not a JSON config ({e})") from None
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise SourceError(f"hf:{path}: {p} is not a model config (no model_type)")
    _check_sizes(raw, path)
    return raw


# a config's sizes, bounded as a model string's are (``distir.limits``) before transformers builds
# anything: its layers (a loop over them), every width (a table or a tensor per size)
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
SIZE_KEYS = (
    "hidden_size", "n_embd", "intermediate_size", "n_inner", "ffn_dim", "vocab_size",
    "num_attention_heads", "n_head", "num_key_value_heads", "head_dim",
    "max_position_embeddings", "n_positions", "num_local_experts", "num_experts",
)  # fmt: skip


def _check_sizes(raw: dict[str, Any], path: str) -> None:
    """A config's layers (1 to ``MAX_LAYERS``) and sizes (at most ``MAX_DIM``) in bounds, else a
    ``SourceError`` naming the key: 100,000 layers would trace for minutes, a vocabulary of
    10^12 would allocate its table."""
    for keys, bound in ((LAYER_KEYS, MAX_LAYERS), (SIZE_KEYS, MAX_DIM)):
        for key in keys:
            v = raw.get(key)
            if not isinstance(v, int) or isinstance(v, bool):
                continue  # absent, or a type transformers' own validation names
            if exceeds(v, bound):
                raise SourceError(f"hf:{path}: {over(key, v, bound)}")
            if keys is LAYER_KEYS and v < 1:
                raise SourceError(f"hf:{path}: {key}={v}; a model needs at least one block")


def _check_rotary(cfg: Any, path: str) -> None:
    """Rotary positions turn pairs of a head's channels: an odd number of rotated channels (a
    head_dim of 1, or of 4 with a quarter rotated) is a ``SourceError``, as a zoo Llama's is;
    transformers broadcasts one channel against two cosines, or fails."""
    rope = getattr(cfg, "rope_parameters", None)
    rotary_dim = getattr(cfg, "rotary_dim", None)
    if (not isinstance(rope, dict) and rotary_dim is None) or getattr(cfg, "alibi", False):
        return
    head_dim = getattr(cfg, "head_dim", None)
    if not isinstance(head_dim, int):
        hidden, heads = getattr(cfg, "hidden_size", None), getattr(cfg, "num_attention_heads", None)
        if not (isinstance(hidden, int) and isinstance(heads, int) and heads > 0):
            return
        head_dim = hidden // heads
    factor = rope.get("partial_rotary_factor", 1.0) if isinstance(rope, dict) else 1.0
    rotated = rotary_dim if isinstance(rotary_dim, int) else int(head_dim * factor)
    if rotated % 2:
        raise SourceError(
            f"hf:{path}: rotary positions turn pairs of channels, and each head rotates {rotated} of "
            f"its {head_dim}: give a head_dim (hidden size / attention heads) that rotates an even number"
        )


def depth(raw: dict[str, Any]) -> int | None:
    """The number of blocks of a config, when its blocks are all alike (no per-layer
    ``layer_types`` that differ), else None."""
    kinds = raw.get("layer_types")
    if isinstance(kinds, list) and len(set(map(str, kinds))) > 1:
        return None
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        if isinstance(raw.get(key), int):
            return int(raw[key])
    return None


def _attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers' attention interface: q, k, v (B, h, S, d) → (B, S, h, d)."""
    import torch.nn.functional as F

    if attention_mask is not None:
        raise NotImplementedError("an attention mask tensor (padding) is not supported")
    for what, keys in _NOT_TAKEN.items():  # the fused Attention computes none: refused, not dropped
        if any(kwargs.get(k) is not None for k in keys):
            given = ", ".join(k for k in keys if kwargs.get(k) is not None)
            raise NotImplementedError(f"{given}: {what}, which distir's attention does not compute")
    causal = is_causal if is_causal is not None else bool(getattr(module, "is_causal", True))
    gqa = query.shape[1] != key.shape[1]
    window = kwargs.get("sliding_window")
    window = window if causal and isinstance(window, int) and 0 < window < query.shape[2] else 0
    softcap = float(kwargs.get("softcap") or 0.0)
    if window or softcap:
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = _attention_op()(query, key, value, causal, window, softcap, float(scale))
    else:
        out = F.scaled_dot_product_attention(
            query, key, value, is_causal=causal, scale=scaling, enable_gqa=gqa
        )
    return out.transpose(1, 2).contiguous(), None


_ATTENTION_OP: Any = None
# what a model may hand transformers' attention interface that changes the result and the fused
# Attention does not compute: a refused import, never a dropped argument
_NOT_TAKEN = {
    "attention sinks (a learned logit per head)": ("s_aux", "sinks"),
    "a relative position bias": ("position_bias",),
    "sparse attention's selected keys": ("indices", "block_indices"),
}


def _attention_op() -> Any:
    """``distir::sdpa(q, k, v, causal, window, softcap, scale)``: scaled-dot-product attention
    with what torch's SDPA does not take, q (B, h, S, d), k and v (B, h_kv, S, d): a sliding window
    (query i sees keys i − window < j ≤ i, transformers' ``sliding_window_overlay``; 0: none) and
    a cap of the scaled scores (softcap·tanh(s / softcap), Gemma 2's; 0: none). A custom op, so
    the trace keeps it as one node, which the importer writes as ``Attention(causal, window,
    softcap)`` (``aten_map``); run, it is the written-out formula."""
    global _ATTENTION_OP
    if _ATTENTION_OP is None:
        import torch

        schema = (
            "(Tensor q, Tensor k, Tensor v, bool causal, int window, float softcap, float scale) -> Tensor"
        )

        @torch.library.custom_op("distir::sdpa", mutates_args=(), schema=schema)
        def sdpa(
            q: torch.Tensor,
            k: torch.Tensor,
            v: torch.Tensor,
            causal: bool,
            window: int,
            softcap: float,
            scale: float,
        ) -> torch.Tensor:
            group = q.shape[1] // k.shape[1]
            kk, vv = (t.repeat_interleave(group, dim=1) for t in (k, v))
            s = (q @ kk.transpose(-1, -2)) * scale
            if softcap:
                s = softcap * torch.tanh(s / softcap)
            i = torch.arange(q.shape[2], device=q.device)
            keep = torch.ones(q.shape[2], q.shape[2], dtype=torch.bool, device=q.device)
            if causal:
                keep &= i[None, :] <= i[:, None]
            if window:
                keep &= i[None, :] > i[:, None] - window
            return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ vv

        @sdpa.register_fake
        def _(q: torch.Tensor, *_: Any) -> torch.Tensor:  # shaped like the queries
            return torch.empty_like(q)

        _ATTENTION_OP = sdpa
    return _ATTENTION_OP


def _no_mask(*args: Any, **kwargs: Any) -> None:
    return None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION, _attention)
    AttentionMaskInterface.register(ATTENTION, _no_mask)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """transformers' warnings held back while a config is built and traced (a token id outside
    a tiny vocabulary, a model used outside its usual role): an import's own error, if any, is
    then the one line printed."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module="transformers")
            yield
    finally:
        hf_logging.set_verbosity(level)


def _implementation(cfg: Any) -> str:
    """The attention implementation to build ``cfg``'s causal LM with: distir's own where the
    model calls transformers' attention interface, else its ``sdpa`` path (the causal mask it
    then passes is recognized by the importer), else its eager one (written out: BLOOM's)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    cls: Any = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(cfg), None)
    if cls is None or getattr(cls, "_supports_attention_backend", False):
        return ATTENTION
    return "sdpa" if getattr(cls, "_supports_sdpa", False) else "eager"


def _rotary(raw: dict[str, Any], cfg: Any) -> bool:
    """Whether ``cfg``'s positions are rotary, computed for any position: a rotary key in the
    file, or the rotary parameters transformers gives the family by default (a Llama config
    without ``rope_theta`` is rotary all the same: ``rope_parameters``). GPT-J's ``rotary_dim``
    is not: its sinusoidal table has ``n_positions`` rows."""
    return any(k in raw for k in ROTARY_KEYS) or bool(getattr(cfg, "rope_parameters", None))


def hf_model(
    path: str, seq: int | None = None, meta: bool = True, layers: int | None = None
) -> tuple[Any, dict[str, Any]]:
    """The causal LM of config ``path`` (parameters on meta, or randomly initialized when not
    ``meta``: for tests) and its example inputs; ``layers`` overrides the number of blocks."""
    raw = read_config(path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    _register()
    try:
        cfg = AutoConfig.for_model(**raw)
    except Exception as e:  # ValueError, KeyError, TypeError, huggingface_hub's strict-field errors
        why = first_line(e).rstrip(":")
        if e.__cause__ is not None:  # the strict dataclasses' reason is their cause
            why += f": {first_line(e.__cause__)}"
        raise SourceError(f"hf:{path}: not a transformers model config ({why})") from None
    context = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    length = seq or context
    if not isinstance(length, int) or length < 1:
        raise SourceError(f"hf:{path}: the config gives no context length; give one (hf:{path}:seq=N)")
    rotary = _rotary(raw, cfg)  # positions computed, not a table's rows
    if isinstance(context, int) and length > context and not rotary:
        raise SourceError(
            f"hf:{path}: seq={length} is above the config's context of {context} positions; "
            "a longer context is a config that says so (max_position_embeddings, n_positions)"
        )
    _check_rotary(cfg, path)
    cfg.use_cache = False
    if layers is not None:
        cfg.num_hidden_layers = layers
    implementation = _implementation(cfg)
    sliding = getattr(cfg, "sliding_window", None)
    windowed = getattr(cfg, "use_sliding_window", True) and isinstance(sliding, int) and 0 < sliding < length
    if windowed and implementation != ATTENTION:  # its own attention path would build the band mask
        raise SourceError(
            f"hf:{path}: sliding_window={sliding} < seq={length} is supported where the model calls "
            "transformers' attention interface, which this one does not (seq=N ≤ the window is)"
        )
    try:
        with params_on_meta() if meta else contextlib.nullcontext():
            model = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
                cfg, attn_implementation=implementation, dtype=torch.float32
            )
    except Exception as e:  # no causal LM for the config, or a value its constructor refuses
        why = f"{type(e).__name__}: {first_line(e)}"
        raise SourceError(f"hf:{path}: transformers builds no causal LM from this config ({why})") from None
    ids = torch.zeros(2, length, dtype=torch.long)
    return model, {"input_ids": ids, "use_cache": False}
