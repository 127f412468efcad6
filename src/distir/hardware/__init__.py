"""The hardware layer: device, link and node specs (``specs``), built-in node types with their
sources (``presets``), clusters, the spec strings naming them and the files describing them
(``cluster``), and the cluster file format in TOML (``clusterfile``: what a file says, key by
key). Every figure is SI (FLOP/s, B/s, bytes, s); the cost model reads its constants from here."""

from distir.hardware.cluster import Cluster, cluster_from_toml, load_cluster_file, parse_cluster
from distir.hardware.presets import PRESETS, clusters_json, render_clusters_table
from distir.hardware.specs import ClusterError, DeviceSpec, HardwareError, LinkSpec, NodeSpec, SpecError

__all__ = [
    "PRESETS",
    "Cluster",
    "ClusterError",
    "DeviceSpec",
    "HardwareError",
    "LinkSpec",
    "NodeSpec",
    "SpecError",
    "cluster_from_toml",
    "clusters_json",
    "load_cluster_file",
    "parse_cluster",
    "render_clusters_table",
]
