"""Where llm-foundry's H100 rows are optimistic (issue 16): their simulated step split by op class
against A100, and pairs of published rows from the same README tables that separate the
attention kernel's time from the rest of the step. Diagnostic only: it changes nothing.

    PYTHONPATH=src OMP_NUM_THREADS=1 .venv/bin/python bench/bench_h100_attribution.py

Every published figure is a row of llm-foundry's scripts/train/benchmarking/README.md at
8c8dd48f72168c5d51e2f7b151595892a8fba43d (the records' source), named by its line. A row that is
not a record of ``bench/published_runs.toml`` is built from the record of the same model and GPU
(its flags: FSDP1, eager kernels, the attention kernel), with the row's sequence length, GPUs,
microbatch, global batch and activation checkpointing.

1. *Classes*: GPU 0's simulated compute per token (µs) in GEMMs (``MatMul``), fused attention
   (``Attention``, ``AttentionGrad``) and the rest of the step (memory-bound kernels, the
   optimizer, idle), against the published µs per token. "GEMM ×" is how much longer the GEMMs
   would have to run for the published step if attention and the rest took what distir charges.
2. *Sequence pairs*: two rows of one table with the same model, GPUs, gradient accumulation and
   tokens per microbatch (so the same GEMMs and memory-bound kernels) at two sequence lengths.
   Solving ``published = g·GEMM + a·attention + rest`` over the pair gives ``a``, the attention
   kernel's published over charged time, and ``g``, the GEMMs'.
3. *Attention kernels*: the "Large Scale" table's flash (FlashAttention-2 2.4.2) rows against the
   "H100 80GB BF16" table's triton rows of the same model at seq 2048: published and simulated
   ratio.
4. *One configuration on both GPUs*: rows of the A100 80 GB and H100 BF16 tables with the same
   model, sequence, GPUs and microbatch (b2a43a147's ``sweep.sh`` runs both tables in one image,
   ``mosaicml/pytorch:2.1.0_cu121``, with llm-foundry v0.3.0), and the H100 13B at seq 2048,
   microbatch 2, on 8 to 64 GPUs: the throughput error as published (the default) and under
   ``--interference persistent`` (H100 GEMMs in two waves beside a collective).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple

os.environ.setdefault("OMP_NUM_THREADS", "1")


sys.path.insert(0, str(Path(__file__).resolve().parent))  # the bench scripts are not a package

import validate_published as vp

_H100 = vp.ClusterCfg("h100", "H100-SXM-80GB", 8, "8 GPUs per node (the h100 preset)")


class Sibling(NamedTuple):
    """A README row (line ``line``) built from record ``base`` with the row's settings."""

    label: str
    base: str
    line: int
    value: float  # published tokens/s/GPU
    seq: int
    gpus: int
    microbatch: int
    global_batch: int
    recompute: str  # "full" (activation checkpointing True) or "none"
    h100: bool = True
    flash: bool = False  # attn_impl flash: FlashAttention-2 with unpadding


_A7, _A13, _A30 = "mosaic-a100-7b-s2048-g8", "mosaic-a100-13b-s2048-g8", "mosaic-a100-30b-s2048-g8"
_A3, _A1 = "mosaic-a100-3b-s2048-g8", "mosaic-a100-1b-s2048-g8"
_A760 = "mosaic-a100-760m-s2048-g8"

# (row at the shorter sequence, row at the longer): same tokens per microbatch and accumulation
PAIRS: tuple[tuple[Sibling, Sibling], ...] = (
    (
        Sibling("A100 3b s512", _A3, 193, 12127, 512, 8, 40, 1920, "none", h100=False),
        Sibling("A100 3b s1024", _A3, 192, 11580, 1024, 8, 20, 960, "none", h100=False),
    ),
    (
        Sibling("H100 3b s512", _A3, 129, 27965, 512, 8, 40, 1920, "none"),
        Sibling("H100 3b s1024", _A3, 128, 27046, 1024, 8, 20, 960, "none"),
    ),
    (
        Sibling("A100 7b s1024", _A7, 185, 4357, 1024, 8, 64, 1024, "full", h100=False),
        Sibling("A100 7b s4096", _A7, 183, 3684, 4096, 8, 16, 256, "full", h100=False),
    ),
    (
        Sibling("H100 7b s1024", _A7, 119, 10203, 1024, 8, 64, 1024, "full"),
        Sibling("H100 7b s4096", _A7, 117, 8611, 4096, 8, 16, 256, "full"),
    ),
    (
        Sibling("A100 13b s1024", _A13, 178, 2330, 1024, 8, 40, 960, "full", h100=False),
        Sibling("A100 13b s4096", _A13, 176, 2060, 4096, 8, 10, 240, "full", h100=False),
    ),
    (
        Sibling("H100 13b s1024", _A13, 113, 5502, 1024, 8, 40, 960, "full"),
        Sibling("H100 13b s4096", _A13, 108, 4717, 4096, 8, 10, 240, "full"),
    ),
    (
        Sibling("A100 30b s512", _A30, 172, 967, 512, 8, 12, 2016, "full", h100=False),
        Sibling("A100 30b s2048", _A30, 170, 916, 2048, 8, 3, 504, "full", h100=False),
    ),
    (
        Sibling("H100 30b s1024", _A30, 105, 2084, 1024, 8, 6, 1008, "full"),
        Sibling("H100 30b s2048", _A30, 104, 2002, 2048, 8, 3, 504, "full"),
    ),
)

