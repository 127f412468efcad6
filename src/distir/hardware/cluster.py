"""A cluster: nodes (possibly of different types), their GPUs, and the links between GPUs.

GPUs are numbered ``0..N-1`` node by node: node 0's GPUs first, then node 1's, and so on.

Links (``Cluster.link(a, b)``), per direction, alpha-beta:
- ``a == b``: infinite bandwidth, zero latency (two streams of one GPU);
- same node: the node's ``intra`` link;
- different nodes: ``Cluster.network_link`` of one GPU on each node: the network interface
  each GPU reaches (``NodeSpec.network_share``: ``inter`` / ``nics`` on a node with a NIC per
  GPU, as a DGX's 8 NICs next to its 8 GPUs; the whole ``inter`` on a single-NIC node) of
  ``inter_node`` if given, else of each node's ``inter`` spec, at the node's
  ``network_efficiency``, the slower side governing (lower bandwidth, higher latency). A
  collective's group with g GPUs on a node reaches g of them (see ``distir.sim.collectives``);
  ``Cluster.node_link`` is the nodes' aggregate link at the line rate;
- ``bandwidth_matrix`` / ``latency_matrix``, when given, override every pairwise figure above
  (each independently; the diagonal is ignored).

Invariants (checked on construction): at least one node; every entry is a ``NodeSpec``; two
different ``DeviceSpec`` never share a name (``kind_of`` is a cache key); matrices are N×N with
positive off-diagonal bandwidths and finite non-negative off-diagonal latencies.
"""

from __future__ import annotations

import difflib
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from distir.hardware.clusterfile import ClusterDescription, read_cluster_file, read_cluster_toml
from distir.hardware.presets import PRESETS
from distir.hardware.specs import ClusterError, DeviceSpec, HardwareError, LinkSpec, Matrix, NodeSpec
from distir.limits import MAX_DEVICES, exceeds, over, read_int

_SELF = LinkSpec(math.inf, 0.0)


def _check_matrix(m: object, n: int, what: str, cluster: str) -> None:
    """``m`` must be an N×N tuple of tuples of numbers, valid off the diagonal."""
    if not isinstance(m, tuple) or len(m) != n:
        got = f"{len(m)} rows" if isinstance(m, tuple | list) else repr(m)
        raise ClusterError(f"{what} must be a tuple of {n} rows (one per GPU), got {got}", source=cluster)
    for i, row in enumerate(m):
        if not isinstance(row, tuple) or len(row) != n:
            got = f"{len(row)} entries" if isinstance(row, tuple | list) else repr(row)
            raise ClusterError(f"{what}[{i}] must be a tuple of {n} numbers, got {got}", source=cluster)
        for j, x in enumerate(row):
            ok = isinstance(x, int | float) and not isinstance(x, bool) and not math.isnan(x)
            if ok and i != j:
                ok = x > 0 if what == "bandwidth_matrix" else (math.isfinite(x) and x >= 0)
            elif ok:
                ok = x >= 0
            if not ok:
                want = "a positive bandwidth" if what == "bandwidth_matrix" else "a finite latency >= 0"
                raise ClusterError(f"{what}[{i}][{j}] must be {want}, got {x!r}", source=cluster)


