"""Where the Megatron-LM README's H100 weak-scaling rows go (issue 16): GPU 0's simulated step by
stream and op class, against the published step. Diagnostic only: it changes nothing.

    PYTHONPATH=src OMP_NUM_THREADS=1 .venv/bin/python bench/bench_megatron_attribution.py [--all] [--only N]

The rows are the ``megatron-h100-*`` records of ``bench/published_runs.toml`` (images/model_table.png
of NVIDIA/Megatron-LM, Megatron-Core r0.8.0), built and simulated as ``validate_published`` does:
by default the four without a pipeline (1.7B … 32B, about 5 minutes); ``--all`` adds the
pipelined ones, minutes each (GPU 0's op trace alone, as for every row).
Per row, in ms per step: the simulated step and the published one (the step that gives the
published TFLOP/s under Megatron's FLOPs formula); GPU 0's compute stream by class — GEMMs
(``MatMul``), fused attention, the tensor-parallel collectives left exposed beside them
(``Redistribute`` on the compute stream) and the rest (memory-bound kernels, the loss, the
optimizer) — and the busy time of its two data-parallel streams: ``dp_reduce`` (the gradient
buckets' reduce-scatters) and ``dp_gather`` (the distributed optimizer's parameter all-gathers).

*Data-parallel floor* (rows without a pipeline, k microbatches of one rank's compute C): Megatron
gathers the parameters during the step's first forward, one bucket ahead of it
(``--overlap-param-gather``: ``DistributedOptimizer._finish_param_sync_helper``), and reduces the
gradients during the last backward only (``forward_backward_no_pipelining`` runs the others
under ``no_sync``), megatron/core at core_r0.8.0. So the step takes at least the gather, the
reduction and the (k − 1)/k of the compute between them: ``floor = AG + RS + (k − 1)·C/k``, with
AG and RS as simulated. ``C max`` is the largest compute that fits the published step under that
bound, ``(published − AG − RS)·k/(k − 1)``; ``C min`` is the row's GEMM FLOPs at the H100's best
measured GEMM rate (the GEMM profile's published fraction of the peak: no shape runs faster)
plus its attention and other kernels as simulated. A row with ``C max`` below ``C min`` cannot
reach its published step with the record's microbatch, gradient dtype and network.

``--microbatch N`` simulates the rows at micro-batches of N sequences instead of the records'
(the README does not state it; the records assume 1): a what-if, not a record.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

os.environ.setdefault("OMP_NUM_THREADS", "1")


sys.path.insert(0, str(Path(__file__).resolve().parent))  # the bench scripts are not a package

import validate_published as vp

PREFIX = "megatron-h100-"
CLASSES = ("gemm", "attention", "tp_exposed", "rest")
STREAMS = ("dp_reduce", "dp_gather")


class Split(NamedTuple):
    """A row's simulated step and GPU 0's time per class and stream (seconds)."""

    step: float
    published: float
    per: dict[str, float]
    gemm_flops: float  # GPU 0's GEMM FLOPs in the step


def _class_of(op: str) -> str:
    if "MatMul" in op:
        return "gemm"
    if op.startswith("Attention"):
        return "attention"
    return "tp_exposed" if op == "Redistribute" else "rest"


def split(run: Any) -> Split:
    """``run``'s simulated step split on GPU 0 (see the module docstring)."""
    from distir.parallel.distribute import device_map

    # GPU 0 alone: the op trace of a whole 96-GPU row is above the trace bound
    res, st = vp._simulated(run, vp.AS_PUBLISHED, trace=True, trace_detail="op", trace_gpus=frozenset({0}))
    slots = device_map(st, True).slots
    per = dict.fromkeys(CLASSES + STREAMS, 0.0)
    flops = 0.0
    for s in res.trace_detail().slices:
        op = s.args.get("op")
        if s.depth == 0 or op is None or slots[s.slot].gpu != 0:
            continue
        stream = slots[s.slot].stream
        if stream in STREAMS:
            per[stream] += s.end - s.start
        elif stream == "compute":
            kind = _class_of(op)
            per[kind] += s.end - s.start
            if kind == "gemm":  # a DTensor op's FLOPs are over its whole mesh: a stage's
                flops += float(s.args.get("flops", 0.0)) / (st.d * st.t * st.c)
    t = res.step_time_s
    published = t * vp.figure_of(run, t) / run.published.value
    return Split(t, published, per, flops)


def floor_line(run: Any, sp: Split) -> str:
    """The data-parallel floor of a row without a pipeline (module docstring)."""
    k = run.strategy.global_batch // (run.strategy.dp * run.strategy.microbatch)
    if run.strategy.pp > 1 or k < 2:
        return "    (pipeline or one microbatch: no floor)"
    ag, rs = sp.per["dp_gather"], sp.per["dp_reduce"]
    busy = sum(sp.per[c] for c in CLASSES)
    floor = ag + rs + (k - 1) * busy / k
    c_max = (sp.published - ag - rs) * k / (k - 1)
    dev = vp.cluster_of(run.cluster).device_spec(0)
    best = sp.gemm_flops / (dev.bf16 * dev.gemm.fraction) if dev.gemm is not None else float("nan")
    c_min = best + sp.per["attention"] + sp.per["rest"]
    verdict = "below the floor" if c_max < c_min else "reachable"
    return (
        f"    floor {1e3 * floor:7.1f} (AG {1e3 * ag:.1f} + RS {1e3 * rs:.1f} + {k - 1}/{k} of C "
        f"{1e3 * busy:.1f}); C max {1e3 * c_max:7.1f}, C min {1e3 * c_min:7.1f}: published {verdict}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], metavar="NAME", help="a run name or prefix*")
    ap.add_argument("--all", action="store_true", help="also the pipelined rows (slow)")
    ap.add_argument("--microbatch", type=int, default=0, metavar="N", help="what if: micro-batches of N")
    a = ap.parse_args(argv)
    runs = [r for r in vp.load_runs(vp.DATA) if r.name.startswith(PREFIX)]
    if a.microbatch > 0:
        runs = [replace(r, strategy=replace(r.strategy, microbatch=a.microbatch)) for r in runs]
    if not (a.all or a.only):
        runs = [r for r in runs if r.strategy.pp == 1]
    if a.only:
        runs = [r for r in runs if any(vp._named(r, p) for p in a.only)]
    head = "".join(f"{c:>11s}" for c in CLASSES + STREAMS)
    print(f"{'run':20s} {'strategy':28s} {'step':>8s} {'publ.':>8s}{head}   (ms per step, GPU 0)")
    for r in runs:
        sp = split(r)
        cells = "".join(f"{1e3 * sp.per[c]:11.1f}" for c in CLASSES + STREAMS)
        st = vp.strategy_of(r.strategy)
        print(f"{r.name:20s} {st!s:28s} {1e3 * sp.step:8.1f} {1e3 * sp.published:8.1f}{cells}", flush=True)
        print(floor_line(r, sp), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
