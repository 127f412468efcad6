"""Device/link/node specs (validation, peak FLOP/s per dtype) and the built-in presets."""

from __future__ import annotations

import json
import math
import tomllib

import pytest
from rich.console import Console

from distir.hardware.cluster import cluster_from_toml
from distir.hardware.presets import GIB, PRESETS, clusters_json, node_record, render_clusters_table
from distir.hardware.specs import DeviceSpec, HardwareError, LinkSpec, NodeSpec, SpecError
from distir.ir.types import DType


def dev(**kw: object) -> DeviceSpec:
    args: dict[str, object] = dict(
        name="X",
        fp32=1e12,
        tf32=8e12,
        fp16=16e12,
        bf16=15e12,
        memory_bandwidth=1e12,
        memory_bytes=GIB,
        launch_overhead_s=5e-6,
    )
    args.update(kw)
    return DeviceSpec(**args)  # type: ignore[arg-type]


def test_peak_flops_per_dtype() -> None:
    d = dev()
    assert d.peak_flops(DType.f32) == 1e12
    assert d.peak_flops(DType.f32, allow_tf32=True) == 8e12
    assert d.peak_flops(DType.f16) == 16e12
    assert d.peak_flops(DType.bf16) == 15e12
    assert d.peak_flops(DType.f64) == 0.5e12  # fp32 / 2 when fp64 is unknown
    assert dev(fp64=0.25e12).peak_flops(DType.f64) == 0.25e12
    for t in (DType.i8, DType.i32, DType.i64, DType.bool):
        assert d.peak_flops(t) == 1e12


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"fp32": -1.0}, "fp32 must be a positive finite number, got -1.0"),
        ({"bf16": 0}, "bf16 must be a positive finite number, got 0"),
        ({"tf32": math.inf}, "tf32 must be a positive finite number"),
        ({"fp16": "fast"}, "fp16 must be a number, got 'fast'"),
        ({"memory_bytes": 1.5}, "memory_bytes must be an int, got 1.5"),
        ({"memory_bandwidth": math.nan}, "memory_bandwidth must be a positive finite number"),
        ({"launch_overhead_s": -1e-6}, "launch_overhead_s must be a finite non-negative number"),
        ({"name": ""}, "name must be a non-empty string"),
        ({"fp64": 0.0}, "fp64 must be a positive finite number"),
    ],
)
def test_device_spec_validation(kw: dict[str, object], needle: str) -> None:
    with pytest.raises(SpecError) as e:
        dev(**kw)
    assert needle in str(e.value)
    assert isinstance(e.value, HardwareError)


def test_link_and_node_validation() -> None:
    assert LinkSpec(math.inf, 0.0).time(1e9) == 0.0
    assert LinkSpec(1e9, 1e-6).time(1e9) == pytest.approx(1 + 1e-6)
    assert LinkSpec(1e9, 5e-6).slower(LinkSpec(2e9, 9e-6)) == LinkSpec(1e9, 9e-6)
    with pytest.raises(SpecError, match="bandwidth must be a positive number, got 0"):
        LinkSpec(0, 1e-6)
    with pytest.raises(SpecError, match="latency_s must be a finite non-negative number, got -1"):
        LinkSpec(1e9, -1)
    link = LinkSpec(1e9, 1e-6)
    with pytest.raises(SpecError, match="node spec 'n': devices_per_node must be a positive int, got 0"):
        NodeSpec("n", dev(), 0, link, link)
    with pytest.raises(SpecError, match="intra must be a LinkSpec"):
        NodeSpec("n", dev(), 1, 3.0, link)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="node spec 'n': nics must be a positive int, got 0"):
        NodeSpec("n", dev(), 1, link, link, nics=0)


def test_network_share_of_a_group() -> None:
    link = LinkSpec(1e9, 1e-6)
    rails = NodeSpec("n", dev(), 8, link, link, nics=8)  # a NIC per GPU
    assert [rails.network_share(g) for g in (1, 2, 8)] == [1 / 8, 2 / 8, 1.0]
    pairs = NodeSpec("n", dev(), 16, link, link, nics=8)  # a NIC per GPU pair
    assert [pairs.network_share(g) for g in (1, 4, 8, 16)] == [1 / 8, 4 / 8, 1.0, 1.0]
    many = NodeSpec("n", dev(), 8, link, link, nics=32)  # 4 NICs per GPU
    assert [many.network_share(g) for g in (1, 8)] == [1 / 8, 1.0]
    assert NodeSpec("n", dev(), 4, link, link).network_share(1) == 1.0  # one shared NIC


