"""Alpha-beta cost models of point-to-point sends and collectives on a ``Cluster``.

Every function takes the cluster, a byte count ``nbytes`` (its meaning is stated per function)
and the participating *physical* GPU indices, and returns seconds. Duplicates in a group are
collapsed (two streams of one GPU are one participant); a group of one costs 0.

Notation: n GPUs in the group, spread over k nodes with g_i of them on node i; M = ``nbytes``;
B and α are a link's bandwidth (B/s, per direction) and latency (s).

Links:
- *inside one node*, a ring visits the group's GPUs in index order; its B and α are those of its
  slowest link (lowest bandwidth, highest latency) over ``Cluster.link``;
- *across nodes*, the network level's (B, α) is, without matrices, ``Cluster.network_link`` of
  the group's GPUs per node: the network bandwidth its g_i GPUs on node i reach together
  (``NodeSpec.network_share``), the slowest node governing. On a node with a NIC per GPU (a
  DGX: 8 × 400 Gb/s ConnectX-7 next to 8 H100s, a rail-optimized fabric) that is g_i NICs: a
  data-parallel group with one GPU per node (t = 8 filling the node) crosses on one 50 GB/s
  NIC while the node's seven other GPUs run their own groups on theirs, not on the node's
  400 GB/s; g concurrent rings, one per local rank, each cross on their own GPU's NIC
  (NCCL's rings pair each GPU with its nearest NIC). On a single-NIC node every group gets the
  whole interface (concurrent groups sharing it are not modelled). With matrices: the slowest
  ``Cluster.link`` between the first group GPU of consecutive nodes (a ring over the k nodes;
  for all-to-all, over all node pairs);
- heterogeneous clusters (AMP): the slowest link governs each level, and a level whose nodes
  differ takes as long as its slowest node (``max`` over nodes).

Groups spanning nodes: all-gather and reduce-scatter run NCCL's ring, one flat ring over the
group's n GPUs, node after node, which NCCL pipelines chunk by chunk so that every link carries
the ring's traffic at once and the slowest governs (``_flat_ring``): the GPUs' own links inside
the nodes and the network the group reaches (``Cluster.network_link``: g GPUs on a node, g
NICs); of its n − 1 steps, k − 1 cross the network. This is NCCL's own cost model of a ring
(``src/graph/tuning.cc``: bus bandwidth = channels × the ring's inter-node bandwidth on more
than two nodes; latency = (steps − inter-node steps) × intra latency + inter-node steps × network
latency), and it reproduces NCCL's published multi-node bus bandwidth (192 GB/s over a DGX
A100's 8 HDR NICs, NVIDIA/nccl#812). All-reduce takes the faster of that ring (a reduce-scatter
ring then an all-gather ring, 2(n − 1) steps of which 2(k − 1) cross) and a hierarchical
reduction standing for NCCL's tree (reduce-scatter inside the nodes, all-reduce across, all-gather
inside; phases one after the other), as NCCL runs whichever its model predicts faster. The
other collectives use hierarchical algorithms (phases one after the other, no overlap).

Per-collective links (``NodeSpec.collectives``: written by ``distir calibrate``, or NCCL's
published bus bandwidth on the DGX presets): inside a node, a collective listed there runs on its
own (B, α) instead of the node's ``intra`` link (``NodeSpec.intra_for``); reduce-scatter uses the
all-gather formula with reduce-scatter's link, reduce the broadcast formula with reduce's. A bus
bandwidth is that link's B: nccl-tests' busbw is defined so that the ring formula below, at
B = busbw, gives the measured time. Bandwidth/latency matrices, when given, override these as
they override ``intra``. Across nodes the network runs at the nodes' ``network_efficiency``
(``Cluster.network_link``).

Measured curves by message size (``NodeSpec.busbw_curves``: nccl-tests' busbw against its size
on N GPUs of one node; the DGX presets' all-reduce, the H100's all-gather and reduce-scatter;
a collective may have curves on several N, and a group of n GPUs reads the one whose N is
nearest n, ``NodeSpec.curve_for``): NCCL reaches its peak bus bandwidth only for large messages.
A collective inside one node whose node has a curve for it takes, with
factor·M/busbw the time nccl-tests' busbw stands for (factor 2(n−1)/n all-reduce, (n−1)/n
all-gather and reduce-scatter, 1 broadcast and reduce) and steps the ring's latencies:
t_N = factor_N·M / B_curve(M) is the measured time on N GPUs, latency included, so its data part
is t_N − steps_N·α, at least factor_N·M/B (the link's B caps the curve); n GPUs take
steps_n·α + factor_n/factor_N × that data part (``_measured``). On N GPUs that is
max(t_N, alpha-beta time): the measured latency is not added again. Large messages, where the
curve reaches B, keep the alpha-beta time; a message larger than the curve's largest keeps that
one's bus bandwidth (at most B), so the time grows with the size past the sweep's end; a message
smaller than the curve's smallest has that one's data part. Groups across nodes, and clusters with
matrices, do not use curves.
``measured=False`` (the five ring collectives' keyword) leaves the curves out: a coalesced part
of a collective call (``distir.sim.cost.charged``) adds its bytes at B, the curve applying to the
call's first part at that part's size (the call's total size is not known per part).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from distir.hardware.cluster import Cluster
from distir.hardware.specs import LinkSpec


class CollectiveError(ValueError):
    """A collective cost was asked for with an invalid size or group."""


def _nbytes(nbytes: float) -> float:
    ok = isinstance(nbytes, int | float) and not isinstance(nbytes, bool)
    if not ok or not math.isfinite(nbytes) or nbytes < 0:
        raise CollectiveError(f"nbytes must be a finite non-negative number, got {nbytes!r}")
    return float(nbytes)


def _group(cluster: Cluster, group: Iterable[int]) -> tuple[int, ...]:
    """The distinct GPUs of ``group``, sorted; validated against the cluster."""
    g = tuple(sorted(set(group)))
    if not g:
        raise CollectiveError("a collective needs at least one GPU, got an empty group")
    if g[0] < 0 or g[-1] >= cluster.num_devices or not all(type(x) is int for x in g):
        bad = next(x for x in g if type(x) is not int or not 0 <= x < cluster.num_devices)
        cluster.node_of(bad)  # raises ClusterError naming the GPU
    return g


def _by_node(cluster: Cluster, gpus: Sequence[int]) -> list[tuple[int, ...]]:
    """The group's GPUs per node, nodes in index order (``gpus`` is sorted, so is the result)."""
    nodes = cluster.gpu_nodes
    out: dict[int, list[int]] = {}
    for gpu in gpus:
        out.setdefault(nodes[gpu], []).append(gpu)
    return [tuple(v) for v in out.values()]


