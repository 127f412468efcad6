"""Import time of a GPT-2 exported by ``torch.onnx.export(..., dynamo=True)`` with dynamic batch
and sequence (Shape subgraphs, the causal mask computed from the sizes): the export itself, the
import (read + check + convert + layer grouping), and the type check of the imported module.
Needs the onnx extras (torch, transformers, onnx, onnxscript). Run:

    PYTHONPATH=src .venv/bin/python bench/bench_onnx_import.py [--layers 12 --hidden 768 --heads 12]
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def export(path: Path, layers: int, hidden: int, heads: int, vocab: int, positions: int) -> None:
    import torch
    import transformers

    torch.set_num_threads(1)
    cfg = transformers.GPT2Config(
        n_layer=layers,
        n_embd=hidden,
        n_head=heads,
        n_positions=positions,
        vocab_size=vocab,
        bos_token_id=0,
        eos_token_id=0,
    )
    lm = transformers.GPT2LMHeadModel(cfg)
    lm.train(False)  # eval mode (transformers overrides ``eval`` without annotations)
    export_logits(lm, path, positions, 8)


def export_logits(lm: Any, path: Path, positions: int, seq: int, **options: Any) -> None:
    """``lm``'s logits of its token ids exported to ``path`` (``dynamo=True``), with dynamic
    batch and sequence (up to ``positions``), traced at batch 2 and ``seq`` tokens; ``options``
    go to ``torch.onnx.export`` (e.g. ``external_data=False``)."""
    import torch

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = lm

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            logits: torch.Tensor = self.m(input_ids=ids, use_cache=False).logits
            return logits

    dim = torch.export.Dim
    torch.onnx.export(
        Logits().eval(),
        (torch.zeros(2, seq, dtype=torch.long),),
        str(path),
        dynamo=True,
        input_names=["input_ids"],
        output_names=["logits"],
        dynamic_shapes=({0: dim("batch"), 1: dim("seq", max=positions)},),
        verbose=False,
        **options,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--positions", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    a = ap.parse_args()

    import distir
    from distir.frontends.onnx_import import import_onnx

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gpt2.onnx"
        t = time.perf_counter()
        export(path, a.layers, a.hidden, a.heads, a.vocab, a.positions)
        t_export = time.perf_counter() - t
        t = time.perf_counter()
        imp = import_onnx(path, dims={"batch": a.batch, "seq": a.seq})
        t_import = time.perf_counter() - t
        t = time.perf_counter()
        distir.check(imp.module)
        t_check = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    ops = sum(imp.op_counts().values())
    print(f"GPT-2 {a.layers}x{a.hidden}, {imp.num_params / 1e6:.1f}M weights, batch {a.batch} seq {a.seq}")
    print(f"  layers: {' '.join(imp.layers) or '(one function: ' + imp.note + ')'}")
    print(
        f"  export {t_export:.1f} s | import {t_import:.2f} s | check {t_check:.2f} s | {ops} ops run | "
        f"peak RSS {rss:.0f} MiB"
    )


if __name__ == "__main__":
    main()
