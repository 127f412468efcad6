"""Models exported by ``torch.onnx.export(..., dynamo=True)`` for the ONNX importer's tests (torch
and transformers are imported only when an export runs; a test skips where they are missing)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest


def exporting() -> Any:
    """transformers, ready for an export: offline, torch on one thread and seeded (the test skips
    where torch, transformers or onnxscript is missing)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    return transformers


def nudge_norms(lm: Any, marker: str) -> None:
    """The norms' parameters (names holding ``marker``) moved off their 1/0 init, so no two layers
    share a tensor."""
    import torch

    with torch.no_grad():
        for name, p in lm.named_parameters():
            if marker in name:
                p.add_(0.1 * torch.randn_like(p))


def export_gpt2(path: Path, dynamic: bool) -> tuple[Path, Any]:
    """A 2-layer GPT-2 (hidden 32, 4 heads, vocabulary 50) exported to ``path``, and the torch
    model it came from; its norms moved off their 1/0 init (``nudge_norms``)."""
    transformers = exporting()
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=4, n_positions=16, vocab_size=50, bos_token_id=0, eos_token_id=0
    )
    lm = transformers.GPT2LMHeadModel(cfg).eval()
    nudge_norms(lm, "ln_")
    return export_logits(path, lm, dynamic, max_seq=16), lm


def export_logits(path: Path, lm: Any, dynamic: bool, max_seq: int) -> Path:
    """A transformers causal LM's logits of ``input_ids`` (vocabulary 50) exported to ``path``
    by ``torch.onnx.export(dynamo=True)``, with a dynamic batch and sequence (up to ``max_seq``)
    or the example's (2, 8)."""
    import torch

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = lm

        def forward(self, ids: Any) -> Any:
            return self.m(input_ids=ids, use_cache=False).logits

    dim = torch.export.Dim
    shapes = ({0: dim("batch"), 1: dim("seq", max=max_seq)},) if dynamic else None
    torch.onnx.export(
        Logits().eval(),
        (torch.randint(0, 50, (2, 8)),),
        str(path),
        dynamo=True,
        input_names=["input_ids"],
        output_names=["logits"],
        external_data=False,
        dynamic_shapes=shapes,
    )
    return path