def _slowest(links: Iterable[LinkSpec]) -> LinkSpec:
    bw, lat = math.inf, 0.0
    for link in links:
        bw = min(bw, link.bandwidth)
        lat = max(lat, link.latency_s)
    return LinkSpec(bw, lat)


def _intra(cluster: Cluster, gpu: int, kind: str) -> LinkSpec:
    """The link collective ``kind`` runs on inside the node of ``gpu`` (no matrices)."""
    return cluster.nodes[cluster.gpu_nodes[gpu]].intra_for(kind)


def _all_pairs(cluster: Cluster, gpus: Sequence[int], kind: str) -> LinkSpec:
    """The slowest link between any two of ``gpus`` (one node: its link for ``kind`` without
    matrices)."""
    if not cluster.has_matrices and cluster.gpu_nodes[gpus[0]] == cluster.gpu_nodes[gpus[-1]]:
        return _intra(cluster, gpus[0], kind)
    return _slowest(cluster.link(a, b) for a in gpus for b in gpus if a != b)


def _ring(cluster: Cluster, gpus: Sequence[int], kind: str) -> LinkSpec:
    """The slowest link of the ring gpus[0] → gpus[1] → ... → gpus[0] for collective ``kind``."""
    n = len(gpus)
    if not cluster.has_matrices and cluster.gpu_nodes[gpus[0]] == cluster.gpu_nodes[gpus[-1]]:
        return _intra(cluster, gpus[0], kind)
    return _slowest(cluster.link(gpus[i], gpus[(i + 1) % n]) for i in range(n))


