"""The search with Megatron-LM's ``--tp-comm-overlap`` (``SearchRequest.tp_comm_overlap``): the
screen's layer profiles and the exact simulations both pair tensor-parallel collectives with
their GEMMs (``distir.sim.overlap``), so the screen and the exact phase agree on what the overlap
saves, and a search's results are the exact simulations with it."""

from __future__ import annotations

import pytest

from distir.frontends.zoo.registry import parse_model_string
from distir.hardware.cluster import parse_cluster
from distir.ir.types import DType
from distir.parallel.strategy import parse_strategy
from distir.search.profile import Profiler
from distir.search.rerank import ExactJob, evaluate
from distir.search.run import SearchRequest, search
from distir.search.screen import Problem, Screen
from distir.search.space import Pins

GPT = "gpt:layers=4,hidden=1024,heads=16,seq=1024,vocab=4096"
BATCH = 16


def _screen(overlap: bool) -> Screen:
    spec, cluster = parse_model_string(GPT), parse_cluster("dgx-a100")
    prof = Profiler(spec, cluster, DType.bf16, True, mixed=True, tp_comm_overlap=overlap)
    return Screen(prof, Problem(BATCH, True, "adam", True))


def _exact(strategy: str, overlap: bool) -> float:
    cluster = parse_cluster("dgx-a100")
    job = ExactJob(GPT, cluster, BATCH, dtype="bf16", precision="mixed", tp_comm_overlap=overlap)
    return float(evaluate(job, strategy)["step_time_s"])


def test_layer_profiles_overlap_the_tensor_parallel_collectives() -> None:
    """With sequence parallelism every layer's AllGather/ReduceScatter pairs with a GEMM: each
    transformer block runs faster forward and backward; without it nothing changes (Megatron-LM
    runs its overlap only with sequence parallelism)."""
    gpus = [0, 1, 2, 3]
    on, off = _screen(True).profiler, _screen(False).profiler
    with_sp = list(zip(on.layers(4, 2, gpus, sp=True), off.layers(4, 2, gpus, sp=True), strict=True))
    blocks = with_sp[1:-1]  # embedding and head/loss around the blocks
    assert blocks and all(a.fwd_s < b.fwd_s and a.bwd_s < b.bwd_s for a, b in blocks)
    assert [p.fwd_s for p in on.layers(4, 2, gpus)] == [p.fwd_s for p in off.layers(4, 2, gpus)]


@pytest.mark.parametrize("strategy", ["d2.t4.sp.p1.k2.1f1b", "d1.t4.sp.p2.k4.1f1b"])
def test_screen_and_exact_agree_on_what_the_overlap_saves(strategy: str) -> None:
    """The screen's step time is within 2% of the exact simulation's with the overlap as without,
    and the two see the same saving (within a tenth of it)."""
    s = parse_strategy(strategy)
    screened = {o: _screen(o).estimate(s, balance=False) for o in (False, True)}
    exact = {o: _exact(str(screened[o].strategy), o) for o in (False, True)}
    for o in (False, True):
        assert screened[o].step_time_s == pytest.approx(exact[o], rel=0.02), (o, exact[o])
    saved_screen = screened[False].step_time_s - screened[True].step_time_s
    saved_exact = exact[False] - exact[True]
    assert saved_exact > 0.02 * exact[False]  # the overlap matters here, so the check below can fail
    assert saved_screen == pytest.approx(saved_exact, rel=0.1)


@pytest.mark.slow
def test_a_search_with_the_overlap_reports_the_exact_simulations_with_it() -> None:
    req = SearchRequest(
        model=GPT, cluster="dgx-a100", batch=BATCH, dtype="bf16", precision="mixed", top=2,
        pins=Pins(tp=4, pp=1, max_k=2), tp_comm_overlap=True,
    )  # fmt: skip
    out = search(req)
    assert out.results
    for row in out.results:
        assert row["step_time_s"] == _exact(row["strategy"], True)
    assert req.key_parts()["tp_comm_overlap"] is True


@pytest.mark.parametrize(
    ("model", "pins"),
    [
        ("mlp:layers=2,hidden=64", Pins()),  # no sequence dim: no sequence parallelism
        ("gpt:layers=2,hidden=64,heads=4,seq=32,vocab=64", Pins(tp=1)),  # t = 1: none either
    ],
)
def test_the_overlap_over_a_space_without_sequence_parallelism_is_refused(model: str, pins: Pins) -> None:
    """Every plan would be costed as without the flag: one line before the screen, not a search
    whose ``tp_comm_overlap`` says true and changed nothing."""
    from distir.search.space import SpaceError

    req = SearchRequest(model=model, cluster="dgx-a100:1", batch=8, top=1, pins=pins, tp_comm_overlap=True)
    with pytest.raises(SpaceError, match="no strategy searched has sequence parallelism"):
        search(req)