@dataclass(frozen=True, slots=True)
class Cluster:
    """Nodes (one ``NodeSpec`` per node), an optional inter-node link override and optional full
    GPU×GPU bandwidth (B/s) / latency (s) matrices. See the module docstring for links."""

    name: str
    nodes: tuple[NodeSpec, ...]
    inter_node: LinkSpec | None = None
    bandwidth_matrix: Matrix | None = None
    latency_matrix: Matrix | None = None
    _node_of: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _first_gpu: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ClusterError(f"cluster name must be a non-empty string, got {self.name!r}")
        src = f"cluster {self.name!r}"
        if not isinstance(self.nodes, tuple) or not self.nodes:
            raise ClusterError(f"nodes must be a non-empty tuple of NodeSpec, got {self.nodes!r}", source=src)
        kinds: dict[str, DeviceSpec] = {}
        for i, node in enumerate(self.nodes):
            if not isinstance(node, NodeSpec):
                raise ClusterError(f"nodes[{i}] must be a NodeSpec, got {node!r}", source=src)
            seen = kinds.setdefault(node.device.name, node.device)
            if seen != node.device:
                raise ClusterError(
                    f"two different device specs are both named {node.device.name!r} "
                    f"(nodes[{i}] is {node.name!r}); give them different names",
                    source=src,
                )
        if self.inter_node is not None and not isinstance(self.inter_node, LinkSpec):
            raise ClusterError(f"inter_node must be a LinkSpec, got {self.inter_node!r}", source=src)
        node_of: list[int] = []
        first: list[int] = []
        for i, node in enumerate(self.nodes):
            first.append(len(node_of))
            node_of.extend([i] * node.devices_per_node)
        first.append(len(node_of))
        object.__setattr__(self, "_node_of", tuple(node_of))
        object.__setattr__(self, "_first_gpu", tuple(first))
        n = len(node_of)
        if self.bandwidth_matrix is not None:
            _check_matrix(self.bandwidth_matrix, n, "bandwidth_matrix", src)
        if self.latency_matrix is not None:
            _check_matrix(self.latency_matrix, n, "latency_matrix", src)

    @property
    def num_devices(self) -> int:
        """Number of GPUs (devices) in the cluster."""
        return len(self._node_of)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def gpu_nodes(self) -> tuple[int, ...]:
        """The node index of every GPU (``gpu_nodes[g] == node_of(g)``), for fast loops."""
        return self._node_of

    @property
    def has_matrices(self) -> bool:
        """Whether a bandwidth or latency matrix overrides the per-node links."""
        return self.bandwidth_matrix is not None or self.latency_matrix is not None

    def _check_gpu(self, gpu: int) -> None:
        if not isinstance(gpu, int) or isinstance(gpu, bool) or not 0 <= gpu < len(self._node_of):
            raise ClusterError(
                f"no GPU {gpu!r}: the cluster has {len(self._node_of)} GPUs (0..{len(self._node_of) - 1})",
                source=f"cluster {self.name!r}",
            )

    def node_of(self, gpu: int) -> int:
        """Index of the node holding ``gpu``."""
        self._check_gpu(gpu)
        return self._node_of[gpu]

    def gpus_of_node(self, node: int) -> range:
        """The GPU indices of node ``node`` (consecutive)."""
        if not isinstance(node, int) or not 0 <= node < len(self.nodes):
            raise ClusterError(
                f"no node {node!r}: the cluster has {len(self.nodes)} nodes", source=f"cluster {self.name!r}"
            )
        return range(self._first_gpu[node], self._first_gpu[node + 1])

    def device_spec(self, gpu: int) -> DeviceSpec:
        return self.nodes[self.node_of(gpu)].device

    def kind_of(self, gpu: int) -> str:
        """The device spec's name: equal names mean equal specs (a cost-cache key)."""
        return self.device_spec(gpu).name

    def node_link(self, a: int, b: int) -> LinkSpec:
        """The network link between distinct nodes ``a`` and ``b`` (node indices): ``inter_node``
        if set, else the slower of the two nodes' ``inter`` links. Bandwidth is per node: all
        its interfaces together (``network_link`` gives what a group's GPUs reach)."""
        if a == b:
            raise ClusterError(
                f"node_link needs two distinct nodes, got {a} twice", source=f"cluster {self.name!r}"
            )
        if self.inter_node is not None:
            return self.inter_node
        return self.nodes[a].inter.slower(self.nodes[b].inter)

    def network_link(self, parts: Iterable[tuple[int, int]]) -> LinkSpec:
        """The network link of a group of GPUs with ``(node, g)`` in ``parts``: g of its GPUs on
        that node. Each node gives the group the share of its network bandwidth that g GPUs
        reach (``NodeSpec.network_share``) — ``inter_node``'s if set, else its own ``inter`` —
        at the fraction of the line rate NCCL reaches there (``NodeSpec.network_efficiency``),
        and the slowest node governs, with the highest latency. Per node, so a collective whose
        g concurrent rings each cross on their own GPU's interface runs at this bandwidth."""
        bw, lat = math.inf, 0.0
        for node, g in parts:
            spec = self.nodes[node]
            net = spec.inter if self.inter_node is None else self.inter_node
            bw = min(bw, net.bandwidth * spec.network_share(g) * spec.network_efficiency)
            lat = max(lat, net.latency_s)
        return LinkSpec(bw, lat)

    def link(self, a: int, b: int) -> LinkSpec:
        """The link from GPU ``a`` to GPU ``b`` (see the module docstring)."""
        na, nb = self.node_of(a), self.node_of(b)
        if a == b:
            return _SELF
        base = self.nodes[na].intra if na == nb else self.network_link(((na, 1), (nb, 1)))
        if self.bandwidth_matrix is None and self.latency_matrix is None:
            return base
        bw = base.bandwidth if self.bandwidth_matrix is None else self.bandwidth_matrix[a][b]
        lat = base.latency_s if self.latency_matrix is None else self.latency_matrix[a][b]
        return LinkSpec(float(bw), float(lat))

    @classmethod
    def parse(cls, spec: str) -> Cluster:
        """``parse_cluster(spec)``: a preset (``dgx-a100``), ``NAME:NODES``, ``A:n+B:m`` or a file."""
        return parse_cluster(spec)

    def describe(self) -> str:
        """One line: e.g. ``3 × p3.8xlarge + 1 × g4dn.12xlarge (16 GPUs)``."""
        runs = [(name, len(list(g))) for name, g in itertools.groupby(n.name for n in self.nodes)]
        body = " + ".join(f"{c} × {name}" for name, c in runs)
        return f"{body} ({self.num_devices} GPUs)"


