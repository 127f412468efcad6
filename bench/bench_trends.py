"""Search quality figures (issue 6). Prints figures; asserts nothing (``tests/search/test_trends.py``
asserts the thresholds).

    .venv/bin/python bench/bench_trends.py [ITEM ...]

1. AMP's heterogeneous cluster (GPT-2 24 × 1024, batch 32): the winner vs pure d = 16.
2. AMP's TransGAN generator on 4 × p3.8xlarge: the cost-balanced layer split vs the uniform one
   (the search's winner, and its winner among AMP's non-interleaved 1F1B pipelines).
3. Batch shares: a V100 node and a T4 node, pipelines pinned off: the winner vs its even split.
4. Program order: TransGAN's 16-stage GPipe written in the order of the weight counts vs of the
   cost model's chunk times (``search/chunk_times.py``).
5. Screen calibration: the screen's estimate / the exact simulation over the 24 best strategies.
6. Llama-3 8B on 8 × H100 (seq 8192, batch 1024, bf16 mixed): the winner, and the best FSDP /
   ZeRO-3 data-parallel plan (``--pp 1 --tp 1 --zero 3``: every microbatch size searched) and by
   how much it loses (or wins).
7. GPT-3 175B on 128 × DGX A100 (batch 1536, bf16 mixed), trainer-neutral and as Megatron-LM
   runs it (``--trainer megatron``), each with and without Megatron-LM's tensor-parallel
   communication overlap (``--tp-comm-overlap``): the winner, the best plan of the other
   tensor-parallel degree among t = 4 and 8 (``--tp 4`` / ``--tp 8``) and the gap.
"""

from __future__ import annotations

import os
import statistics
import sys
from dataclasses import replace

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

from bench_search import gpt3_request  # noqa: E402  (bench/ is this script's directory)
from distir.autodiff.train import Optimizer  # noqa: E402
from distir.frontends.zoo.registry import build_model, parse_model_string  # noqa: E402
from distir.hardware.cluster import parse_cluster  # noqa: E402
from distir.ir.types import DType  # noqa: E402
from distir.parallel.distribute import device_map, distribute  # noqa: E402
from distir.parallel.strategy import parse_strategy  # noqa: E402
from distir.search.chunk_times import chunk_times  # noqa: E402
from distir.search.rerank import ExactJob, evaluate  # noqa: E402
from distir.search.run import SearchRequest, search  # noqa: E402
from distir.search.space import Pins  # noqa: E402
from distir.sim.simulate import simulate  # noqa: E402

GPT_AMP = "gpt:layers=24,hidden=1024,heads=16,seq=1024"
SHARES_GPT = "gpt:layers=4,hidden=1024,heads=4,seq=128,vocab=512"


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f} ms"


def amp_heterogeneous() -> None:
    req = SearchRequest(
        model=GPT_AMP, cluster="p3.8xlarge:3+g4dn.12xlarge:1", batch=32, top=2, anneal_iters=100, explain=True
    )
    out = search(req)
    best = out.best()
    assert best is not None
    pure = next(r for r in out.results if r["strategy"].startswith("d16.t1.p1"))
    ratio = pure["step_time_s"] / best["step_time_s"]
    print(
        f"1. AMP heterogeneous: {best['strategy']} {_ms(best['step_time_s'])} vs {pure['strategy']} "
        f"{_ms(pure['step_time_s'])}: {ratio:.2f}x"
    )


def transgan_balance() -> None:
    """Unpinned, and pinned to AMP's schedule (DeepSpeed's non-interleaved 1F1B)."""
    req = SearchRequest(model="transgan-hetero", cluster="p3.8xlarge:4", batch=64, top=2, anneal_iters=0)
    job = ExactJob(req.model, req.cluster, req.batch)
    for label, pins in (("any schedule", Pins()), ("1f1b", Pins(schedule="1f1b"))):
        best = search(replace(req, pins=pins)).best()
        assert best is not None
        s = parse_strategy(str(best["strategy"]))
        uniform = evaluate(job, str(replace(s, partition="uniform")))
        ratio = uniform["step_time_s"] / best["step_time_s"]
        print(
            f"2. TransGAN ({label}): {s} {_ms(best['step_time_s'])} vs uniform split "
            f"{_ms(uniform['step_time_s'])}: {ratio:.2f}x"
        )


