"""A calibrated profile: written as a cluster file, it loads back with the fitted figures, the cost
model and the collectives use them, and `distir simulate --cluster profile.toml` runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from distir.cli import app
from distir.hardware.cluster import cluster_from_toml, load_cluster_file, parse_cluster
from distir.hardware.fit import FamilyFit, GemmFit, LinkFit, Quality
from distir.hardware.gemm import GemmShape, gemm_efficiency, shape_factor
from distir.hardware.profile import Calibration, profile_toml
from distir.hardware.specs import ClusterError, LinkSpec
from distir.ir.types import Device, DType, TensorType
from distir.ir.values import Attrs
from distir.ops.registry import REGISTRY
from distir.sim import collectives as coll
from distir.sim.cost import RooflineCostModel

Q = Quality(0.05, 0.2, 10)


def _calibration() -> Calibration:
    gemm = GemmFit(
        {"f32": 90e9, "bf16": 40e9}, 4, (512, 512, 512), shape_factor(GemmShape(1, 512, 512, 512), 4), Q
    )
    families = {
        "elementwise": FamilyFit(0.1, 0.7, 1.5e-6, True, True, Q),
        "nn": FamilyFit(0.2, 0.3, 4e-6, True, False, Q),
        "shape": FamilyFit(1.0, 1.0, 3e-6, False, False, Q),
    }
    links = {
        "p2p": LinkFit(LinkSpec(2e9, 50e-6), Q),
        "allreduce": LinkFit(LinkSpec(1e9, 150e-6), Q),
        "allgather": LinkFit(LinkSpec(1.5e9, 100e-6), Q),
    }
    return Calibration(
        "testhost",
        "2026-01-01 00:00 UTC",
        "synthetic",
        "CPU test",
        2,
        8 << 30,
        1.2e-6,
        30e9,
        gemm,
        families,
        links,
        {"broadcast": "the times do not grow"},
    )


def test_profile_round_trips_through_the_cluster_loader() -> None:
    cal = _calibration()
    text = profile_toml(cal)
    assert "#   broadcast: not fitted, runs on the point-to-point link (the times do not grow)" in text
    cl = cluster_from_toml(text, "profile.toml")
    assert cl.num_devices == 2 and cl.name == "calibrated-testhost"
    node = cl.nodes[0]
    d = node.device
    assert d.fp32 == pytest.approx(90e9, rel=1e-5) and d.bf16 == pytest.approx(40e9, rel=1e-5)
    assert d.fp16 == d.bf16 and d.tf32 == d.fp32  # not measured: stated in the source
    assert d.memory_bandwidth == pytest.approx(30e9, rel=1e-5)
    assert d.launch_overhead_s == pytest.approx(1.2e-6, rel=1e-5)
    assert d.runtime.fixed_bytes == 0 and d.runtime.fragmentation == 0
    assert d.gemm is not None and d.gemm.sms == 4 and d.gemm.anchor == (512, 512, 512)
    # the curve through the anchor with ceiling 1: the fitted one
    assert gemm_efficiency(d.gemm, GemmShape(1, 100, 300, 70), fp32=True) == pytest.approx(
        shape_factor(GemmShape(1, 100, 300, 70), 4), rel=1e-5
    )
    rates = d.family_rates("nn")
    assert rates is not None and (rates.flop, rates.memory) == pytest.approx((0.2, 0.3))
    assert rates.launch_s == pytest.approx(4e-6)
    assert node.intra.bandwidth == pytest.approx(2e9) and node.intra.latency_s == pytest.approx(50e-6)
    assert node.intra_for("allreduce").bandwidth == pytest.approx(1e9)
    assert node.intra_for("broadcast") == node.intra  # not fitted: the p2p link
    for what in ("source", "matmul_source", "runtime_memory_source"):
        assert "calibrated on testhost, 2026-01-01 00:00 UTC, by distir calibrate" in (
            node.source
            if what == "source"
            else d.gemm.source
            if what == "matmul_source"
            else d.runtime.source
        )


def test_calibrated_rates_drive_the_cost_model() -> None:
    """An nn op costs launch + max(FLOPs/(peak·flop), bytes/(bw·memory)) with the family's figures;
    a family without rates keeps the model's defaults and the device launch."""
    cl = cluster_from_toml(profile_toml(_calibration()))
    model = RooflineCostModel(cl)
    x = TensorType(DType.f32, (256, 1024), Device(0))
    sm = REGISTRY["Softmax"]
    outs = sm.infer_types([x], Attrs({}), [None])
    flops = sm.flops([x], outs, Attrs({}))
    nbytes = sm.bytes_read([x], outs, Attrs({})) + sm.bytes_written([x], outs, Attrs({}))
    want = 4e-6 + max(flops / (90e9 * 0.2), nbytes / (30e9 * 0.3))
    assert model.compute_time(sm, [x], outs, Attrs({}), 0) == pytest.approx(want, rel=1e-5)
    rs = REGISTRY["ReduceSum"]
    attrs = Attrs({"axes": (-1,)})
    routs = rs.infer_types([x], attrs, [None])
    rflops = rs.flops([x], routs, attrs)
    rbytes = rs.bytes_read([x], routs, attrs) + rs.bytes_written([x], routs, attrs)
    want = 1.2e-6 + max(rflops / (90e9 * 0.5), rbytes / (30e9 * 0.8))
    assert model.compute_time(rs, [x], routs, attrs, 0) == pytest.approx(want, rel=1e-5)