def _star(cluster: Cluster, root: int, gpus: Sequence[int], outward: bool, kind: str) -> LinkSpec:
    """The slowest link between ``root`` and the other GPUs (root → j if ``outward``)."""
    if not cluster.has_matrices:  # links are per node pair, and symmetric
        nodes = cluster.gpu_nodes
        rn = nodes[root]
        targets = {nodes[j] for j in gpus if j != root}
        intra = cluster.nodes[rn].intra_for(kind)
        return _slowest(intra if t == rn else cluster.network_link(((rn, 1), (t, 1))) for t in targets)
    return _slowest(cluster.link(root, j) if outward else cluster.link(j, root) for j in gpus if j != root)


def _net(cluster: Cluster, parts: Sequence[tuple[int, ...]], all_pairs: bool = False) -> LinkSpec:
    """The network level's link: without matrices, the network bandwidth the group's GPUs reach
    on each node (``Cluster.network_link``, the slowest node governing); with matrices, the
    slowest link between the first GPUs of the nodes, over the ring of nodes (or all node
    pairs)."""
    if not cluster.has_matrices:
        nodes = cluster.gpu_nodes
        return cluster.network_link((nodes[p[0]], len(p)) for p in parts)
    leaders = [p[0] for p in parts]
    k = len(leaders)
    if all_pairs:
        return _slowest(cluster.link(a, b) for a in leaders for b in leaders if a != b)
    return _slowest(cluster.link(leaders[i], leaders[(i + 1) % k]) for i in range(k))


class _Shape(NamedTuple):
    """How a ring collective of M bytes on n GPUs turns busbw into time: ``factor``·M/busbw,
    plus ``steps`` link latencies in the alpha-beta formula."""

    factor: float
    steps: int


def _shape(kind: str, n: int) -> _Shape:
    if kind in ("broadcast", "reduce"):
        return _Shape(1.0, n - 1)
    c = 2 if kind == "allreduce" else 1
    return _Shape(c * (n - 1) / n, c * (n - 1))


def _measured(
    cluster: Cluster, gpus: Sequence[int], kind: str, m: float, link: LinkSpec, measured: bool = True
) -> float:
    """The time of ``kind`` on ``gpus`` (one node, no matrices) from the node's measured bus
    bandwidth curve, 0 without one. On the curve's own N ranks the measured time is t_N =
    factor_N·M / B_curve(M), latency included; its data part, t_N − steps_N·α, is at least
    factor_N·M/B (the link's B caps the curve). n GPUs take steps_n·α + factor_n/factor_N × that
    data part: on N ranks max(t_N, alpha-beta time), never their sum; on others the latency
    scales with the ring's steps and the data part with the factor, as in the alpha-beta
    formula. Never below the alpha-beta time. ``measured`` False: 0 (a coalesced part)."""
    nodes = cluster.gpu_nodes
    if not measured or cluster.has_matrices or m <= 0 or nodes[gpus[0]] != nodes[gpus[-1]]:
        return 0.0
    curve = cluster.nodes[nodes[gpus[0]]].curve_for(kind, len(gpus))
    if curve is None:
        return 0.0
    own, at = _shape(kind, curve.ranks), _shape(kind, len(gpus))
    t_own = own.factor * m / curve.bandwidth(m)
    data = max(t_own - own.steps * link.latency_s, own.factor * m / link.bandwidth)
    return at.steps * link.latency_s + at.factor / own.factor * data


def _ring_phase(cluster: Cluster, gpus: Sequence[int], m: float, kind: str, measured: bool = True) -> float:
    """All-gather or reduce-scatter of M bytes in total inside one node: (g−1)/g·M/B + (g−1)α,
    or the time its measured curve gives if longer (``_measured``)."""
    g = len(gpus)
    if g < 2:
        return 0.0
    link = _ring(cluster, gpus, kind)
    t = (g - 1) / g * m / link.bandwidth + (g - 1) * link.latency_s
    return max(t, _measured(cluster, gpus, kind, m, link, measured))