# (flash row of the Large Scale table, triton row of the H100 BF16 table), seq 2048
KERNEL_PAIRS: tuple[tuple[Sibling, Sibling], ...] = (
    (
        Sibling(
            "1b flash g128 (record)", "mosaic-h100-1b-s2048-g128", 92, 44123, 2048, 128, 12, 1536, "none"
        ),
        Sibling("1b triton g64", _A1, 135, 44402, 2048, 64, 20, 1280, "none"),
    ),
    (
        Sibling("3b flash g128 (record)", "mosaic-h100-3b-s2048-g128", 89, 23422, 2048, 128, 8, 1024, "none"),
        Sibling("3b triton g64", _A3, 125, 22525, 2048, 64, 6, 1152, "none"),
    ),
    (
        Sibling("7b flash g128", _A7, 86, 10475, 2048, 128, 6, 768, "none", flash=True),
        Sibling("7b triton g8 (record)", "mosaic-h100-7b-s2048-g8", 118, 10643, 2048, 8, 6, 48, "none"),
    ),
)

# (A100 row, H100 row) of one model, sequence, GPU count and microbatch
SAME_CONFIG: tuple[tuple[Sibling, Sibling], ...] = (
    (
        Sibling("A100 760m g8 (record)", _A760, 207, 32434, 2048, 8, 24, 384, "none", h100=False),
        Sibling("H100 760m g8", _A760, 147, 63147, 2048, 8, 24, 384, "none"),
    ),
    (
        Sibling("A100 1b g8 (record)", _A1, 199, 20513, 2048, 8, 14, 448, "none", h100=False),
        Sibling("H100 1b g8", _A1, 138, 45455, 2048, 8, 14, 112, "none"),
    ),
    (
        Sibling("A100 3b s1024 g8", _A3, 192, 11580, 1024, 8, 20, 960, "none", h100=False),
        Sibling("H100 3b s1024 g8", _A3, 128, 27046, 1024, 8, 20, 960, "none"),
    ),
    (
        Sibling("A100 7b g8 (record)", _A7, 184, 4641, 2048, 8, 6, 96, "none", h100=False),
        Sibling("H100 7b g8 (record)", "mosaic-h100-7b-s2048-g8", 118, 10643, 2048, 8, 6, 48, "none"),
    ),
    (
        Sibling("A100 13b g8 (record)", _A13, 177, 2262, 2048, 8, 2, 48, "none", h100=False),
        Sibling("H100 13b g8", _A13, 112, 4792, 2048, 8, 2, 16, "none"),
    ),
    (
        Sibling("A100 30b g8 (record)", _A30, 170, 916, 2048, 8, 3, 504, "full", h100=False),
        Sibling("H100 30b g8", _A30, 104, 2002, 2048, 8, 3, 504, "full"),
    ),
)

# the H100 13B at seq 2048, microbatch 2, one microbatch a step, on 8 to 64 GPUs
GPU_SERIES: tuple[Sibling, ...] = tuple(
    Sibling(f"H100 13b g{g}", "mosaic-h100-13b-s2048-g64", line, value, 2048, g, 2, 2 * g, "none")
    for g, line, value in ((8, 112, 4792), (16, 111, 4767), (32, 110, 4811), (64, 109, 4800))
)

CLASS_ROWS: tuple[str, ...] = (
    _A1,
    _A3,
    _A7,
    "mosaic-h100-7b-s2048-g8",
    _A13,
    "mosaic-h100-13b-s2048-g64",
    _A30,
    "mosaic-h100-30b-s2048-g16",
    "mosaic-a100-70b-s2048-g64",
    "mosaic-h100-70b-s2048-g64",
    "mosaic-h100-3b-s2048-g128",
    "mosaic-h100-1b-s2048-g128",
)


class Classes(NamedTuple):
    """Simulated µs per token on GPU 0, and the published µs per token."""

    step: float
    gemm: float
    attention: float
    rest: float
    published: float


def _class_of(op: str) -> str:
    if "MatMul" in op:
        return "gemm"
    return "attention" if op.startswith("Attention") else "rest"