def test_a_zero_work_op_costs_its_calibrated_family_launch() -> None:
    """A Reshape moves nothing: 0 on an uncalibrated device, the shape family's launch when
    measured (eager execution pays its dispatch)."""
    x = TensorType(DType.f32, (8, 16), Device(0))
    op, attrs = REGISTRY["Reshape"], Attrs({"shape": (128,)})
    outs = op.infer_types([x], attrs, [None])
    cal = RooflineCostModel(cluster_from_toml(profile_toml(_calibration())))
    assert cal.compute_time(op, [x], outs, attrs, 0) == pytest.approx(3e-6)
    assert RooflineCostModel(parse_cluster("dgx-a100")).compute_time(op, [x], outs, attrs, 0) == 0.0


def test_calibrated_links_drive_the_collectives() -> None:
    cl = cluster_from_toml(profile_toml(_calibration()))
    m = 1 << 20
    assert coll.allreduce_time(cl, m, [0, 1]) == pytest.approx(2 * 1 / 2 * m / 1e9 + 2 * 150e-6, rel=1e-5)
    assert coll.allgather_time(cl, m, [0, 1]) == pytest.approx(m / 2 / 1.5e9 + 100e-6, rel=1e-5)
    # not calibrated: the point-to-point link (intra)
    assert coll.broadcast_time(cl, m, [0, 1]) == pytest.approx(m / 2e9 + 50e-6, rel=1e-5)
    assert coll.send_time(cl, m, 0, 1) == pytest.approx(m / 2e9 + 50e-6, rel=1e-5)


def test_simulate_runs_on_the_profile(tmp_path: Path) -> None:
    path = tmp_path / "profile.toml"
    path.write_text(profile_toml(_calibration()), encoding="utf-8")
    r = CliRunner().invoke(
        app,
        [
            "simulate",
            "--cluster",
            str(path),
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
    data = json.loads(r.stdout)
    assert data["step_time_s"] > 0
    r = CliRunner().invoke(app, ["clusters", "--cluster", str(path), "--json"])
    assert r.exit_code == 0, r.stderr
    rec = json.loads(r.stdout)["clusters"][0]
    assert "calibrated on testhost" in rec["source"] and set(rec["families"]) == {
        "elementwise",
        "nn",
        "shape",
    }
    assert set(rec["collectives"]) == {"allreduce", "allgather"}
    r = CliRunner().invoke(app, ["clusters", "--cluster", str(path)])
    assert r.exit_code == 0 and "calibrated on testhost" in r.stdout


def test_existing_cluster_files_stay_valid() -> None:
    root = Path(__file__).resolve().parents[2] / "bench" / "clusters"
    for f in sorted(root.glob("*.toml")):
        cl = load_cluster_file(f)
        # nothing measured on this machine: per-collective links only as published (with sources)
        assert all((not n.collectives or n.collectives_source) and not n.device.families for n in cl.nodes)


@pytest.mark.parametrize(
    ("body", "key", "what"),
    [
        (
            "[types.local.families.loss]\nflop_efficiency = 1.5\nmemory_efficiency = 0.5\nlaunch_us = 1",
            "flop_efficiency",
            "fraction",
        ),
        (
            "[types.local.families.loss]\nflop_efficiency = 0.5\nmemory_efficiency = 0.5",
            "launch_us",
            "missing",
        ),
        (
            "[types.local.collectives.allreduse]\nbandwidth_gb_s = 1\nlatency_us = 1",
            "allreduse",
            "did you mean allreduce",
        ),
        (
            "[types.local.collectives.broadcast]\nbandwidth_gb_s = -1\nlatency_us = 1",
            "bandwidth_gb_s",
            "positive",
        ),
    ],
)
def test_bad_calibrated_tables_are_located_errors(body: str, key: str, what: str) -> None:
    text = profile_toml(_calibration()).replace("[[nodes]]", body + "\n\n[[nodes]]")
    with pytest.raises(ClusterError) as e:
        cluster_from_toml(text, "p.toml")
    msg = str(e.value)
    assert msg.startswith("p.toml:") and key in msg and what in msg


def test_the_arrival_check_is_stated_and_changes_no_figure() -> None:
    """The rank loop's overheads enter the launch times and link latencies; the arrival check
    (a call one rank waits for) is only stated: the loaded cluster is the same without it."""
    from distir.hardware.fit import Overheads

    base = _calibration()._replace(insitu=Overheads(2e-6, 80e-6, 60e-6))
    checked = base._replace(insitu=Overheads(2e-6, 80e-6, 60e-6, 125e-6))
    text = profile_toml(checked)
    assert "a collective call one rank waits for, asleep: +125 µs" in text
    assert "+125" not in profile_toml(base)
    a, b = cluster_from_toml(profile_toml(base), "a.toml"), cluster_from_toml(text, "b.toml")
    assert a.nodes == b.nodes
