"""Clusters: GPU numbering, links (in a node, between nodes, matrices) and preset spec strings."""

from __future__ import annotations

import math

import pytest

from distir.hardware.cluster import Cluster, parse_cluster
from distir.hardware.presets import GIB, PRESETS
from distir.hardware.specs import ClusterError, DeviceSpec, LinkSpec, NodeSpec


def node(
    name: str = "n", gpus: int = 2, intra: float = 100e9, inter: float = 10e9, dev: str = "X"
) -> NodeSpec:
    d = DeviceSpec(dev, 1e12, 1e12, 2e12, 2e12, 1e12, GIB, 5e-6)
    return NodeSpec(name, d, gpus, LinkSpec(intra, 5e-6), LinkSpec(inter, 20e-6))


def test_numbering_node_by_node() -> None:
    c = Cluster("c", (node(gpus=2), node(gpus=3, dev="Y"), node(gpus=1)))
    assert c.num_devices == 6 and c.num_nodes == 3
    assert [c.node_of(g) for g in range(6)] == [0, 0, 1, 1, 1, 2]
    assert list(c.gpus_of_node(1)) == [2, 3, 4]
    assert c.kind_of(2) == "Y" and c.kind_of(5) == "X"
    assert c.device_spec(4).name == "Y"
    with pytest.raises(ClusterError, match=r"no GPU 6: the cluster has 6 GPUs \(0\.\.5\)"):
        c.node_of(6)
    with pytest.raises(ClusterError, match="no node 3"):
        c.gpus_of_node(3)


def test_links_inside_and_between_nodes() -> None:
    fast, slow = node("fast", inter=10e9), node("slow", inter=2e9)
    slow = NodeSpec("slow", slow.device, 2, slow.intra, LinkSpec(2e9, 40e-6))
    c = Cluster("c", (fast, slow))
    assert c.link(1, 1) == LinkSpec(math.inf, 0.0)
    assert c.link(0, 1) == LinkSpec(100e9, 5e-6)
    # between nodes: the slower of the two nodes' network links, component-wise
    assert c.link(0, 2) == LinkSpec(2e9, 40e-6) == c.link(3, 1)
    assert c.node_link(0, 1) == LinkSpec(2e9, 40e-6)
    with pytest.raises(ClusterError, match="two distinct nodes"):
        c.node_link(1, 1)
    over = Cluster("c", (fast, slow), inter_node=LinkSpec(1e9, 1e-4))
    assert over.link(0, 3) == LinkSpec(1e9, 1e-4)
    assert over.link(2, 3) == LinkSpec(100e9, 5e-6)  # intra-node links are not overridden


def test_bandwidth_and_latency_matrices_override_links() -> None:
    bw = ((0.0, 1e9, 2e9, 3e9), (4e9, 0.0, 5e9, 6e9), (7e9, 8e9, 0.0, 9e9), (1e9, 2e9, 3e9, 0.0))
    c = Cluster("m", (node(), node()), bandwidth_matrix=bw)
    assert c.link(0, 1) == LinkSpec(1e9, 5e-6)  # latency still from the node's intra link
    assert c.link(1, 0) == LinkSpec(4e9, 5e-6)  # matrices may be asymmetric
    assert c.link(2, 1) == LinkSpec(8e9, 20e-6)  # ... and from the network between nodes
    assert c.link(2, 2) == LinkSpec(math.inf, 0.0)  # the diagonal is ignored
    lat = tuple(tuple(1e-6 * (i + j) for j in range(4)) for i in range(4))
    c2 = Cluster("m", (node(), node()), latency_matrix=lat)
    assert c2.link(1, 3) == LinkSpec(10e9, 4e-6)


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        (
            {"bandwidth_matrix": ((0.0, 1.0),)},
            "bandwidth_matrix must be a tuple of 4 rows (one per GPU), got 1 rows",
        ),
        (
            {"bandwidth_matrix": ((1.0,) * 4,) * 3 + ((0.0, 1.0),)},
            "bandwidth_matrix[3] must be a tuple of 4 numbers",
        ),
        (
            {"bandwidth_matrix": ((0.0,) * 4,) * 4},
            "bandwidth_matrix[0][1] must be a positive bandwidth, got 0.0",
        ),
        (
            {"latency_matrix": ((0.0, -1.0, 0.0, 0.0),) + ((0.0,) * 4,) * 3},
            "latency_matrix[0][1] must be a finite",
        ),
    ],
)
def test_matrix_validation(kw: dict[str, object], needle: str) -> None:
    with pytest.raises(ClusterError) as e:
        Cluster("m", (node(), node()), **kw)  # type: ignore[arg-type]
    assert needle in str(e.value) and "cluster 'm'" in str(e.value)


