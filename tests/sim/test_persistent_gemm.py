"""Persistent GEMM kernels beside a collective (``GemmProfile.persistent``, ``overlap_share``,
``RooflineCostModel.gemm_share``): the H100's cuBLAS GEMMs run in two waves beside NCCL's CTAs,
the A100's slow by the SMs NCCL holds; the share the simulator charges, and cluster files."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from distir.hardware.cluster import load_cluster_file, parse_cluster
from distir.hardware.presets import clusters_json, render_clusters_table
from distir.hardware.specs import ClusterError, SpecError
from distir.sim.cost import RooflineCostModel


def _profile(name: str):  # type: ignore[no-untyped-def]
    g = parse_cluster(name).device_spec(0).gemm
    assert g is not None
    return g


def test_h100_gemms_are_persistent_and_run_in_two_waves_beside_nccl() -> None:
    g = _profile("h100")
    assert g.persistent and "pytorch/issues/143988" in g.persistent_source
    assert g.gemm_waves == 2  # 132 CTAs, 108 free SMs beside NCCL's 24
    assert not _profile("dgx-a100").persistent and _profile("dgx-a100").gemm_waves == 1


def test_overlap_share_runs_from_the_sm_share_to_the_waves() -> None:
    g = _profile("h100")
    s = g.comm_share
    assert g.overlap_share() == s  # the GEMMs' share not known: the SMs NCCL holds
    assert g.overlap_share(0.0) == pytest.approx(s)
    assert g.overlap_share(1.0) == pytest.approx(0.5)  # all GEMMs: half the speed
    # 70% GEMMs at half speed, 30% of other kernels at 1 - s: a unit of work takes 2·0.7 + 0.3/(1 - s)
    assert g.overlap_share(0.7) == pytest.approx(1 - 1 / (1.4 + 0.3 / (1 - s)))
    shares = [g.overlap_share(f / 10) for f in range(11)]
    assert shares == sorted(shares)
    a = _profile("dgx-a100")
    assert a.overlap_share(0.7) == a.comm_share  # not persistent: the rate model whatever the mix
    assert replace(g, comm_sms=0).overlap_share(0.7) == 0.0  # nothing held, nothing lost
    for bad in (-0.1, 1.5):
        with pytest.raises(SpecError, match="share of the compute"):
            g.overlap_share(bad)


def test_waves_grow_when_nccl_holds_more_than_half_the_sms() -> None:
    g = _profile("h100")
    assert replace(g, comm_sms=66).gemm_waves == 2
    assert replace(g, comm_sms=67).gemm_waves == 3  # 65 free SMs for 132 CTAs


def test_the_cost_model_charges_the_share_at_its_gemm_share() -> None:
    h100, a100 = parse_cluster("h100"), parse_cluster("dgx-a100")
    g = _profile("h100")
    assert RooflineCostModel(h100).interference(0) == g.comm_share
    assert RooflineCostModel(h100, gemm_share=0.8).interference(0) == g.overlap_share(0.8)
    assert RooflineCostModel(h100, gemm_share=0.8, comm_interference=False).interference(0) == 0.0
    assert RooflineCostModel(a100, gemm_share=0.8).interference(0) == _profile("dgx-a100").comm_share


def test_persistent_must_be_a_bool() -> None:
    with pytest.raises(SpecError, match="persistent must be a bool"):
        replace(_profile("h100"), persistent=1)


def test_clusters_name_the_source() -> None:
    cl = parse_cluster("h100")
    (rec,) = clusters_json(cl)["clusters"]
    assert rec["matmul_persistent"] is True and "cutlass/issues/2471" in rec["matmul_persistent_source"]
    console = Console(record=True, width=200)
    console.print(render_clusters_table(cl))
    assert "GEMM kernels: persistent" in " ".join(console.export_text().split())
    (a,) = clusters_json(parse_cluster("dgx-a100"))["clusters"]
    assert "matmul_persistent" not in a


def _write(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text('name = "c"\n[types.x]\npreset = "dgx-a100"\n' + body + '[[nodes]]\ntype = "x"\n')
    return p


def test_a_cluster_file_sets_persistent_gemms(tmp_path: Path) -> None:
    cl = load_cluster_file(_write(tmp_path, 'matmul_persistent = true\nmatmul_persistent_source = "s"\n'))
    g = cl.device_spec(0).gemm
    assert g is not None and g.persistent and g.persistent_source == "s" and g.gemm_waves == 2
    with pytest.raises(ClusterError, match="matmul_persistent: expected true or false"):
        load_cluster_file(_write(tmp_path, "matmul_persistent = 1\n"))
