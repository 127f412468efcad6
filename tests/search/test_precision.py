"""Precision in the search: ``auto`` is what the trainers run (mixed precision in the GPUs' fast
half format for training), and the screen's memory follows the mixed program's."""

from __future__ import annotations

import pytest
from rich.console import Console

from distir.report.search_cli import _numerics
from distir.search.run import SearchRequest, search
from distir.search.space import Pins


def _resolve(
    cluster: str, train: bool = True, dtype: str = "auto", precision: str = "auto"
) -> tuple[str, str]:
    a = {"cluster": cluster, "train": train, "dtype": dtype, "precision": precision}
    return _numerics(a, Console(stderr=True))


def test_auto_is_mixed_in_the_fast_half_for_training_and_pure_for_inference() -> None:
    assert _resolve("dgx-a100") == ("bf16", "mixed")
    assert _resolve("h100") == ("bf16", "mixed")
    assert _resolve("dgx2-v100") == ("f16", "mixed")  # V100s have no bf16 fast path
    assert _resolve("p3.8xlarge:1+g4dn.12xlarge:1") == ("f16", "mixed")
    assert _resolve("dgx-a100", train=False) == ("bf16", "pure")
    assert _resolve("dgx-a100", dtype="f32", precision="pure") == ("f32", "pure")


def test_mixed_with_f32_is_refused() -> None:
    import typer

    with pytest.raises(typer.Exit):
        _resolve("dgx-a100", dtype="f32", precision="mixed")


MODEL = "gpt:layers=4,hidden=512,heads=8,seq=256,vocab=1024"


@pytest.mark.slow
def test_the_screen_adds_what_mixed_precision_adds() -> None:
    """Mixed precision adds fp32 masters and Adam state (8 bytes per weight more than pure bf16,
    divided as ZeRO divides them): the screen's peak grows by what the exact simulation's does,
    within 10%, for every strategy both searches simulated."""
    runs = {}
    for p in ("mixed", "pure"):
        req = SearchRequest(
            model=MODEL, cluster="dgx-a100", batch=32, dtype="bf16", precision=p, top=6, workers=1
        )
        o = search(req)
        assert all(r["precision"] == p and r["dtype"] == "bf16" for r in o.results)
        screened = {str(e.strategy): e.peak_memory_bytes for e in o.screened}
        runs[p] = {r["strategy"]: (screened[r["strategy"]], r["peak_memory_bytes"]) for r in o.results}
    both = sorted(set(runs["mixed"]) & set(runs["pure"]))
    assert len(both) >= 3
    for s in both:
        d_screen = runs["mixed"][s][0] - runs["pure"][s][0]
        d_exact = runs["mixed"][s][1] - runs["pure"][s][1]
        assert d_exact > 0 and d_screen == pytest.approx(d_exact, rel=0.1), s


def test_mixed_holds_more_memory_than_pure_bf16() -> None:
    """Per weight, mixed Adam holds 16 bytes (bf16 weight and gradient, fp32 master, m and v)
    against pure bf16's 8: the exact peak of one strategy grows by at least 8 bytes per weight."""
    from distir.frontends.zoo import build_model
    from distir.search.rerank import ExactJob, evaluate

    n = build_model(MODEL, 1).num_params
    peak = {
        p: evaluate(ExactJob(MODEL, "dgx-a100", 32, dtype="bf16", precision=p), "d1.t1.p1.k1")[
            "peak_memory_bytes"
        ]
        for p in ("mixed", "pure")
    }
    assert peak["mixed"] - peak["pure"] >= 8 * n * 0.95


@pytest.mark.slow
def test_the_screen_profiles_the_mixed_program_s_fp32_loss() -> None:
    """Under mixed precision the loss layer computes in fp32 (``Precision.prepare``): with a large
    vocabulary its copies dominate the last stage, and the screen's peak follows the exact one
    (it profiled the pure-bf16 loss before, half the bytes)."""
    model = "llama:layers=4,hidden=256,heads=4,kv_heads=2,ffn=512,vocab=32768,seq=512"
    req = SearchRequest(
        model=model, cluster="dgx-a100", batch=64, dtype="bf16", precision="mixed", top=6, workers=1,
        pins=Pins(schedule="1f1b"),
    )  # fmt: skip
    o = search(req)
    screened = {str(e.strategy): e.peak_memory_bytes for e in o.screened}
    # the screen weighs tensors against the memory the runtime leaves them; the exact peak
    # includes the runtime's (context, workspaces, buffers, allocator reserve)
    runtime = o.cluster.device_spec(0).runtime
    ratios = [screened[r["strategy"]] / runtime.tensor_capacity(r["peak_memory_bytes"]) for r in o.results]
    assert len(ratios) >= 4
    assert all(0.9 <= x <= 1.1 for x in ratios), ratios
