"""`distir calibrate --quick` on this machine: it measures, fits and writes a profile that the
cluster loader accepts and `distir simulate` runs on (tiny sizes; under ~30 s)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from distir.backend import dispatch
from distir.backend.calibrate import CalibrateOptions
from distir.backend.commbench import comm_plan
from distir.cli import app
from distir.hardware.cluster import load_cluster_file
from distir.hardware.profile import is_quick
from distir.ops.registry import REGISTRY

torch = pytest.importorskip("torch")

runner = CliRunner()


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)


@pytest.mark.slow
def test_quick_calibrate_writes_a_profile_simulate_accepts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    measured: list[dispatch.Dispatch] = []  # the rank loop's measurement, through the worker loop
    real_measure = dispatch.measure

    def spy(*args: Any, **kwargs: Any) -> dispatch.Dispatch:
        measured.append(real_measure(*args, **kwargs))
        return measured[-1]

    monkeypatch.setattr(dispatch, "measure", spy)
    out = tmp_path / "profile.toml"
    raw = tmp_path / "raw.json"
    r = runner.invoke(
        app, ["calibrate", "--quick", "--dtypes", "f32", "--out", str(out), "--raw", str(raw), "--json"]
    )
    assert r.exit_code == 0, r.stderr
    timings = json.loads(raw.read_text())
    assert len(timings["links"]) == len(comm_plan(2, CalibrateOptions(quick=True).sizes()))
    assert {s["op"] for s in timings["ops"]} >= {"Add", "Softmax", "Attention"}
    assert all(REGISTRY[s["op"]].family == s["family"] and s["seconds"] > 0 for s in timings["ops"])
    assert all(s["dtype"] == "f32" for s in timings["gemm"])
    # in situ: one one-rank step (no messages) and one two-rank step (messages) ran and simulated
    assert [s["messages"] > 0 for s in timings["insitu"]] == [False, True]
    assert all(s["real_s"] > 0 and s["sim_s"] > 0 and s["ops"] > 0 for s in timings["insitu"])
    data = json.loads(r.stdout)
    assert data["profile"] == str(out) and "by distir calibrate" in data["source"]
    # every collective fitted, or left unfitted with the reason (e.g. its times do not grow)
    wanted = {"allreduce", "allgather", "reducescatter", "broadcast", "p2p"}
    assert set(data["links"]) | set(data["skipped"]) == wanted
    assert all(data["skipped"][k] for k in wanted - set(data["links"]))
    assert {"elementwise", "nn", "attention"} <= set(data["families"])
    assert set(data["peak_tflops"]) == {"f32"}
    assert set(data["insitu_overhead_us"]) == {"op", "collective", "p2p"}
    assert min(data["insitu_overhead_us"].values()) >= 0
    [d] = measured
    assert d.chain_s > 0 and d.allreduce_iter_s > 0 and d.p2p_iter_s > 0
    assert d.together_iter_s > 0 and d.apart_iter_s > 0
    assert min(d.op_s, d.collective_s, d.p2p_s, d.arrival_s) >= 0
    cl = load_cluster_file(out)
    node = cl.nodes[0]
    assert cl.num_devices == 2 and node.device.gemm is not None
    assert f"calibrated on {os.uname().nodename}" in node.source
    assert data["quick"] and is_quick([node.source])  # a smoke test, said in the file and on stderr
    assert "warning: " in r.stderr and "calibrated with --quick: a smoke test" in r.stderr
    assert node.device.fp32 == pytest.approx(data["peak_tflops"]["f32"] * 1e12, rel=1e-5)
    assert node.intra.bandwidth == pytest.approx(data["links"]["p2p"]["bandwidth_gb_s"] * 1e9, rel=1e-5)
    r = runner.invoke(
        app,
        [
            "simulate",
            "--cluster",
            str(out),
            "--model",
            "gpt:layers=2,hidden=64,heads=4,seq=32,vocab=128",
            "--strategy",
            "d2.t1.p1.k1",
            "--batch",
            "4",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["step_time_s"] > 0


@pytest.mark.parametrize(("dtypes", "what"), [("f32,f8", "unknown dtype f8"), ("bf16", "must include f32")])
def test_calibrate_bad_dtypes_is_one_line(tmp_path: Path, dtypes: str, what: str) -> None:
    r = runner.invoke(app, ["calibrate", "--quick", "--dtypes", dtypes, "--out", str(tmp_path / "p.toml")])
    assert r.exit_code == 2 and what in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "p.toml").exists()


def test_cuda_calibration_needs_a_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine: the GPU path (compute on GPU 0, NCCL) is untested here")
    from distir.backend.calibrate import CalibrateOptions, calibrate

    cal = calibrate(CalibrateOptions(quick=True, dtypes=(__import__("distir").ir.types.DType.f32,)))
    assert cal.device.startswith("GPU")


def test_ops_of_one_family_that_cost_unalike_are_each_fitted_on_their_own() -> None:
    """Two memory-bound ops of the family "grad": one at 60% of the bandwidth, one at 10% (a
    torch implementation of several kernels); the oracle is the roofline that made their times."""
    from distir.backend.calibrate import OP_FIT_SAMPLES, _fit_families
    from distir.hardware.fit import OpSample

    bw, launch = 100e9, 5e-6
    sizes = [1 << k for k in range(12, 12 + OP_FIT_SAMPLES + 1)]
    samples = [
        OpSample(op, "grad", "f32", 0.0, float(n), launch + n / (bw * eff))
        for op, eff in (("FastGrad", 0.6), ("SlowGrad", 0.1))
        for n in sizes
    ]
    fits = _fit_families(samples, lambda dt: 1e15, bw)
    assert set(fits) == {"grad", "FastGrad", "SlowGrad"}
    assert fits["FastGrad"].memory == pytest.approx(0.6, rel=0.1)
    assert fits["SlowGrad"].memory == pytest.approx(0.1, rel=0.1)
    assert fits["FastGrad"].launch_s == pytest.approx(launch, rel=0.2, abs=1e-6)
    # the family's one fit lies between: it prices neither op right
    assert 0.1 * 1.2 < fits["grad"].memory < 0.6 / 1.2
    few = [s for s in samples if s.op == "FastGrad"][: OP_FIT_SAMPLES - 1]
    assert set(_fit_families(few, lambda dt: 1e15, bw)) == {"grad"}  # too few points: the family only


def test_on_a_cpu_ops_are_timed_on_the_thread_s_cpu_time_which_waiting_does_not_add_to() -> None:
    """A call that sleeps 2 ms (as a thread does when other processes hold the cores) costs
    ~0 on the CPU clock, 2 ms on the wall clock."""
    import time

    from distir.backend.microbench import op_clock, time_call

    def nap() -> None:
        time.sleep(0.002)

    assert time_call(nap, lambda: None, 0.004, 2, op_clock("cpu")) < 0.0005
    assert time_call(nap, lambda: None, 0.004, 2, op_clock("cuda")) >= 0.002


def test_adam_is_timed_on_a_non_negative_second_moment_as_training_has() -> None:
    """A mean of squares is never negative; a negative one makes Adam's square root NaN, a slow
    path on CPUs (which inflated its calibrated rate several times)."""
    from distir.backend import microbench as mb
    from distir.ir.types import DType
    from distir.ops import REGISTRY

    v = REGISTRY["Adam"].inputs.index("v")
    adams = [c for c, _ in mb.plan(mb.FULL, (DType.f32,)) if c.op == "Adam"]
    assert adams and all(c.nonneg == (v,) for c in adams)


def test_the_bandwidth_ignores_adds_that_take_about_their_launch() -> None:
    """An Add barely longer than the launch overhead would divide its bytes by a near-zero
    remainder (a bandwidth of petabytes per second, which the cluster loader refuses): only the
    Adds that take at least twice the launch count; without any, the largest Add's plain rate."""
    from distir.backend.calibrate import _bandwidth
    from distir.hardware.fit import OpSample

    launch = 10e-6
    adds = [
        OpSample("Add", "elementwise", "f32", 1e3, 12e3, launch * 1.0001),  # 12 kB "in" 1 ns
        OpSample("Add", "elementwise", "f32", 1e6, 12e6, launch + 1e-3),  # 12 MB in 1 ms
        OpSample("Add", "elementwise", "f32", 1e7, 12e7, launch + 1.2e-2),  # 120 MB in 12 ms
    ]
    assert _bandwidth(adds, launch) == pytest.approx(12e9)
    assert _bandwidth(adds[:1], launch) == pytest.approx(12e3 / (launch * 1.0001))
