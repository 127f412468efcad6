"""Tensor-parallel collectives pipelined with their GEMMs (``distir.sim.overlap``, Megatron-LM's
``--tp-comm-overlap``): the pairing, the exposed-time formulas by hand, whole steps against
closed forms, and every fast path against the reference planner with the overlap on."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from typer.testing import CliRunner

from distir.autodiff.train import Optimizer
from distir.cli import app
from distir.frontends.zoo.registry import build_model
from distir.hardware.cluster import parse_cluster
from distir.interp.shapes import entry_args
from distir.ir import parse_module, print_module
from distir.ops.registry import CommPattern
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim import overlap
from distir.sim.cost import FixedCostModel, RooflineCostModel
from distir.sim.plan import REFERENCE, PlanDomain, PlanOptions
from distir.sim.records import Collective, OpRecord
from distir.sim.simulate import _run, simulate
from sim.test_fast_paths import FAST_PATHS
from sim.test_figures_unchanged import figures

TP = "mesh(tp=4; d0, d1, d2, d3)"
X = f"DTensor[bf16, (4096, 1024), {TP}, [S(0)]]"  # sequence-sharded activations
W1 = f"DTensor[bf16, (1024, 4096), {TP}, [S(1)]]"  # column-parallel
W2 = f"DTensor[bf16, (4096, 1024), {TP}, [S(0)]]"  # row-parallel
# Megatron's MLP under sequence parallelism: AllGather, column-parallel GEMM, row-parallel GEMM,
# ReduceScatter
MLP = f"""func @mlp(%x: {X}, %w1: {W1}, %w2: {W2}) {{
  %xg = Redistribute(%x, to="R")
  %h = MatMul(%xg, %w1)
  %y = MatMul(%h, %w2)
  %ys = Redistribute(%y, to="S(0)")
  return %ys
}}
"""
# a second gather beside a GEMM it does not feed (bulk), and a gather of a GEMM's own result
# (it depends on the GEMM: it cannot run beside it)
XR = f"DTensor[bf16, (4096, 1024), {TP}, [R]]"  # replicated activations
BULK = f"""func @bulk(%x: {X}, %w1: {W1}, %z: {X}, %xr: {XR}) {{
  %xg = Redistribute(%x, to="R")
  %h = MatMul(%xg, %w1)
  %k = MatMul(%xr, %w1)
  %zg = Redistribute(%z, to="R")
  %r = Relu(%zg)
  %kg = Redistribute(%k, to="R")
  %s = Relu(%kg)
  return %h, %r, %s
}}
"""


# Q, K and V as three GEMMs reading one gathered input (Megatron-Core's linear_qkv is one GEMM)
QKV = f"""func @qkv(%x: {X}, %w1: {W1}) {{
  %xg = Redistribute(%x, to="R")
  %q = MatMul(%xg, %w1)
  %k = MatMul(%xg, %w1)
  %v = MatMul(%xg, %w1)
  return %q, %k, %v
}}
"""


@dataclass(frozen=True)
class _Fixed(FixedCostModel):
    """Fixed costs, with the trainer overlapping tensor-parallel communication."""

    tp_comm_overlap: bool = True


def _step(text: str, compute: float, comm: float, on: bool) -> float:
    m = parse_module(text)
    cost = _Fixed(compute=compute, comm=comm, tp_comm_overlap=on)
    return simulate(m, parse_cluster("dgx-a100"), cost_model=cost).step_time_s


def test_exposed_by_hand() -> None:
    # ring: the gather hides behind a longer GEMM; a longer gather leaves c + g/n - g
    assert overlap.exposed("ring", 0.5, 1.0, 4) == 0.0
    assert overlap.exposed("ring", 1.0, 0.2, 4) == pytest.approx(1.0 + 0.05 - 0.2)
    # pipelined: at least the last chunk's reduction, c/n
    assert overlap.exposed("pipelined", 0.5, 1.0, 4) == pytest.approx(0.125)
    assert overlap.exposed("pipelined", 1.0, 0.2, 4) == pytest.approx(0.85)
    # bulk: side by side
    assert overlap.exposed("bulk", 0.5, 1.0, 4) == 0.0
    assert overlap.exposed("bulk", 1.0, 0.25, 4) == 0.75
    # one chunk: nothing to pipeline
    assert overlap.exposed("ring", 0.5, 1.0, 1) == 0.5


def test_te_pipelines_in_four_splits_a_ring_in_one_chunk_per_rank() -> None:
    """Transformer Engine splits a pipelined GEMM into ``num_splits=4`` chunks whatever the
    tensor-parallel size and runs its pipelined and bulk kernels on 16 SMs (its defaults, which
    Megatron-LM keeps); a ring has one chunk per rank; async TP one per rank everywhere."""
    te = overlap.te_form(132)
    assert te == overlap.Form(4, 16 / 132)
    for ranks in (2, 4, 8):
        assert overlap.chunks("pipelined", ranks, te.splits) == 4
        assert overlap.chunks("ring", ranks, te.splits) == ranks
        assert overlap.chunks("pipelined", ranks, overlap.PER_RANK.splits) == ranks
    assert overlap.chunks("pipelined", 1, te.splits) == 1  # nothing to pipeline


def test_te_kernels_slow_the_gemm_beside_them() -> None:
    """A bulk collective shorter than its GEMM costs s·c (the GEMM runs on the SMs left); a
    pipelined one c/k plus s·c·(k-1)/k while the GEMM is the longer; a comm-bound pair is
    unchanged (the GEMM's slowdown hides under the collective)."""
    s = 0.125
    assert overlap.exposed("bulk", 0.5, 1.0, 4, s) == pytest.approx(s * 0.5)
    assert overlap.exposed("bulk", 1.0, 0.25, 4, s) == pytest.approx(0.75)
    assert overlap.exposed("pipelined", 0.5, 1.0, 4, s) == pytest.approx(0.125 + s * 0.5 * 3 / 4)
    assert overlap.exposed("pipelined", 1.0, 0.2, 4, s) == pytest.approx(0.85)


@dataclass(frozen=True)
class _FixedTE(_Fixed):
    """Fixed costs under Transformer Engine's splits, its kernels taking no SMs."""

    def tp_overlap(self) -> overlap.Form:
        return overlap.Form(overlap.TE_PIPELINE_SPLITS, 0.0)


@pytest.mark.parametrize("ranks", [2, 8])
def test_an_mlp_of_another_tp_size_pipelines_in_four_chunks_under_te(ranks: int) -> None:
    """On tp=2 and tp=8 meshes TE's reduction is charged max(c/4, c + g/4 - g), async TP's
    max(c/n, c + g/n - g); the gather max(0, c + g/n - g) under both."""
    mesh = f"mesh(tp={ranks}; {', '.join(f'd{i}' for i in range(ranks))})"
    m = parse_module(MLP.replace(TP, mesh))
    g, c = 0.2, 1.0
    ring = max(0.0, c + g / ranks - g)
    for cost, k in ((_FixedTE(compute=g, comm=c), 4), (_Fixed(compute=g, comm=c), ranks)):
        got = simulate(m, parse_cluster("dgx-a100"), cost_model=cost).step_time_s
        assert got == pytest.approx(2 * g + ring + max(c / k, c + g / k - g))


def test_the_roofline_model_charges_te_on_the_gpus_sms_or_async_per_rank() -> None:
    cl = parse_cluster("h100")
    assert RooflineCostModel(cl, tp_comm_overlap=True).tp_overlap() == overlap.te_form(132)
    assert (
        RooflineCostModel(cl, tp_comm_overlap=True, tp_overlap_form="async").tp_overlap() == overlap.ASYNC_TP
    )
    off = RooflineCostModel(cl, tp_comm_overlap=True, comm_interference=False)
    assert off.tp_overlap() == overlap.Form(4, 0.0)
    assert overlap.form_of(RooflineCostModel(cl)) is None  # no overlap at all
    with pytest.raises(ValueError, match="tp_overlap_form"):
        RooflineCostModel(cl, tp_comm_overlap=True, tp_overlap_form="nccl").tp_overlap()


@pytest.mark.parametrize(("c", "g", "n"), [(0.3, 1.0, 2), (1.0, 0.3, 8), (0.7, 0.7, 4), (2.0, 0.01, 2)])
def test_exposed_is_between_nothing_and_the_collective(c: float, g: float, n: int) -> None:
    for mode in ("ring", "pipelined", "bulk"):
        assert 0.0 <= overlap.exposed(mode, c, g, n) <= c


def test_pairs_of_the_mlp() -> None:
    fn = parse_module(MLP).entry
    got = overlap.pairs(fn)
    assert got[0] == overlap.Candidates(1, True, ())  # the gather feeds the first GEMM
    # the second GEMM produced its input; the first is its ancestor too: no bulk candidate
    assert got[3] == overlap.Candidates(2, False, ())
    assert got[1] is None and got[2] is None  # GEMMs are not candidates


def test_pairs_skip_the_gemms_a_collective_depends_on() -> None:
    fn = parse_module(BULK).entry
    got = overlap.pairs(fn)
    assert got[3] == overlap.Candidates(overlap.NO_PAIR, False, (2, 1))  # %zg: both GEMMs, nearest first
    # %kg gathers %k: its producer is a GEMM (a direct candidate, for a ReduceScatter only);
    # %h is independent of it
    assert got[5] == overlap.Candidates(2, False, (1,))


def test_a_ring_takes_every_gemm_reading_the_gathered_tensor() -> None:
    """The gather feeding Q, K and V rings with the three as one product: charged
    max(0, c + G/n - G), G = 3g, n = 4 (with the first GEMM alone it would leave 0.35)."""
    got = overlap.pairs(parse_module(QKV).entry)
    assert got[0] == overlap.Candidates(1, True, (), (2, 3))
    g, c, n = 0.2, 0.5, 4
    assert _step(QKV, g, c, on=True) == pytest.approx(3 * g + max(0.0, c + 3 * g / n - 3 * g))


@pytest.mark.parametrize(("compute", "comm"), [(1.0, 0.5), (0.2, 1.0)])
def test_mlp_step_by_hand(compute: float, comm: float) -> None:
    """The MLP's step without overlap is its four ops in a row; with it, the gather is charged
    max(0, c + g/n - g) and the reduction max(c/k, c + g/k - g), n = 4 ranks, k = 4 splits."""
    g, c, n = compute, comm, 4
    assert _step(MLP, g, c, on=False) == pytest.approx(2 * g + 2 * c)
    ring = max(0.0, c + g / n - g)
    pipelined = max(c / n, c + g / n - g)
    assert _step(MLP, g, c, on=True) == pytest.approx(2 * g + ring + pipelined)


def test_bulk_step_by_hand() -> None:
    """%xg rings with %h; %zg runs beside %k (1.0 ≥ 0.5: hidden); %kg depends on %k and pairs
    with nothing (%h is taken): 1 + 1 + 1 + 1 (two Relus) + 0.5."""
    assert _step(BULK, 1.0, 0.5, on=False) == pytest.approx(4.0 + 3 * 0.5)
    assert _step(BULK, 1.0, 0.5, on=True) == pytest.approx(4.0 + 0.5)


@dataclass(frozen=True)
class _FixedAsync(_Fixed):
    """Fixed costs under PyTorch's async tensor parallelism: direct pairs only."""

    def tp_overlap(self) -> overlap.Form:
        return overlap.ASYNC_TP


def test_async_tp_overlaps_only_the_direct_pairs() -> None:
    """Under ``ASYNC_TP`` %xg rings with %h (the all-gather → matmul Inductor fuses); %zg, which
    feeds no GEMM, runs exposed instead of beside %k, and %kg pairs with nothing:
    1 + 1 + 1 + 1 + 0.5 + 0.5. The default forms keep their bulk pairs (``test_bulk_step_by_hand``)."""
    assert overlap.ASYNC_TP.bulk is False and overlap.ASYNC_TP[:2] == overlap.PER_RANK[:2]
    assert overlap.PER_RANK.bulk and overlap.te_form(132).bulk
    cost = _FixedAsync(compute=1.0, comm=0.5)
    got = simulate(parse_module(BULK), parse_cluster("dgx-a100"), cost_model=cost).step_time_s
    assert got == pytest.approx(4.0 + 2 * 0.5)
    # the MLP's two direct pairs are charged as under one chunk per rank
    g, c, n = 0.2, 1.0, 4
    mlp = simulate(parse_module(MLP), parse_cluster("dgx-a100"), cost_model=_FixedAsync(compute=g, comm=c))
    assert mlp.step_time_s == pytest.approx(2 * g + max(0.0, c + g / n - g) + max(c / n, c + g / n - g))


def test_async_tp_leaves_a_reduce_scatter_of_a_sum_exposed() -> None:
    """A reduce-scatter fed by a sum of GEMMs (the backward's input gradient of GEMMs reading
    one gathered input) has no direct GEMM: the default form runs it beside an independent GEMM,
    ``ASYNC_TP`` charges it whole."""
    gemm = OpRecord((0, 1), 1.0, False, "MatMul", 1.0, False, (), (), (), None)
    rs_ = Collective(CommPattern.REDUCESCATTER, 2)
    rs = OpRecord((0, 1), 0.5, True, "Redistribute", 0.0, False, (), (), (), None, rs_)
    cand = [None, overlap.Candidates(overlap.NO_PAIR, False, (0,))]
    assert overlap.apply([gemm, rs], cand)[1].seconds == 0.0
    assert overlap.apply([gemm, rs], cand, overlap.ASYNC_TP)[1].seconds == 0.5


def test_a_collective_on_another_stream_or_of_another_pattern_does_not_pair() -> None:
    gemm = OpRecord((0, 1), 1.0, False, "MatMul", 1.0, False, (), (), (), None)
    ag = OpRecord(
        (0, 1), 0.5, True, "Redistribute", 0.0, False, (), (), (), None, Collective(CommPattern.ALLGATHER, 2)
    )
    assert overlap.apply([ag, gemm], [overlap.Candidates(1, True, ()), None])[0].seconds == 0.0
    elsewhere = ag._replace(devs=(2, 3))  # a communication stream's clocks
    assert overlap.apply([elsewhere, gemm], [overlap.Candidates(1, True, ()), None])[0].seconds == 0.5
    allreduce = ag._replace(collective=Collective(CommPattern.ALLREDUCE, 2))
    assert overlap.apply([allreduce, gemm], [overlap.Candidates(1, True, ()), None])[0].seconds == 0.5
    # a ReduceScatter before its GEMM is no ring; it may still run beside an independent one
    rs = ag._replace(collective=Collective(CommPattern.REDUCESCATTER, 2))
    assert overlap.apply([rs, gemm], [overlap.Candidates(1, True, ()), None])[0].seconds == 0.5


GPT = "gpt:layers=4,hidden=256,heads=8,seq=512,vocab=512"


def test_a_sequence_parallel_step_is_shorter_and_otherwise_the_same() -> None:
    s = parse_strategy("d2.t4.sp.p1.k2")
    m = distribute(build_model(GPT, 4), s, Optimizer("adam"), comm_streams=True)
    text = print_module(m)
    cl = parse_cluster("dgx-a100")
    off = simulate(m, cl, device_map(s, True), RooflineCostModel(cl))
    on = simulate(m, cl, device_map(s, True), RooflineCostModel(cl, tp_comm_overlap=True))
    assert print_module(m) == text  # a cost annotation, not a rewrite
    assert on.step_time_s < off.step_time_s
    assert on.flops == off.flops and on.peak_memory == off.peak_memory
    # what it saves is at most the tensor-parallel communication on the compute streams
    assert off.step_time_s - on.step_time_s <= off.comm_s[0] + 1e-12


def test_without_tensor_parallelism_nothing_changes() -> None:
    s = parse_strategy("d4.t1.p2.k4.1f1b")
    m = distribute(build_model(GPT, 16), s, Optimizer("adam"), comm_streams=True)
    cl = parse_cluster("dgx-a100")
    off = simulate(m, cl, device_map(s, True), RooflineCostModel(cl))
    on = simulate(m, cl, device_map(s, True), RooflineCostModel(cl, tp_comm_overlap=True))
    assert on.step_time_s == off.step_time_s


@pytest.mark.parametrize("path", sorted(FAST_PATHS))
def test_every_fast_path_overlaps_as_the_reference(path: str) -> None:
    s = parse_strategy("d2.t2.sp.p2.k2.1f1b")
    m = distribute(build_model(GPT, 4), s, Optimizer("adam"), comm_streams=True)
    cl = parse_cluster("p3.8xlarge:2")
    dmap = device_map(s, True)

    def run(options: PlanOptions, on: bool) -> dict[str, Any]:
        dom = PlanDomain(m, dmap, RooflineCostModel(cl, tp_comm_overlap=on), options)
        plan = dom.plan(m.entry, entry_args(m.entry, None))
        return figures(_run(plan, dom, cl, dmap, False, None))

    got = run(FAST_PATHS[path], True)
    assert got == run(REFERENCE, True)
    assert got != run(REFERENCE, False)  # the overlap changed the figures


def test_the_cli_flag() -> None:
    """``distir simulate --tp-comm-overlap`` shortens a sequence-parallel step and says so in JSON."""
    base = ["simulate", "--model", GPT, "--strategy", "d1.t4.sp.p1.k1", "--batch", "2", "--json"]
    got = {}
    for flag in ([], ["--tp-comm-overlap"]):
        r = CliRunner().invoke(app, base + flag)
        assert r.exit_code == 0, r.stderr
        d = json.loads(r.stdout)
        assert d["tp_comm_overlap"] is bool(flag)
        got[bool(flag)] = d["step_time_s"]
    assert got[True] < got[False]