def preset_node(name: str, source: str | None = None) -> NodeSpec:
    """The preset node type ``name``; an unknown name is a ClusterError listing the known ones."""
    node = PRESETS.get(name)
    if node is None:
        close = difflib.get_close_matches(name, list(PRESETS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        known = ", ".join(PRESETS)
        raise ClusterError(f"unknown preset {name!r}{hint} (known presets: {known})", source=source)
    return node


def _is_file_spec(spec: str) -> bool:
    return spec.endswith(".toml") or "/" in spec or "\\" in spec


def cluster_input(spec: object) -> Path | None:
    """The file the cluster spec ``spec`` reads (a cluster file), else None (a preset, a
    ``Cluster``, a malformed spec: ``parse_cluster`` reports it). Never raises: the commands
    that write files refuse an output naming it (``distir.files.check_distinct``)."""
    if not isinstance(spec, str) or not spec.strip():
        return None
    return Path(spec.strip()) if _is_file_spec(spec.strip()) else None


def parse_cluster(spec: str | Cluster) -> Cluster:
    """A cluster from a spec string (a ``Cluster`` is returned as it is):

    - ``NAME`` or ``NAME:NODES``: ``NODES`` nodes (default 1) of preset ``NAME``
      (``dgx-a100:128`` is 128 DGX A100 nodes, 1024 GPUs);
    - ``A:n+B:m``: a mix, nodes in the order written (``p3.8xlarge:3+g4dn.12xlarge:1``);
    - a path ending in ``.toml`` (or containing a ``/``): a cluster file (see
      ``distir.hardware.clusterfile``).

    Errors (``ClusterError``) name the spec and the part that is wrong.
    """
    if isinstance(spec, Cluster):
        return spec
    if not isinstance(spec, str):
        raise ClusterError(f"a cluster is a spec string or a Cluster, got {spec!r} ({type(spec).__name__})")
    if not spec.strip():
        known = ", ".join(PRESETS)
        raise ClusterError(f"empty cluster spec {spec!r}; give a preset name ({known}) or a .toml file")
    spec = spec.strip()
    if _is_file_spec(spec):
        return load_cluster_file(Path(spec))
    src = f"cluster {spec!r}"
    nodes: list[NodeSpec] = []
    total = 0  # GPUs so far, bounded before the node list grows
    for part in spec.split("+"):
        name, colon, count_text = part.strip().partition(":")
        name = name.strip()
        if not name:
            raise ClusterError(f"empty preset name in {part!r}", source=src)
        node = preset_node(name, src)
        count = 1
        if colon:
            got = read_int(count_text.strip())
            if got is None or got < 1:
                raise ClusterError(
                    f"node count of {name!r} must be a positive integer, got {count_text[:40]!r}", source=src
                )
            count = got
        total += count * node.devices_per_node
        if exceeds(total, MAX_DEVICES):
            raise ClusterError(over("its GPU count", total, MAX_DEVICES), source=src[:80])
        nodes.extend([node] * count)
    return Cluster(spec, tuple(nodes))


def cluster_of(d: ClusterDescription) -> Cluster:
    """The cluster a file describes; a cluster-level problem (matrices, device names) names the
    file."""
    try:
        return Cluster(d.name, d.nodes, d.inter_node, d.bandwidth_matrix, d.latency_matrix)
    except HardwareError as e:
        raise ClusterError(str(e), source=d.file) from None


def cluster_from_toml(text: str, file: str = "<cluster>") -> Cluster:
    """Parse and validate a cluster file's text; ``file`` names it in errors."""
    return cluster_of(read_cluster_toml(text, file))


def load_cluster_file(path: Path) -> Cluster:
    """Read and parse a cluster file (errors name the file, line:column and key)."""
    return cluster_of(read_cluster_file(path))
