"""A Llama-family model exported to ONNX against its Hugging Face config: the step each simulates
under the same strategies, in f32 and in bf16 mixed precision, and the export's load.

Exports a randomly initialized transformers ``MistralForCausalLM`` (GQA, RoPE, RMSNorm, a sliding
window shorter than the sequence) with ``torch.onnx.export(..., dynamo=True)`` and a dynamic
batch and sequence, writes its ``config.json`` beside it, and simulates ``FILE.onnx:seq=S`` and
``hf:DIR:seq=S`` as ``distir simulate --model ...`` does (``distir.simulate``). Needs the onnx
extras (torch, transformers, onnx, onnxscript); the default shape's export takes about two
minutes and 500 MB of disk. Run:

    PYTHONPATH=src .venv/bin/python bench/bench_onnx_vs_hf.py [--layers 12 --hidden 768 --seq 1024]
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

from bench_onnx_import import export_logits  # bench/ is this script's directory

STRATEGIES = ("d8.t1.p1.k1.1f1b", "d2.t2.p2.k4.1f1b", "d1.t8.p1.k1.1f1b", "d2.t1.p4.k4.1f1b")
NUMERICS = (("f32", "pure"), ("bf16", "mixed"))


def export(folder: Path, a: Any) -> Path:
    """The model's ONNX file (and its config.json) in ``folder``."""
    import torch
    import transformers

    torch.set_num_threads(1)
    torch.manual_seed(0)
    shape: dict[str, Any] = {
        "num_hidden_layers": a.layers,
        "hidden_size": a.hidden,
        "intermediate_size": a.ffn,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "max_position_embeddings": a.positions,
        "vocab_size": a.vocab,
        "sliding_window": a.window,
        "attn_implementation": "sdpa",
    }
    cfg = transformers.MistralConfig(**shape)
    cfg.save_pretrained(folder)
    lm = transformers.MistralForCausalLM(cfg)
    lm.train(False)  # eval mode (transformers overrides ``eval`` without annotations)
    with torch.no_grad():  # norms away from their init of ones: the exporter merges equal tensors
        for name, p in lm.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))

    path = folder / "model.onnx"
    export_logits(lm, path, a.positions, 16, external_data=False)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (
        ("layers", 12),
        ("hidden", 768),
        ("ffn", 2048),
        ("heads", 12),
        ("kv-heads", 4),
        ("vocab", 32000),
        ("window", 512),
        ("positions", 2048),
        ("seq", 1024),
        ("batch", 16),
    ):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--cluster", default="dgx-a100")
    a = ap.parse_args()

    import distir
    from distir.frontends.files import load_file
    from distir.parallel.strategy import StrategyError

    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        path = export(Path(tmp), a)
        t_export = time.perf_counter() - t
        onnx, hf = f"{path}:seq={a.seq}", f"hf:{tmp}:seq={a.seq}"
        t = time.perf_counter()
        load_file(onnx, a.batch)
        t_load = time.perf_counter() - t
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"Mistral-shaped {a.layers}x{a.hidden} ({a.heads} heads, {a.kv_heads} kv, window {a.window}), "
            f"seq {a.seq}, batch {a.batch}, {a.cluster}: export {t_export:.0f} s, "
            f"{path.stat().st_size / 1e6:.0f} MB; load {t_load:.1f} s, peak RSS {rss:.0f} MiB"
        )
        for dtype, precision in NUMERICS:
            for s in STRATEGIES:
                try:
                    runs = [
                        distir.simulate(m, s, a.cluster, a.batch, dtype=dtype, precision=precision)
                        for m in (onnx, hf)
                    ]
                    got = [r.step_time_s for r in runs]
                except StrategyError as e:  # a shape the strategy does not fit (fewer blocks than stages)
                    print(f"  {dtype:4s} {precision:5s} {s:18s} not run: {e}")
                    continue
                onnx_ms, hf_ms = got[0] * 1e3, got[1] * 1e3
                print(
                    f"  {dtype:4s} {precision:5s} {s:18s} ONNX {onnx_ms:8.1f} ms | hf {hf_ms:8.1f} ms"
                    f" | {(got[0] / got[1] - 1) * 100:+.1f}%"
                )


if __name__ == "__main__":
    main()