def batch_shares() -> None:
    # hidden 1024, as the trend test: at 256 the products fill neither GPU kind's SMs
    req = SearchRequest(
        model=SHARES_GPT, cluster="p3.8xlarge:1+g4dn.12xlarge:1", batch=48, top=3, pins=Pins(pp=1)
    )
    best = search(req).best()
    assert best is not None
    s = parse_strategy(str(best["strategy"]))
    even = evaluate(ExactJob(req.model, req.cluster, req.batch), str(replace(s, shares=None)))
    ratio = even["step_time_s"] / best["step_time_s"]
    print(
        f"3. batch shares (--pp 1): {s} {_ms(best['step_time_s'])} vs even {_ms(even['step_time_s'])}: "
        f"{ratio:.2f}x"
    )


def program_order() -> None:
    s = parse_strategy("d1.t1.p16.k64.gpipe.rsel.L1-4-8-1-1-1-1-1-1-1-1-1-1-1-1-0")
    model = build_model("transgan-hetero", 64)
    cl = parse_cluster("p3.8xlarge:4")
    times = chunk_times(model, parse_model_string("transgan-hetero"), cl, DType.f32, True, s)
    steps = []
    for ct in (None, times):
        prog = distribute(model, s, Optimizer("adam"), comm_streams=True, chunk_times=ct)
        steps.append(simulate(prog, cl, device_map(s, True), batch=64).step_time_s)
    print(f"4. program order, {s}: by weight counts {_ms(steps[0])}, by chunk times {_ms(steps[1])}")


def calibration() -> None:
    print("5. screen / exact over the 24 best (median, min, max):")
    for label, model, cluster, batch in (
        ("GPT-2 117M, 3 × p3.8xlarge + g4dn", "gpt2-117m", "p3.8xlarge:3+g4dn.12xlarge:1", 32),
        ("TransGAN, 4 × p3.8xlarge", "transgan-hetero", "p3.8xlarge:4", 64),
    ):
        out = search(SearchRequest(model=model, cluster=cluster, batch=batch, top=24, workers=2))
        ratios = [
            r["screen_step_time_s"] / r["step_time_s"] for r in out.results if "screen_step_time_s" in r
        ]
        print(
            f"   {label:36s} {statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f}, "
            f"{len(ratios)} strategies)"
        )


def llama_fsdp() -> None:
    req = SearchRequest(
        model="llama3-8b", cluster="h100", batch=1024, dtype="bf16", precision="mixed", top=8, workers=2
    )
    best = search(req).best()
    fsdp = search(replace(req, pins=Pins(pp=1, tp=1, zero=3))).best()
    assert best is not None and fsdp is not None
    print(
        f"6. llama3-8b, 8 × H100, batch 1024: winner {best['strategy']} {best['step_time_s']:.2f} s "
        f"(microbatch {best['microbatch_size']} × k {best['k']}); best FSDP/ZeRO-3 {fsdp['strategy']} "
        f"{fsdp['step_time_s']:.2f} s (microbatch {fsdp['microbatch_size']} × k {fsdp['k']}, "
        f"{'fits' if fsdp['fits'] else 'OOM'}): "
        f"{fsdp['step_time_s'] / best['step_time_s']:.3f}× the winner's step"
    )


def gpt3_tp() -> None:
    base = gpt3_request()  # bench_search.py item 2's search
    for trainer in ("distir", "megatron"):
        for overlap in (False, True):
            req = replace(base, tp_comm_overlap=overlap, trainer=trainer)
            best = search(req).best()
            assert best is not None
            other_t = 4 if best["t"] == 8 else 8
            other = search(replace(req, pins=Pins(tp=other_t, max_k=128))).best()
            assert other is not None
            who = "trainer-neutral" if trainer == "distir" else f"as {trainer} runs it"
            print(
                f"7. GPT-3 175B, 1024 × A100, {who}, "
                f"{'with' if overlap else 'without'} --tp-comm-overlap: winner "
                f"{best['strategy']} {best['step_time_s']:.3f} s; best t = {other_t} {other['strategy']} "
                f"{other['step_time_s']:.3f} s ({other['step_time_s'] / best['step_time_s'] - 1:+.1%})",
                flush=True,
            )


ITEMS = (amp_heterogeneous, transgan_balance, batch_shares, program_order, calibration, llama_fsdp, gpt3_tp)


def main() -> None:
    """Every item, or those numbered on the command line (``bench_trends.py 7``)."""
    picked = [int(a) for a in sys.argv[1:]] or range(1, len(ITEMS) + 1)
    for n in picked:
        ITEMS[n - 1]()


if __name__ == "__main__":
    main()
