"""The DGX presets' collectives at NCCL's published bus bandwidth.

Oracle: the alpha-beta ring formulas written out by hand with the published figures typed in
here from their sources (not read from the presets): nccl-tests' busbw is the B at which the
ring formula gives the measured time, so a collective of M bytes on n GPUs of one node takes
2(n−1)/n·M/busbw (all-reduce) or (n−1)/n·M/busbw (all-gather, reduce-scatter) plus 3 µs a step;
across nodes each NIC carries NCCL's measured share of its line rate.

- DGX A100, inside the node: ~230 GB/s for every ring collective (NCCL's maintainer,
  NVIDIA/nccl-tests#149); across nodes 24 of each 200 Gb/s NIC's 25 GB/s (192 GB/s over 8 HDR
  NICs, NVIDIA/nccl#812; NVIDIA/nccl-tests#160).
- DGX H100, inside the node: all-reduce ~480 GB/s on NVLink SHARP, other ring collectives
  ~370 (NCCL's maintainer, NVIDIA/nccl-tests#212); measured all-gather 350, reduce-scatter 360
  (NVIDIA/nccl#1281); across nodes 46-48 of each 400 Gb/s NIC's 50 GB/s (NVIDIA/nccl-tests#290).
"""

from __future__ import annotations

import pytest
from rich.console import Console

from distir.hardware.cluster import cluster_from_toml, parse_cluster
from distir.hardware.presets import PRESETS, render_clusters_table
from distir.hardware.specs import ClusterError, LinkSpec, NodeSpec, SpecError
from distir.sim.collectives import (
    allgather_time,
    allreduce_time,
    broadcast_time,
    reducescatter_time,
    send_time,
)

M = 1e9
BIG = 16 * 2**30  # where the presets' all-reduce curves have reached their peak
STEP, NET_STEP = 3e-6, 5e-6
NODE = list(range(8))


def close(x: float) -> object:
    return pytest.approx(x, rel=1e-12, abs=0.0)


def test_dgx_a100_inside_a_node_runs_at_230_gb_s() -> None:
    c = parse_cluster("dgx-a100")
    # all-reduce at a size its measured curve (below) has reached the peak
    assert allreduce_time(c, BIG, NODE) == close(2 * 7 / 8 * BIG / 230e9 + 14 * STEP)
    assert allgather_time(c, M, NODE) == close(7 / 8 * M / 230e9 + 7 * STEP)
    assert reducescatter_time(c, M, NODE) == close(7 / 8 * M / 230e9 + 7 * STEP)
    assert broadcast_time(c, M, NODE) == close(M / 230e9 + 7 * STEP)
    # 16 GiB all-reduce: the measured 234.89 GB/s busbw (ml-engineering's nccl-tests sweep) is
    # within 2% of the maintainer's ~230
    t = allreduce_time(c, 16 * 2**30, NODE)
    assert 2 * 7 / 8 * 16 * 2**30 / t == pytest.approx(234.89e9, rel=0.025)


def test_dgx_h100_inside_a_node_per_collective() -> None:
    c = parse_cluster("h100")
    assert allreduce_time(c, BIG, NODE) == close(2 * 7 / 8 * BIG / 480e9 + 14 * STEP)
    # the all-gather and reduce-scatter links alone: their curves end at 8 GiB below the peak
    # and keep that bandwidth beyond (test_busbw_curves)
    assert allgather_time(c, BIG, NODE, measured=False) == close(7 / 8 * BIG / 350e9 + 7 * STEP)
    assert reducescatter_time(c, BIG, NODE, measured=False) == close(7 / 8 * BIG / 360e9 + 7 * STEP)
    assert broadcast_time(c, M, NODE) == close(M / 370e9 + 7 * STEP)


def test_small_messages_pay_the_ring_steps() -> None:
    # 32 KiB on 8 A100s: 14 steps of 3 µs, near the measured 43.8 µs of all_reduce_perf
    t = allreduce_time(parse_cluster("dgx-a100"), 32 * 1024, NODE)
    assert t == pytest.approx(43.83e-6, rel=0.05)