def _flat_ring(cluster: Cluster, parts: Sequence[tuple[int, ...]], m: float, kind: str) -> float:
    """All-gather or reduce-scatter of M bytes in total over one ring through the nodes of
    ``parts`` (NCCL's ring, pipelined): (n−1)/n·M / min(B_intra, B_net) + (n−k)α_intra +
    (k−1)α_net, B_intra and α_intra the slowest of the nodes' ``kind`` links (nodes holding one
    of the GPUs have none), B_net and α_net the network the group reaches (``_net``)."""
    n, k = sum(len(p) for p in parts), len(parts)
    net = _net(cluster, parts)
    bw, lat = net.bandwidth, 0.0
    for p in parts:
        if len(p) >= 2:
            link = _ring(cluster, p, kind)
            bw, lat = min(bw, link.bandwidth), max(lat, link.latency_s)
    return (n - 1) / n * m / bw + (n - k) * lat + (k - 1) * net.latency_s


def send_time(cluster: Cluster, nbytes: float, src: int, dst: int) -> float:
    """Send ``nbytes`` (the message size) from GPU ``src`` to GPU ``dst``: α + M/B over
    ``cluster.link(src, dst)``; 0 when ``src == dst`` (two streams of one GPU)."""
    m = _nbytes(nbytes)
    cluster.node_of(src)
    cluster.node_of(dst)
    if src == dst:
        return 0.0
    return cluster.link(src, dst).time(m)


def allreduce_time(cluster: Cluster, nbytes: float, group: Iterable[int], *, measured: bool = True) -> float:
    """All-reduce of ``nbytes`` (the size of each participant's buffer, = the result's size).

    One node: ring, 2(n−1)/n·M/B + 2(n−1)α over the ring's slowest link, or the time the node's
    measured all-reduce curve gives if longer (``_measured``).
    Across k nodes: the faster of NCCL's ring (``_flat_ring`` of a reduce-scatter then of an
    all-gather: (n−1)/n·M/min(B_rs, B_net) and (n−1)/n·M/min(B_ag, B_net), 2(n−k) steps at
    α_intra and 2(k−1) at α_net) and the hierarchical reduction standing for NCCL's tree:
    (1) reduce-scatter inside each node, (g_i−1)/g_i·M/B_i +
    (g_i−1)α_i, the slowest node governing; (2) g concurrent ring all-reduces of M/g across the k
    nodes, one per local rank, each on its GPU's share of the node's network, together B_net
    (the bandwidth the group's g GPUs reach, ``Cluster.network_link``), so
    2(k−1)/k·(M/g)/(B_net/g) + 2(k−1)α_net = 2(k−1)/k·M/B_net + 2(k−1)α_net; (3) all-gather inside
    each node, as (1). Phases (1) and (3) run on the node's reduce-scatter and all-gather links
    (a calibrated or published all-reduce link, e.g. NVLink SHARP's, is a whole node's). Assumes
    the group has the same GPUs on every node it spans (with unequal counts, each node's phases
    use its own g_i).
    """
    m = _nbytes(nbytes)
    g = _group(cluster, group)
    n = len(g)
    if n < 2:
        return 0.0
    parts = _by_node(cluster, g)
    k = len(parts)
    if k == 1:
        link = _ring(cluster, g, "allreduce")
        t = 2 * (n - 1) / n * m / link.bandwidth + 2 * (n - 1) * link.latency_s
        return max(t, _measured(cluster, g, "allreduce", m, link, measured))
    # the hierarchical form's phases inside the nodes are one collective's parts, not calls of
    # their own: no measured curve (groups across nodes use none)
    rs = max(_ring_phase(cluster, p, m, "reducescatter", False) for p in parts)
    ag = max(_ring_phase(cluster, p, m, "allgather", False) for p in parts)
    net = _net(cluster, parts)
    inter = 2 * (k - 1) / k * m / net.bandwidth + 2 * (k - 1) * net.latency_s
    ring = _flat_ring(cluster, parts, m, "reducescatter") + _flat_ring(cluster, parts, m, "allgather")
    return min(rs + inter + ag, ring)


