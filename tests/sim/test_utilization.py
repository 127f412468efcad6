"""MFU counts the model's FLOPs (forward + backward of the sequential model, recomputation
excluded); HFU counts every FLOP the program executes."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from distir.autodiff.train import Optimizer
from distir.cli import app
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.simulate import SimResult, simulate

MLP = "mlp:layers=4,hidden=64"


def _result(model_spec: str, strategy: str, batch: int, train: bool = True) -> SimResult:
    model = build_model(model_spec, batch=batch)
    s = parse_strategy(strategy)
    prog = distribute(model, s, Optimizer("sgd"), train=train, comm_streams=True)
    r = simulate(prog, parse_cluster("dgx-a100"), device_map(s, True), batch=batch)
    return dataclasses.replace(r, model_flops=model.step_flops(train))


def _run(model_spec: str, strategy: str, batch: int, train: bool = True) -> tuple[float, float, float]:
    r = _result(model_spec, strategy, batch, train)
    assert r.mfu is not None
    return r.mfu, r.hfu, r.flops


def test_model_flops_are_three_forwards_of_the_matmuls() -> None:
    """An MLP of Relu(x·W) layers: the forward is 2·h² FLOPs per sample and layer (plus the
    ReLUs and the loss, a small rest), the training step three forwards."""
    model = build_model(MLP, batch=16)
    matmuls = 2 * 64 * 64 * 4
    assert matmuls <= model.flops_per_sample <= 1.05 * matmuls
    assert model.step_flops(True) == 3 * model.step_flops(False) == 3 * 16 * model.flops_per_sample


def test_recomputation_raises_hfu_not_mfu() -> None:
    mfu, hfu, flops = _run(MLP, "d1.t1.p1.k1", 16)
    mfu_r, hfu_r, flops_r = _run(MLP, "d1.t1.p1.k1.rfull", 16)
    assert flops_r > flops  # recomputation executes more
    assert mfu_r < mfu  # same model FLOPs in a longer step
    assert hfu_r / mfu_r > hfu / mfu  # HFU counts the recomputed forward


def test_model_flops_do_not_depend_on_the_strategy() -> None:
    """MFU × step × peak is the model's FLOPs whatever the strategy (data, pipeline, tensor
    parallel, recomputing), while the FLOPs executed differ."""
    got = []
    for st in ("d1.t1.p1.k1", "d2.t1.p2.k2.1f1b", "d1.t2.p1.k1.rfull"):
        r = _result(MLP, st, 16)
        assert r.mfu is not None
        got.append((r.mfu * r.step_time_s * r.peak_flops, r.flops))
    model_flops = build_model(MLP, batch=16).step_flops(True)
    assert all(m == pytest.approx(model_flops, rel=1e-9) for m, _ in got)
    assert len({round(f) for _, f in got}) > 1


def test_model_without_flop_count_has_no_mfu() -> None:
    model = dataclasses.replace(build_model(MLP, batch=4), flops_per_sample=0.0)
    assert model.step_flops(True) is None


def test_simulate_json_reports_mfu_and_hfu() -> None:
    r = CliRunner().invoke(
        app, ["simulate", "--model", MLP, "--strategy", "d1.t1.p1.k1.rfull", "--batch", "16", "--json"]
    )
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["model_flops"] == pytest.approx(build_model(MLP, batch=16).step_flops(True))
    assert 0 < d["mfu"] < d["hfu"]
    assert d["mfu"] == pytest.approx(d["model_flops"] / d["flops"] * d["hfu"])


def test_program_file_has_hfu_but_no_mfu() -> None:
    from pathlib import Path

    ex = Path(__file__).resolve().parents[2] / "examples" / "fig2_mlp_pipeline.distir"
    r = CliRunner().invoke(app, ["simulate", str(ex), "--json"])
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["mfu"] is None and d["model_flops"] is None and d["hfu"] > 0


def test_eager_kernels_are_slower_than_fused_ones() -> None:
    """``--kernels eager`` (one kernel per op, as eager PyTorch) costs every elementwise op its own
    launch and memory round trip; ``fused`` (the default) lets chains join their producer, and
    ``inductor`` too but for a GEMM's epilogue (torch.compile's extern products): between."""
    spec = "gpt:layers=2,hidden=256,heads=4,seq=256,vocab=512"
    got = {}
    for k in ("fused", "inductor", "eager"):
        r = CliRunner().invoke(app, ["simulate", "--model", spec, "--batch", "8", "--kernels", k, "--json"])
        assert r.exit_code == 0, r.stderr
        d = json.loads(r.stdout)
        assert d["kernels"] == k
        got[k] = d["step_time_s"]
    assert got["eager"] > got["inductor"] > got["fused"]
    bad = CliRunner().invoke(app, ["simulate", "--model", spec, "--kernels", "jit"])
    assert bad.exit_code == 2 and "--kernels must be one of fused, inductor, eager" in bad.stderr