def classes(run: Any) -> Classes:
    """``run``'s simulated step per token by op class (see the module docstring)."""
    res, _ = vp._simulated(run, vp.AS_PUBLISHED, trace=True, trace_detail="op")
    per = {"gemm": 0.0, "attention": 0.0}
    for s in res.trace_detail().slices:
        kind = _class_of(s.args.get("op", ""))
        if s.slot == 0 and not s.comm and "op" in s.args and kind in per:
            per[kind] += s.end - s.start
    tokens = run.strategy.global_batch * run.model.seq / run.strategy.dp
    step = res.step_time_s
    us = 1e6 / tokens
    rest = step - per["gemm"] - per["attention"]
    return Classes(step * us, per["gemm"] * us, per["attention"] * us, rest * us, 1e6 / run.published.value)


def build(s: Sibling, runs: dict[str, Any]) -> Any:
    """The run of README row ``s``: its record when it is one, else built from ``s.base``."""
    base = runs[s.base]
    if base.published.value == s.value and base.model.seq == s.seq:
        return base
    cluster = dataclasses.replace(_H100 if s.h100 else base.cluster, gpus=s.gpus)
    strategy = dataclasses.replace(
        base.strategy, dp=s.gpus, microbatch=s.microbatch, global_batch=s.global_batch, recompute=s.recompute
    )
    model = dataclasses.replace(base.model, seq=s.seq, unpad=s.flash or base.model.unpad)
    published = dataclasses.replace(base.published, value=s.value)
    run = dataclasses.replace(
        base, name=s.label, cluster=cluster, strategy=strategy, model=model, published=published
    )
    return dataclasses.replace(run, attention_kernel="fa2") if s.flash else run


def _class_line(name: str, c: Classes) -> str:
    gemm_x = (c.published - c.attention - c.rest) / c.gemm
    err = 100 * (c.published / c.step - 1)
    cells = (c.step, c.gemm, c.attention, c.rest, c.published)
    return f"{name:30s} " + " ".join(f"{x:8.2f}" for x in cells) + f" {err:+7.1f}% {gemm_x:7.3f}"


def pair_factors(short: Classes, long: Classes) -> tuple[float, float]:
    """(a, g) solving ``published = g·gemm + a·attention + rest`` for both rows of a pair."""
    a = (long.published - long.rest - (short.published - short.rest)) / (long.attention - short.attention)
    g = (short.published - short.rest - a * short.attention) / short.gemm
    return a, g


def _errors(run: Any) -> str:
    """``run``'s throughput error as published and under ``--interference persistent``."""
    cells = []
    for v in (vp.AS_PUBLISHED, vp.Variant(persistent=True)):
        cells.append(vp.throughput_error_pct(run, vp.predict(run, v).figure))
    return f"{run.published.value:10,.0f} {cells[0]:+9.1f}% {cells[1]:+11.1f}%"


def main() -> None:
    runs = {r.name: r for r in vp.load_runs()}
    head = f"{'':30s} " + " ".join(f"{h:>8s}" for h in ("step", "GEMM", "attn", "rest", "pub"))
    print("1. classes, µs per token (error: predicted/published throughput - 1)")
    print(head + f" {'error':>8s} {'GEMM ×':>7s}")
    for name in CLASS_ROWS:
        print(_class_line(name, classes(runs[name])), flush=True)
    print("\n2. sequence pairs (same tokens per microbatch): a = attention published/charged, g = GEMMs'")
    for short, long in PAIRS:
        cs, cl = classes(build(short, runs)), classes(build(long, runs))
        print(_class_line(f"{short.label} (l.{short.line})", cs))
        print(_class_line(f"{long.label} (l.{long.line})", cl))
        a, g = pair_factors(cs, cl)
        print(f"{'':30s} a = {a:.3f}, g = {g:.3f}", flush=True)
    print("\n3. flash (FlashAttention-2) against triton rows: throughput ratio flash/triton")
    for flash, triton in KERNEL_PAIRS:
        cf, ct = classes(build(flash, runs)), classes(build(triton, runs))
        print(_class_line(f"{flash.label} (l.{flash.line})", cf))
        print(_class_line(f"{triton.label} (l.{triton.line})", ct))
        print(
            f"{'':30s} published {ct.published / cf.published:.3f}, simulated {ct.step / cf.step:.3f}",
            flush=True,
        )
    print("\n4. one configuration on both GPUs; the 13B on 8-64 GPUs: error as published, persistent")
    for a100, h100 in SAME_CONFIG:
        for s in (a100, h100):
            print(f"{s.label + f' (l.{s.line})':30s} {_errors(build(s, runs))}", flush=True)
    for s in GPU_SERIES:
        print(f"{s.label + f' (l.{s.line})':30s} {_errors(build(s, runs))}", flush=True)


if __name__ == "__main__":
    main()