def allgather_time(
    cluster: Cluster, nbytes: float, group: Iterable[int], kind: str = "allgather", *, measured: bool = True
) -> float:
    """All-gather where ``nbytes`` is the *full gathered* size (each GPU contributes M/n).

    One node: ring, (n−1)/n·M/B + (n−1)α. Across k nodes: NCCL's ring through the nodes
    (``_flat_ring``), (n−1)/n·M / min(B_intra, B_net) + (n−k)α_intra + (k−1)α_net, B_net the
    network the group's g GPUs per node reach. ``kind``: whose intra-node link to use.
    """
    m = _nbytes(nbytes)
    g = _group(cluster, group)
    n = len(g)
    if n < 2:
        return 0.0
    parts = _by_node(cluster, g)
    if len(parts) == 1:
        return _ring_phase(cluster, g, m, kind, measured)
    return _flat_ring(cluster, parts, m, kind)


def reducescatter_time(
    cluster: Cluster, nbytes: float, group: Iterable[int], *, measured: bool = True
) -> float:
    """Reduce-scatter where ``nbytes`` is the *full* input size on each GPU (each keeps M/n).

    The mirror image of ``allgather_time`` (the same ring, reducing), so it costs the same on
    reduce-scatter's link.
    """
    return allgather_time(cluster, nbytes, group, "reducescatter", measured=measured)


def broadcast_time(
    cluster: Cluster, nbytes: float, group: Iterable[int], kind: str = "broadcast", *, measured: bool = True
) -> float:
    """Broadcast of ``nbytes`` (the message size) from one GPU of the group to the others.

    One node: pipelined ring (chunks flow down a chain), M/B + (n−1)α over the slowest link (or
    its measured curve's time if longer, ``_measured``).
    Across k nodes: a pipelined ring over the nodes, M/B_net + (k−1)α_net, then a pipelined ring
    inside each node with g_i ≥ 2, M/B_i + (g_i−1)α_i, the slowest node governing. The root's
    position does not change the cost. ``kind``: whose calibrated intra-node link to use.
    """
    m = _nbytes(nbytes)
    g = _group(cluster, group)
    n = len(g)
    if n < 2:
        return 0.0
    parts = _by_node(cluster, g)
    k = len(parts)
    if k == 1:
        link = _ring(cluster, g, kind)
        return max(
            m / link.bandwidth + (n - 1) * link.latency_s, _measured(cluster, g, kind, m, link, measured)
        )
    net = _net(cluster, parts)
    inter = m / net.bandwidth + (k - 1) * net.latency_s
    intra = 0.0
    for p in parts:
        if len(p) >= 2:
            link = _ring(cluster, p, kind)
            intra = max(intra, m / link.bandwidth + (len(p) - 1) * link.latency_s)
    return inter + intra


def reduce_time(cluster: Cluster, nbytes: float, group: Iterable[int], *, measured: bool = True) -> float:
    """Reduce of ``nbytes`` (each participant's buffer size) to one GPU: the mirror image of
    ``broadcast_time`` (pipelined ring inside nodes, then across them), so it costs the same."""
    return broadcast_time(cluster, nbytes, group, "reduce", measured=measured)