def test_cluster_validation() -> None:
    with pytest.raises(ClusterError, match="nodes must be a non-empty tuple"):
        Cluster("c", ())
    with pytest.raises(ClusterError, match=r"nodes\[1\] must be a NodeSpec"):
        Cluster("c", (node(), "dgx"))  # type: ignore[arg-type]
    a, b = node(), node()
    b = NodeSpec("b", DeviceSpec("X", 9e12, 9e12, 9e12, 9e12, 1e12, GIB, 0.0), 2, b.intra, b.inter)
    with pytest.raises(ClusterError, match="two different device specs are both named 'X'"):
        Cluster("c", (a, b))


def test_parse_presets_and_counts() -> None:
    c = parse_cluster("dgx-a100:128")
    assert c.num_devices == 1024 and c.num_nodes == 128 and c.node_of(1023) == 127
    assert c.name == "dgx-a100:128" and c.describe() == "128 × dgx-a100 (1024 GPUs)"
    assert parse_cluster("dgx2-v100").num_devices == 16
    assert parse_cluster(" h100 : 2 ").num_devices == 16
    assert parse_cluster("local").kind_of(0) == "cpu (uncalibrated)"


def test_parse_mixed_presets() -> None:
    c = parse_cluster("p3.8xlarge:3+g4dn.12xlarge:1")
    assert c.num_devices == 16 and c.describe() == "3 × p3.8xlarge + 1 × g4dn.12xlarge (16 GPUs)"
    assert c.kind_of(11) == "V100-SXM2-16GB" and c.kind_of(12) == "T4-16GB"
    assert c.link(12, 13) == PRESETS["g4dn.12xlarge"].intra
    assert c.link(0, 4) == PRESETS["p3.8xlarge"].inter
    # p3 (10 Gb/s, 50 µs) vs g4dn (50 Gb/s, 30 µs): the slower of both
    assert c.link(0, 12) == LinkSpec(1.25e9, 50e-6)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("dgx-a100:0", "cluster 'dgx-a100:0': node count of 'dgx-a100' must be a positive integer, got '0'"),
        ("dgx-a100:x", "node count of 'dgx-a100' must be a positive integer, got 'x'"),
        ("dgx-a100:", "must be a positive integer, got ''"),
        ("dgx-a100:-2", "got '-2'"),
        ("dgx-a100:²", "got '²'"),
        ("dgxa100", "unknown preset 'dgxa100'; did you mean 'dgx-a100'?"),
        ("p3.8xlarge:3+", "empty preset name"),
        ("", "empty cluster spec"),
        ("nope/missing.toml", "nope/missing.toml: no such file"),
    ],
)
def test_parse_errors(spec: str, needle: str) -> None:
    with pytest.raises(ClusterError) as e:
        parse_cluster(spec)
    assert needle in str(e.value)


def test_unknown_preset_lists_known_ones() -> None:
    with pytest.raises(ClusterError) as e:
        parse_cluster("tpu-v4:2")
    msg = str(e.value)
    for name in PRESETS:
        assert name in msg


def test_cluster_error_format() -> None:
    e = ClusterError("bad", source="f.toml", key="nodes[1].count", line=3, col=5)
    assert str(e) == "f.toml:3:5: nodes[1].count: bad"
    assert str(ClusterError("bad", source="f.toml")) == "f.toml: bad"
    assert isinstance(e, ValueError)


def test_cluster_input_names_the_file_a_spec_reads() -> None:
    """``cluster_input``: a cluster file's path (what the commands refuse to overwrite); None
    for a preset, a mix of presets, a ``Cluster`` or anything else, never an error."""
    from pathlib import Path

    from distir.hardware.cluster import cluster_input

    assert cluster_input(" my.toml ") == Path("my.toml")
    assert cluster_input("clusters/profile") == Path("clusters/profile")
    assert cluster_input("h100:2+dgx-a100") is None
    assert cluster_input(parse_cluster("h100")) is None
    assert cluster_input("") is None and cluster_input(None) is None
