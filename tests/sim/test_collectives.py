"""Alpha-beta collective models, each checked against arithmetic written out by hand.

Test cluster ``two``: 2 nodes × 4 GPUs (GPUs 0-3 on node 0, 4-7 on node 1), NVLink-like intra
links of 100 GB/s and α = 5 µs, a network of 10 GB/s per node and α = 20 µs. M = 1 GB.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from distir.hardware.cluster import Cluster, parse_cluster
from distir.hardware.presets import GIB
from distir.hardware.specs import ClusterError, DeviceSpec, LinkSpec, NodeSpec
from distir.sim import collectives as coll
from distir.sim.collectives import (
    COLLECTIVES,
    CollectiveError,
    allgather_time,
    allreduce_time,
    alltoall_time,
    broadcast_time,
    gather_time,
    reduce_time,
    reducescatter_time,
    scatter_time,
    send_time,
)

M = 1e9
B, A = 100e9, 5e-6  # intra-node
BN, AN = 10e9, 20e-6  # network, per node
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "amp_hetero.toml"


def node(gpus: int = 4, name: str = "n") -> NodeSpec:
    d = DeviceSpec("X", 1e12, 1e12, 2e12, 2e12, 1e12, GIB, 5e-6)
    return NodeSpec(name, d, gpus, LinkSpec(B, A), LinkSpec(BN, AN))


two = Cluster("two", (node(), node()))
ONE_NODE = [0, 1, 2, 3]
ALL = list(range(8))


def close(x: float) -> object:
    return pytest.approx(x, rel=1e-12, abs=0.0)


# -- inside one node ----------------------------------------------------------------------------


def test_send() -> None:
    assert send_time(two, M, 0, 1) == close(A + M / B)
    assert send_time(two, M, 0, 5) == close(AN + M / BN)
    assert send_time(two, M, 3, 3) == 0.0  # two streams of one GPU
    assert send_time(two, 0, 0, 1) == close(A)


def test_allreduce_one_node_ring() -> None:
    # 2·3/4·1e9/1e11 + 2·3·5e-6 = 0.015 + 3e-5
    assert allreduce_time(two, M, ONE_NODE) == close(2 * 3 / 4 * M / B + 2 * 3 * A)
    assert allreduce_time(two, M, ONE_NODE) == close(0.01503)


def test_allgather_reducescatter_one_node() -> None:
    # 3/4·1e9/1e11 + 3·5e-6 = 0.0075 + 1.5e-5
    assert allgather_time(two, M, ONE_NODE) == close(0.0075 + 1.5e-5)
    assert reducescatter_time(two, M, ONE_NODE) == close(0.0075 + 1.5e-5)


def test_broadcast_reduce_one_node() -> None:
    # pipelined: 1e9/1e11 + 3·5e-6 = 0.01 + 1.5e-5
    assert broadcast_time(two, M, ONE_NODE) == close(0.01 + 1.5e-5)
    assert reduce_time(two, M, ONE_NODE) == close(0.01 + 1.5e-5)


def test_scatter_gather_alltoall_one_node() -> None:
    # (n−1)/n·M/B + (n−1)α = 3/4·1e9/1e11 + 3·5e-6
    expected = 0.0075 + 1.5e-5
    assert scatter_time(two, M, ONE_NODE) == close(expected)
    assert gather_time(two, M, ONE_NODE, root=2) == close(expected)
    assert alltoall_time(two, M, ONE_NODE) == close(expected)


def test_groups_of_one_duplicates_and_errors() -> None:
    for f in COLLECTIVES.values():
        assert f(two, M, [3]) == 0.0
        assert f(two, M, [3, 3]) == 0.0  # duplicates collapse
        with pytest.raises(CollectiveError, match="empty group"):
            f(two, M, [])
        with pytest.raises(CollectiveError, match="nbytes must be a finite non-negative number, got -1"):
            f(two, -1, [0, 1])
        with pytest.raises(ClusterError, match="no GPU 8"):
            f(two, M, [0, 8])
    assert allreduce_time(two, M, [0, 0, 1, 1, 2]) == allreduce_time(two, M, [2, 1, 0])
    assert allreduce_time(two, M, [0, 1]) == close(2 * 1 / 2 * M / B + 2 * A)
    with pytest.raises(CollectiveError, match="root GPU 5 is not in the group"):
        scatter_time(two, M, [0, 1], root=5)
    assert COLLECTIVES["allreduce"] is allreduce_time and len(COLLECTIVES) == 8


# -- hierarchical, across nodes -----------------------------------------------------------------


def test_allreduce_hierarchical_two_nodes() -> None:
    rs = 3 / 4 * M / B + 3 * A  # intra-node reduce-scatter: 0.0075 + 1.5e-5
    inter = 2 * 1 / 2 * M / BN + 2 * 1 * AN  # ring over 2 nodes: 0.1 + 4e-5
    ag = rs  # intra-node all-gather
    assert allreduce_time(two, M, ALL) == close(rs + inter + ag)
    assert allreduce_time(two, M, ALL) == close(2 * 0.007515 + 0.10004)


def test_allreduce_one_gpu_per_node_is_a_ring_over_the_network() -> None:
    # GPUs 0 and 4: no intra phases; 2·1/2·M/BN + 2·AN
    assert allreduce_time(two, M, [0, 4]) == close(M / BN + 2 * AN)


def test_allreduce_unequal_gpus_per_node() -> None:
    # node 0 holds 0,1,2 (g=3), node 1 holds 4 (g=1): node 0's phases govern
    rs = 2 / 3 * M / B + 2 * A
    assert allreduce_time(two, M, [0, 1, 2, 4]) == close(rs + (M / BN + 2 * AN) + rs)


def test_allgather_reducescatter_across_nodes_run_one_ring() -> None:
    # NCCL's ring through both nodes, pipelined: every link carries (n−1)/n·M, the slowest (the
    # node's one 10 GB/s NIC) governs; 7 steps, 1 of them across the network: 6·5 µs + 1·20 µs
    expected = 7 / 8 * M / BN + 6 * A + AN
    assert expected == close(0.0875 + 5e-5)
    assert allgather_time(two, M, ALL) == close(expected)
    assert reducescatter_time(two, M, ALL) == close(expected)


def test_allreduce_across_nodes_takes_the_faster_of_ring_and_hierarchy() -> None:
    # ring: a reduce-scatter ring then an all-gather ring, 14 steps of which 2 cross
    ring = 2 * (7 / 8 * M / BN + 6 * A + AN)
    hierarchical = 2 * (3 / 4 * M / B + 3 * A) + (M / BN + 2 * AN)
    assert hierarchical < ring  # one NIC a node: reducing inside the node first moves fewer bytes
    assert allreduce_time(two, M, ALL) == close(hierarchical)
    fast_net = Cluster("f", (node(), node()), inter_node=LinkSpec(200e9, AN))
    ring = 2 * (7 / 8 * M / B + 6 * A + AN)  # the network no longer the slowest link
    hierarchical = 2 * (3 / 4 * M / B + 3 * A) + (M / 200e9 + 2 * AN)
    assert ring < hierarchical
    assert allreduce_time(fast_net, M, ALL) == close(ring)


def test_broadcast_reduce_hierarchical() -> None:
    # across nodes M/BN + 1·AN, then inside a node M/B + 3·A
    expected = (0.1 + 2e-5) + (0.01 + 1.5e-5)
    assert broadcast_time(two, M, ALL) == close(expected)
    assert reduce_time(two, M, ALL) == close(expected)


def test_scatter_gather_hierarchical_depends_on_the_root() -> None:
    # root 0: node 1's share (8−4)/8·M crosses the network (+1·AN); each node scatters 3/8·M inside
    expected = (4 / 8 * M / BN + AN) + (3 / 8 * M / B + 3 * A)
    assert scatter_time(two, M, ALL) == close(expected) == close(0.05002 + 0.00375 + 1.5e-5)
    assert gather_time(two, M, ALL, root=6) == close(expected)
    # group {0,1,2} on node 0 and {4} on node 1
    root4 = (3 / 4 * M / BN + AN) + (2 / 4 * M / B + 2 * A)  # 3 of 4 shares leave node 1
    root0 = (1 / 4 * M / BN + AN) + (2 / 4 * M / B + 2 * A)  # 1 of 4 shares leaves node 0
    assert scatter_time(two, M, [4, 0, 1, 2]) == close(root4)  # default root: first as given
    assert scatter_time(two, M, [4, 0, 1, 2], root=0) == close(root0)


def test_alltoall_hierarchical_limited_by_node_bandwidth() -> None:
    # per node: max(intra 3/8·M/B, network 4·4/8·M/BN) + 3·A + 4·AN
    intra_bw, net_bw = 3 / 8 * M / B, 4 * 4 / 8 * M / BN
    assert net_bw > intra_bw
    assert alltoall_time(two, M, ALL) == close(net_bw + 3 * A + 4 * AN) == close(0.2 + 9.5e-5)


# -- heterogeneity: the slowest link governs ----------------------------------------------------


def test_amp_hetero_cluster_slowest_node_governs() -> None:
    c = parse_cluster(str(EXAMPLE))
    group = [0, 1, 2, 3, 12, 13, 14, 15]  # one p3.8xlarge (NVLink 50 GB/s) + the g4dn (PCIe 15.75 GB/s)
    p3_rs = 3 / 4 * M / 50e9 + 3 * 5e-6
    g4_rs = 3 / 4 * M / 15.75e9 + 3 * 8e-6
    assert g4_rs > p3_rs
    inter = 2 * 1 / 2 * M / 1.25e9 + 2 * 50e-6  # [inter_node]: 10 Gb/s, 50 µs
    assert allreduce_time(c, M, group) == close(g4_rs + inter + g4_rs)
    # inside the T4 node alone
    assert allreduce_time(c, M, [12, 13, 14, 15]) == close(2 * 3 / 4 * M / 15.75e9 + 6 * 8e-6)


def test_mixed_presets_use_the_slower_network() -> None:
    c = parse_cluster("p3.8xlarge:1+g4dn.12xlarge:1")
    # slower of p3 (1.25 GB/s, 50 µs) and g4dn (6.25 GB/s, 30 µs), component-wise
    assert send_time(c, M, 0, 4) == close(50e-6 + M / 1.25e9)
    assert allreduce_time(c, M, [0, 4]) == close(M / 1.25e9 + 2 * 50e-6)


def _matrix(slow: tuple[int, int], bw: float) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(bw if (i, j) == slow else B for j in range(4)) for i in range(4))


def test_bandwidth_matrix_slowest_ring_link_governs() -> None:
    on_ring = Cluster("m", (node(),), bandwidth_matrix=_matrix((2, 3), 10e9))
    assert allreduce_time(on_ring, M, ONE_NODE) == close(2 * 3 / 4 * M / 10e9 + 6 * A)
    assert broadcast_time(on_ring, M, ONE_NODE) == close(M / 10e9 + 3 * A)
    # 0→2 is not a ring link (the ring is 0→1→2→3→0), but all-to-all uses every pair
    off_ring = Cluster("m", (node(),), bandwidth_matrix=_matrix((0, 2), 10e9))
    assert allreduce_time(off_ring, M, ONE_NODE) == close(2 * 3 / 4 * M / B + 6 * A)
    assert alltoall_time(off_ring, M, ONE_NODE) == close(3 / 4 * M / 10e9 + 3 * A)
    # scatter from 0 uses the links 0→j, gather to 0 the links j→0: only 3→0 is slow
    back = Cluster("m", (node(),), bandwidth_matrix=_matrix((3, 0), 10e9))
    assert scatter_time(back, M, ONE_NODE) == close(3 / 4 * M / B + 3 * A)
    assert gather_time(back, M, ONE_NODE) == close(3 / 4 * M / 10e9 + 3 * A)


def test_bandwidth_matrix_across_nodes_uses_first_gpus_of_the_nodes() -> None:
    bw = [[B] * 8 for _ in range(8)]
    bw[0][4] = bw[4][0] = 2e9  # the network link between the nodes' first GPUs
    c = Cluster("m", (node(), node()), bandwidth_matrix=tuple(tuple(r) for r in bw))
    rs = 3 / 4 * M / B + 3 * A
    assert allreduce_time(c, M, ALL) == close(rs + (M / 2e9 + 2 * AN) + rs)


# NCCL's published figures on the DGX presets (their sources: the presets' collectives_source):
# inside a DGX A100 every ring collective at 230 GB/s; across nodes 24 of each HDR NIC's 25 GB/s;
# on a DGX H100 all-reduce 480 (NVLS), all-gather 350, reduce-scatter 360, broadcast/reduce 370;
# 47 of each NDR NIC's 50 GB/s. 3 µs a step inside a node, 5 µs on the network.
A100_RING, A100_NIC = 230e9, 24e9
H100_AR, H100_AG, H100_RS, H100_RING, H100_NIC = 480e9, 350e9, 360e9, 370e9, 47e9


def test_dgx_a100_scale_is_fast_to_cost() -> None:
    c = parse_cluster("dgx-a100:128")
    t = allreduce_time(c, M, range(1024))
    # NCCL's ring at min(230, 8 × 24 GB/s): 2·1023 steps, 2·127 across the network
    ring = 2 * 1023 / 1024 * M / (8 * A100_NIC) + 2 * (1023 - 127) * 3e-6 + 2 * 127 * 5e-6
    rs = 7 / 8 * M / A100_RING + 7 * 3e-6
    inter = 2 * 127 / 128 * M / (8 * A100_NIC) + 2 * 127 * 5e-6
    assert ring < rs + inter + rs
    assert t == close(ring)
    assert alltoall_time(c, M, range(1024)) > 0
    # one GPU per node: its own 200 Gb/s NIC (25 GB/s, 24 with NCCL), not the node's 8 of them
    assert coll.allgather_time(c, M, range(0, 1024, 8)) == close(127 / 128 * M / A100_NIC + 127 * 5e-6)


# -- the network a group reaches: one NIC per GPU (rail-optimized DGX nodes) ----------------------

NIC = H100_NIC  # DGX H100: 8 × 400 Gb/s ConnectX-7, one beside each GPU (50 GB/s, 47 with NCCL)


def test_one_gpu_per_node_group_crosses_on_its_own_nic() -> None:
    # d48 with t8: each tensor-parallel rank's data-parallel group has one GPU on each of 48
    # nodes; its ring crosses on that GPU's NIC while the node's 7 others carry their own groups
    c = parse_cluster("h100:48")
    group = range(3, 384, 8)
    assert allreduce_time(c, M, group) == close(2 * 47 / 48 * M / NIC + 2 * 47 * 5e-6)
    assert reducescatter_time(c, M, group) == close(47 / 48 * M / NIC + 47 * 5e-6)
    assert allgather_time(c, M, group) == close(47 / 48 * M / NIC + 47 * 5e-6)
    assert broadcast_time(c, M, group) == close(M / NIC + 47 * 5e-6)
    assert send_time(c, M, 0, 8) == close(5e-6 + M / NIC)  # a pair: one NIC each side


def test_a_group_with_g_gpus_per_node_reaches_g_nics() -> None:
    c = parse_cluster("h100:4")
    two_per_node = [0, 1, 8, 9, 16, 17, 24, 25]
    # NCCL's ring through the 4 nodes on the group's 2 NICs a node (2 × 47 GB/s, slower than
    # NVLink): 14 steps, 6 of them across the network
    ring = 2 * 7 / 8 * M / (2 * NIC) + 8 * 3e-6 + 6 * 5e-6
    # hierarchical: reduce-scatter and all-gather inside the node at NCCL's rates, around the
    # all-reduce across the nodes
    rs, ag = 1 / 2 * M / H100_RS + 3e-6, 1 / 2 * M / H100_AG + 3e-6
    hier = rs + 2 * 3 / 4 * M / (2 * NIC) + 2 * 3 * 5e-6 + ag
    assert allreduce_time(c, M, two_per_node) == close(min(ring, hier))
    whole = range(32)  # 8 per node: all 8 NICs, the node's 400 GB/s (376 with NCCL)
    ring8 = M / H100_RS * 31 / 32 + M / H100_AG * 31 / 32 + 2 * 28 * 3e-6 + 6 * 5e-6  # NVLink the slower
    rs8, ag8 = 7 / 8 * M / H100_RS + 7 * 3e-6, 7 / 8 * M / H100_AG + 7 * 3e-6
    hier8 = rs8 + 2 * 3 / 4 * M / (8 * NIC) + 2 * 3 * 5e-6 + ag8
    assert ring8 < hier8
    assert allreduce_time(c, M, whole) == close(ring8)
    # all-to-all: node i pushes g(n−g)/n·M through its group's g NICs
    assert alltoall_time(c, M, two_per_node) == close(2 * 6 / 8 * M / (2 * NIC) + 3e-6 + 6 * 5e-6)


def test_fewer_nics_than_gpus_share_them() -> None:
    # DGX-2: 16 V100, 8 × 100 Gb/s NICs (one per GPU pair): 12.5 GB/s a GPU, 100 GB/s a node
    c = parse_cluster("dgx2-v100:2")
    assert send_time(c, M, 0, 16) == close(5e-6 + M / 12.5e9)
    assert allreduce_time(c, M, [0, 16]) == close(M / 12.5e9 + 2 * 5e-6)
    four = [0, 1, 2, 3, 16, 17, 18, 19]
    rs = 3 / 4 * M / 150e9 + 3 * 3e-6
    assert allreduce_time(c, M, four) == close(rs + M / 50e9 + 2 * 5e-6 + rs)
    # a single-NIC node gives every group the whole interface (unchanged)
    one_nic = parse_cluster("p3.8xlarge:2")
    assert allreduce_time(one_nic, M, [0, 4]) == close(M / 1.25e9 + 2 * 50e-6)


def test_matrices_equal_to_the_default_links_change_nothing() -> None:
    # the fast paths (no matrices) and the general per-link paths must agree
    hetero = parse_cluster("p3.8xlarge:2+g4dn.12xlarge:1")
    for c in (two, hetero):
        n = c.num_devices
        bw = tuple(tuple(0.0 if a == b else c.link(a, b).bandwidth for b in range(n)) for a in range(n))
        lat = tuple(tuple(0.0 if a == b else c.link(a, b).latency_s for b in range(n)) for a in range(n))
        m = Cluster(c.name, c.nodes, c.inter_node, bw, lat)
        assert m.has_matrices and not c.has_matrices
        groups = [[0, 1], [0, 1, 2], list(range(n)), [1, 2, n - 1], [0, n - 2, n - 1]]
        for name, f in COLLECTIVES.items():
            for g in groups:
                assert f(m, M, g) == close(f(c, M, g)), (c.name, name, g)
        assert scatter_time(m, M, [n - 1, 0, 1], root=n - 1) == close(scatter_time(c, M, [n - 1, 0, 1]))
