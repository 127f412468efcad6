"""The program order of the exact simulation from the cost model's chunk times
(``distir.search.chunk_times``, ``distribute(..., chunk_times=...)``)."""

from __future__ import annotations

import numpy as np
import pytest

from distir.autodiff.train import Optimizer
from distir.frontends.zoo.registry import build_model, parse_model_string
from distir.hardware.cluster import parse_cluster
from distir.ir.types import DType
from distir.parallel.check import initial_values, run_distributed
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import StrategyError, parse_strategy
from distir.search.chunk_times import chunk_times
from distir.search.profile import Profiler
from distir.search.rerank import ExactJob, evaluate, evaluate_seeded
from distir.sim.simulate import simulate

GPT = "gpt:layers=4,hidden=64,heads=4,seq=16,vocab=128"


def test_chunk_times_sum_each_stage_s_own_profiles() -> None:
    """Per chunk, the sums of its layers' profiles on its own stage's GPUs: on a V100 node then a
    T4 node, the same layers take longer on the T4s."""
    model = build_model(GPT, 8)
    cl = parse_cluster("p3.8xlarge:1+g4dn.12xlarge:1")
    s = parse_strategy("d1.t4.p2.k2.1f1b.L2-2")
    fwd, bwd = chunk_times(model, parse_model_string(GPT), cl, DType.f32, True, s)
    assert len(fwd) == len(bwd) == 2
    prof = Profiler(parse_model_string(GPT), cl, DType.f32, True)
    for c, (gpus, r) in enumerate([([0, 1, 2, 3], range(0, 3)), ([4, 5, 6, 7], range(3, 7))]):
        layers = prof.layers(4, 4, gpus, "none")
        assert fwd[c] == pytest.approx(sum(layers[i].fwd_s for i in r), rel=1e-12)
        assert bwd[c] == pytest.approx(sum(layers[i].bwd_s for i in r), rel=1e-12)
    t4 = prof.layers(4, 4, [4, 5, 6, 7], "none")
    v100 = prof.layers(4, 4, [0, 1, 2, 3], "none")
    assert t4[2].fwd_s > v100[2].fwd_s  # a block: slower on the T4s
    inf = parse_strategy("d1.t4.p2.k2.1f1b.L2-2")  # inference: no loss layer
    inf_fwd, inf_bwd = chunk_times(build_model(GPT, 8), parse_model_string(GPT), cl, DType.f32, False, inf)
    assert inf_bwd == [0.0, 0.0] and all(x > 0 for x in inf_fwd)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["d2.t1.p2.k4.zb1", "d1.t2.p2.k4.interleaved.v2", "d1.t1.p4.k4.gpipe"])
def test_the_order_changes_no_value(strategy: str) -> None:
    """Only the interleaving of the ranks changes: every rank runs its actions in the same order,
    so the training step gives bit-identical results."""
    s = parse_strategy(strategy)
    model = build_model("gpt:layers=4,hidden=8,heads=2,seq=4,vocab=16", 8, DType.f64)
    vals = initial_values(model, Optimizer("sgd", lr=0.1), 0)
    chunks = s.p * s.v
    rng = np.random.default_rng(1)
    times = (list(rng.uniform(0.1, 5.0, chunks)), list(rng.uniform(0.1, 5.0, chunks)))
    plain = distribute(model, s, Optimizer("sgd", lr=0.1))
    timed = distribute(model, s, Optimizer("sgd", lr=0.1), chunk_times=times)
    _, a = run_distributed(plain, model, s, vals)
    _, b = run_distributed(timed, model, s, vals)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def test_wrong_chunk_times_are_a_strategy_error() -> None:
    with pytest.raises(StrategyError, match=r"chunk_times give \[2, 3\] forward and backward times for 3"):
        distribute(build_model(GPT, 6), parse_strategy("p3.k3"), chunk_times=([1.0, 1.0], [1.0, 1.0, 1.0]))


@pytest.mark.slow
def test_profiled_order_shortens_a_deep_pipeline_of_uneven_layers() -> None:
    """TransGAN's 16-stage GPipe (the search's best 16-stage GPipe of AMP's generator on 4 ×
    p3.8xlarge): ordered by weight counts — the wide blocks hold nearly all the block weights, the
    narrow ones most of the time — stages wait on each other (1844 ms); by the profiled times,
    1275 ms."""
    s = parse_strategy("d1.t1.p16.k64.gpipe.rsel.L1-4-8-1-1-1-1-1-1-1-1-1-1-1-1-0")
    model = build_model("transgan-hetero", 64)
    cl = parse_cluster("p3.8xlarge:4")
    times = chunk_times(model, parse_model_string("transgan-hetero"), cl, DType.f32, True, s)
    steps = []
    for ct in (None, times):
        prog = distribute(model, s, Optimizer("adam"), comm_streams=True, chunk_times=ct)
        steps.append(simulate(prog, cl, device_map(s, True), batch=64).step_time_s)
    assert steps[1] < 0.9 * steps[0], steps
    # and the search's exact evaluation is that simulation
    got = evaluate(ExactJob("transgan-hetero", "p3.8xlarge:4", 64), str(s))
    assert got["step_time_s"] == steps[1]


def test_seeded_exact_evaluation_takes_the_screen_s_profiles() -> None:
    """``evaluate_seeded`` (the search's exact phase) times its chunks with the profiles the screen
    shipped, profiling nothing again, and gives ``evaluate``'s result to the last figure, on a
    mixed-precision run across a V100 and a T4 node."""
    import distir.search.profile as profile_module

    cl = parse_cluster("p3.8xlarge:1+g4dn.12xlarge:1")
    job = ExactJob(GPT, cl, 16, dtype="bf16", precision="mixed")
    s = parse_strategy("d1.t4.p2.k2.1f1b.L2-2")
    profile_module._PROFILERS.clear()
    want = evaluate(job, str(s))
    screen = Profiler(parse_model_string(GPT), cl, DType.bf16, True, mixed=True)
    for gpus in ([0, 1, 2, 3], [4, 5, 6, 7]):
        screen.layers(4, 8, gpus, "none")
    profile_module._PROFILERS.clear()
    got = evaluate_seeded(job, screen.known(4, 8, "none"), str(s))
    assert got == want
    worker = profile_module.cached_profiler(parse_model_string(GPT), cl, DType.bf16, True, True)
    assert worker.probes == 0  # every chunk time from the shipped profiles
    profile_module._PROFILERS.clear()