def _scatter_like(
    cluster: Cluster, nbytes: float, group: Iterable[int], root: int | None, out: bool
) -> float:
    m = _nbytes(nbytes)
    given = list(group)
    g = _group(cluster, given)
    r = given[0] if root is None else root
    if r not in g:
        raise CollectiveError(f"root GPU {r!r} is not in the group {list(g)}")
    n = len(g)
    if n < 2:
        return 0.0
    parts = _by_node(cluster, g)
    kind = "scatter" if out else "gather"
    if len(parts) == 1:
        link = _star(cluster, r, g, out, kind)
        return (n - 1) / n * m / link.bandwidth + (n - 1) * link.latency_s
    nodes = cluster.gpu_nodes
    leaders = [r if nodes[p[0]] == nodes[r] else p[0] for p in parts]
    net = _star(cluster, r, leaders, out, kind)
    g_root = next(len(p) for p in parts if nodes[p[0]] == nodes[r])
    inter = (n - g_root) / n * m / net.bandwidth + (len(parts) - 1) * net.latency_s
    intra = 0.0
    for lead, p in zip(leaders, parts, strict=True):
        if len(p) >= 2:
            link = _star(cluster, lead, p, out, kind)
            intra = max(intra, (len(p) - 1) / n * m / link.bandwidth + (len(p) - 1) * link.latency_s)
    return inter + intra


def scatter_time(cluster: Cluster, nbytes: float, group: Iterable[int], root: int | None = None) -> float:
    """Scatter where ``nbytes`` is the *full* size at the root (each GPU receives M/n).

    One node: the root sends to each GPU, (n−1)/n·M/B + (n−1)α over the slowest root→GPU link.
    Across k nodes: the root sends the shares of the other nodes, (n−g_root)/n·M, to their first
    GPUs over the slowest root→node link, + (k−1)α_net; then every node's first GPU (the root on
    its own node) scatters inside the node, (g_i−1)/n·M/B_i + (g_i−1)α_i, the slowest node
    governing. ``root`` defaults to the group's first GPU as given.
    """
    return _scatter_like(cluster, nbytes, group, root, out=True)


def gather_time(cluster: Cluster, nbytes: float, group: Iterable[int], root: int | None = None) -> float:
    """Gather where ``nbytes`` is the *full* size gathered at the root (each GPU sends M/n): the
    mirror image of ``scatter_time`` over the reverse links."""
    return _scatter_like(cluster, nbytes, group, root, out=False)


def alltoall_time(cluster: Cluster, nbytes: float, group: Iterable[int]) -> float:
    """All-to-all where ``nbytes`` is each participant's input size (it sends M/n to every peer).

    One node: (n−1)/n·M/B + (n−1)α over the slowest link between any two GPUs of the group.
    Across k nodes: intra- and inter-node traffic use different links and overlap, so node i
    takes max((g_i−1)/n·M/B_i, g_i·(n−g_i)/n·M/B_net) + (g_i−1)α_i + (n−g_i)α_net: its g_i GPUs
    together push g_i·(n−g_i)/n·M bytes through the node's network bandwidth B_net (the slowest
    link between any two of the group's nodes). The slowest node governs.
    """
    m = _nbytes(nbytes)
    g = _group(cluster, group)
    n = len(g)
    if n < 2:
        return 0.0
    parts = _by_node(cluster, g)
    if len(parts) == 1:
        link = _all_pairs(cluster, g, "alltoall")
        return (n - 1) / n * m / link.bandwidth + (n - 1) * link.latency_s
    net = _net(cluster, parts, all_pairs=True)
    worst = 0.0
    for p in parts:
        gi = len(p)
        intra_bw, intra_lat = 0.0, 0.0
        if gi >= 2:
            link = _all_pairs(cluster, p, "alltoall")
            intra_bw, intra_lat = (gi - 1) / n * m / link.bandwidth, (gi - 1) * link.latency_s
        inter_bw = gi * (n - gi) / n * m / net.bandwidth
        worst = max(worst, max(intra_bw, inter_bw) + intra_lat + (n - gi) * net.latency_s)
    return worst


COLLECTIVES: dict[str, Callable[[Cluster, float, Iterable[int]], float]] = {
    "allreduce": allreduce_time,
    "allgather": allgather_time,
    "reducescatter": reducescatter_time,
    "broadcast": broadcast_time,
    "reduce": reduce_time,
    "scatter": scatter_time,
    "gather": gather_time,
    "alltoall": alltoall_time,
}
"""Collective cost functions by name (scatter/gather with their default root)."""