@pytest.mark.parametrize(("preset", "nic"), [("dgx-a100", 24e9), ("h100", 47e9)])
def test_across_nodes_a_gpu_crosses_at_ncc_ls_share_of_its_nic(preset: str, nic: float) -> None:
    c = parse_cluster(f"{preset}:16")
    group = range(2, 128, 8)  # one GPU on each of 16 nodes (tensor parallelism filling the node)
    assert allreduce_time(c, M, group) == close(2 * 15 / 16 * M / nic + 2 * 15 * NET_STEP)
    assert allgather_time(c, M, group) == close(15 / 16 * M / nic + 15 * NET_STEP)
    assert send_time(c, M, 0, 8) == close(NET_STEP + M / nic)


def test_whole_nodes_across_the_network_reach_ncc_ls_published_bus_bandwidth() -> None:
    # NCCL's ring through the nodes runs at its slowest link: on DGX A100s the 8 NICs (8 × 24 =
    # 192 GB/s, the NCCL team's measured all-reduce busbw, NVIDIA/nccl#812); on DGX H100s NVLink
    # (reduce-scatter 360, all-gather 350; NVLink SHARP's 480 is a whole node's all-reduce) below
    # the 8 × 47 = 376 GB/s of the NICs
    big = 8 * 2**30
    for preset, nodes, busbw in (("dgx-a100", 4, 192e9), ("dgx-a100", 16, 192e9), ("h100", 4, 355e9)):
        n = 8 * nodes
        t = allreduce_time(parse_cluster(f"{preset}:{nodes}"), big, range(n))
        assert 2 * (n - 1) / n * big / t == pytest.approx(busbw, rel=0.015), (preset, nodes)
    c = parse_cluster("h100:4")
    ring = 31 / 32 * M / 360e9 + 31 / 32 * M / 350e9 + 2 * 28 * STEP + 6 * NET_STEP
    assert allreduce_time(c, M, range(32)) == close(ring)
    assert allgather_time(c, M, range(32)) == close(31 / 32 * M / 350e9 + 28 * STEP + 3 * NET_STEP)


def test_clusters_table_names_the_sources() -> None:
    console = Console(width=400, record=True)
    console.print(render_clusters_table())
    text = " ".join(console.export_text().split())  # the caption wraps
    assert text.count("collectives (GB/s inside the node)") == 3  # dgx-a100, ndm-a100-v4, h100
    for ref in ("nccl-tests/issues/149", "nccl/issues/812", "nccl-tests/issues/212", "nccl-tests/issues/290"):
        assert ref in text
    assert "network at 96% of the NICs' rate" in text and "network at 94% of the NICs' rate" in text
    assert "] measured: families" not in text  # published figures are not a calibration


def test_network_efficiency_in_cluster_files_and_specs() -> None:
    nodes = '[[nodes]]\ntype = "n"\ncount = 2\n'
    inherited = cluster_from_toml('[types.n]\npreset = "dgx-a100"\n' + nodes)
    assert inherited.nodes[0].network_efficiency == 24 / 25
    assert inherited.nodes[0].collectives == PRESETS["dgx-a100"].collectives
    line_rate = cluster_from_toml('[types.n]\npreset = "dgx-a100"\nnetwork_efficiency = 1\n' + nodes)
    assert line_rate.link(0, 8) == LinkSpec(25e9, NET_STEP)
    with pytest.raises(ClusterError, match=r"types\.n\.network_efficiency.*\(0, 1\]"):
        cluster_from_toml('[types.n]\npreset = "dgx-a100"\nnetwork_efficiency = 1.5\n' + nodes)
    with pytest.raises(ClusterError, match=r"types\.n\.network_efficiency"):
        cluster_from_toml('[types.n]\npreset = "dgx-a100"\nnetwork_efficiency = 0\n' + nodes)
    link = LinkSpec(1e9, 1e-6)
    d = PRESETS["dgx-a100"].device
    with pytest.raises(SpecError, match="network_efficiency must be at most 1"):
        NodeSpec("n", d, 1, link, link, network_efficiency=1.2)
    with pytest.raises(SpecError, match="network_efficiency must be a positive"):
        NodeSpec("n", d, 1, link, link, network_efficiency=0.0)