def test_preset_figures_match_the_spec_sheets() -> None:
    a100 = PRESETS["dgx-a100"]
    assert a100.devices_per_node == 8
    d = a100.device
    assert (d.fp32, d.tf32, d.fp16, d.bf16) == (19.5e12, 156e12, 312e12, 312e12)  # dense
    assert d.memory_bandwidth == 2039e9 and d.memory_bytes == 80 * GIB
    assert a100.intra.bandwidth == 300e9  # 600 GB/s bidirectional NVLink3
    assert a100.inter.bandwidth == 8 * 200e9 / 8  # 8 × 200 Gb/s HDR

    h100 = PRESETS["h100"]
    assert h100.device.bf16 == 1979e12 / 2 and h100.device.tf32 == 989e12 / 2  # sparse figures halved
    assert h100.device.memory_bandwidth == 3350e9
    assert h100.intra.bandwidth == 450e9 and h100.inter.bandwidth == 400e9
    assert h100.nics == a100.nics == 8  # a ConnectX NIC beside each GPU (DGX H100, DGX A100)

    dgx2 = PRESETS["dgx2-v100"]
    assert dgx2.devices_per_node == 16 and dgx2.device.memory_bytes == 32 * GIB
    assert dgx2.device.fp16 == 125e12 and dgx2.device.fp32 == 15.7e12
    assert dgx2.device.tf32 == dgx2.device.fp32 and dgx2.device.bf16 == dgx2.device.fp32  # no TF32/BF16
    assert dgx2.intra.bandwidth == 150e9 and dgx2.inter.bandwidth == 100e9

    p3, g4 = PRESETS["p3.8xlarge"], PRESETS["g4dn.12xlarge"]
    assert p3.devices_per_node == 4 and p3.device.memory_bytes == 16 * GIB
    assert p3.inter.bandwidth == 1.25e9  # 10 Gb/s
    assert g4.device.fp16 == 65e12 and g4.device.memory_bandwidth == 320e9
    assert g4.intra.bandwidth == 15.75e9 and g4.inter.bandwidth == 6.25e9  # PCIe3 x16; 50 Gb/s

    local = PRESETS["local"]
    assert local.devices_per_node == 1
    assert "uncalibrated" in local.device.name and "distir calibrate" in local.source


def test_every_preset_has_a_source_and_sane_latencies() -> None:
    for key, node in PRESETS.items():
        assert node.name == key and node.source
        if key != "local":
            assert node.source.startswith("https://")
            assert node.device.launch_overhead_s == 5e-6
            assert 1e-6 <= node.intra.latency_s <= 10e-6
            assert 5e-6 <= node.inter.latency_s <= 50e-6


def _toml(v: object) -> str:
    """A TOML value: strings quoted, lists and tables inline."""
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + " }"
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return str(v)


def test_clusters_json_rows_are_valid_toml_node_types() -> None:
    data = clusters_json()
    assert [r["preset"] for r in data["clusters"]] == list(PRESETS)
    for rec in data["clusters"]:
        fields = {k: v for k, v in rec.items() if k != "preset"}
        body = "\n".join(f"{k} = {_toml(v)}" for k, v in fields.items())
        text = f'[types.x]\nnode_name = "{rec["preset"]}"\n{body}\n[[nodes]]\ntype = "x"\n'
        tomllib.loads(text)
        assert cluster_from_toml(text).nodes[0] == PRESETS[rec["preset"]]


def test_node_record_units() -> None:
    r = node_record("dgx-a100", PRESETS["dgx-a100"])
    assert r["tf32_tflops"] == 156.0 and r["memory_gib"] == 80.0
    assert r["intra_latency_us"] == 3.0 and r["inter_bandwidth_gb_s"] == 200.0


def test_render_clusters_table() -> None:
    t = render_clusters_table()
    assert t.row_count == len(PRESETS)
    headers = [str(c.header) for c in t.columns]
    assert headers[0] == "preset" and headers[-1] == "source" and len(headers) == 14
    assert "GEMM" in headers and "runtime" in headers
    console = Console(width=400, record=True)
    console.print(t)
    text = console.export_text()
    assert "A100-SXM-80GB" in text and "2039" in text and "1.25" in text
    assert "[3] https://www.nvidia.com/en-us/data-center/h100/" in text
    # every GEMM figure and the runtime memory state their sources
    assert (
        text.count("    GEMM: ") == len(PRESETS) and "arXiv:1803.04014" in text and "ml-engineering" in text
    )
    assert "Runtime memory: " in text and "NCCL_BUFFSIZE" in text


def test_a_host_in_a_cluster_file() -> None:
    """A node type's ``[types.x.host]`` table: a preset's host kept and overridden key by key, a new
    one with every figure given; a bad figure is a one-line error naming the key."""
    nodes = '[[nodes]]\ntype = "n"\n'
    kept = cluster_from_toml('[types.n]\npreset = "ndm-a100-v4"\n' + nodes).nodes[0]
    assert kept.host == PRESETS["ndm-a100-v4"].host
    over = cluster_from_toml('[types.n]\npreset = "ndm-a100-v4"\n[types.n.host]\npcie_gb_s = 16\n' + nodes)
    h = over.nodes[0].host
    assert h is not None and h.pcie.bandwidth == 16e9 and h.cores == 96
    new = "[types.n.host]\nname = 'cpu'\ncores = 8\ntflops = 1\nmemory_bandwidth_gb_s = 100\n"
    new += "memory_gib = 64\npcie_gb_s = 16\npcie_latency_us = 5\n"
    got = cluster_from_toml('[types.n]\npreset = "dgx-a100"\n' + new + nodes).nodes[0].host
    assert got is not None and got.memory_bandwidth == 100e9 and got.pcie.latency_s == pytest.approx(5e-6)
    with pytest.raises(HardwareError, match=r"types\.n\.host.*memory_efficiency"):
        cluster_from_toml(
            '[types.n]\npreset = "ndm-a100-v4"\n[types.n.host]\nmemory_efficiency = 2\n' + nodes
        )
    with pytest.raises(HardwareError, match=r"types\.n\.host\.cores"):
        cluster_from_toml('[types.n]\npreset = "dgx-a100"\n[types.n.host]\nname = "x"\n' + nodes)
