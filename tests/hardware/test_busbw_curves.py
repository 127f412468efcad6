"""Measured bus bandwidth by message size (``NodeSpec.busbw_curves``) on the DGX presets.

Oracle: the published all-reduce sweep of one 8-GPU A100 node, typed in here from its source
(stas00/ml-engineering network/README.md at 744d01e, 'Real network throughput': nccl-tests
all_reduce_perf, busbw by size, 32 KiB ... 16 GiB), not read from the presets; a collective's
time is nccl-tests' busbw turned back into time, 2(n−1)/n·M/busbw, never below the alpha-beta
formula at the preset's peak (230 GB/s, 3 µs a step) and never faster than that peak. A group
of n ≠ 8 GPUs pays its own ring's latencies, 2(n−1)·3 µs, plus the measured time's data part
(the measured time less 14 steps, at least the peak's) scaled by 2(n−1)/n over 2·7/8.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from distir.hardware.cluster import Cluster, cluster_from_toml, parse_cluster
from distir.hardware.clusterfile import _kept_curves
from distir.hardware.presets import PRESETS, render_clusters_table
from distir.hardware.specs import CURVE_COLLECTIVES, BusBandwidthCurve, ClusterError, SpecError
from distir.sim.collectives import COLLECTIVES, allgather_time, allreduce_time, reducescatter_time

STEP = 3e-6
NODE = list(range(8))
A100_SWEEP = {  # bytes: busbw GB/s
    32 * 2**10: 1.31,
    64 * 2**10: 2.45,
    128 * 2**10: 4.43,
    256 * 2**10: 7.47,
    512 * 2**10: 11.41,
    2**20: 18.00,
    2 * 2**20: 36.18,
    4 * 2**20: 72.33,
    8 * 2**20: 109.93,
    16 * 2**20: 106.16,
    32 * 2**20: 138.49,
    64 * 2**20: 171.54,
    128 * 2**20: 176.92,
    256 * 2**20: 194.07,
    512 * 2**20: 222.72,
    2**30: 229.04,
    2 * 2**30: 231.41,
    4 * 2**30: 233.88,
    8 * 2**30: 234.61,
    16 * 2**30: 234.89,
}


def alpha_beta(m: float, n: int = 8, peak: float = 230e9) -> float:
    return 2 * (n - 1) / n * m / peak + 2 * (n - 1) * STEP


def test_a100_all_reduce_takes_the_measured_time_at_every_measured_size() -> None:
    c = parse_cluster("dgx-a100")
    for m, busbw in A100_SWEEP.items():
        measured = 2 * 7 / 8 * m / (min(busbw, 230) * 1e9)
        assert allreduce_time(c, m, NODE) == pytest.approx(max(measured, alpha_beta(m)), rel=1e-12), m
    # 25 MiB, a DDP bucket: well below the alpha-beta prediction's bandwidth
    t = allreduce_time(c, 25 * 2**20, NODE)
    assert 1.4 * alpha_beta(25 * 2**20) < t


def test_between_measured_sizes_the_time_is_linear_in_the_size() -> None:
    c = parse_cluster("dgx-a100")
    m0, m1 = 32 * 2**20, 64 * 2**20
    t0, t1 = (2 * 7 / 8 * m / (A100_SWEEP[m] * 1e9) for m in (m0, m1))
    for w in (0.25, 0.5, 0.75):
        mid = m0 + w * (m1 - m0)
        assert allreduce_time(c, mid, NODE) == pytest.approx(t0 + w * (t1 - t0), rel=1e-12)


def test_between_two_points_the_time_grows_unless_the_sweep_fell() -> None:
    # the bandwidth doubles from 1 to 2 MiB (18.00 to 36.18 GB/s, the same time): no size in
    # between runs faster than either end, where a bandwidth linear in log size would
    curve = BusBandwidthCurve(((2**20, 18.00e9), (2 * 2**20, 36.18e9)), 8, "")
    ends = min(2**20 / 18.00e9, 2 * 2**20 / 36.18e9)
    for k in range(1, 16):
        m = 2**20 * (1 + k / 16)
        assert m / curve.bandwidth(m) >= ends * (1 - 1e-12), m


@pytest.mark.parametrize(("preset", "peak"), [("dgx-a100", 230e9), ("h100", 480e9)])
def test_never_faster_than_the_peak_and_large_messages_unchanged(preset: str, peak: float) -> None:
    c = parse_cluster(preset)
    for k in range(6, 38):
        m = 2.0**k
        t = allreduce_time(c, m, NODE)
        assert 2 * 7 / 8 * m / t <= peak * (1 + 1e-12)
        assert t >= alpha_beta(m, peak=peak) * (1 - 1e-12)
    for m in (16 * 2**30, 64 * 2**30):  # beyond where the curves reach the peak: alpha-beta
        assert allreduce_time(c, m, NODE) == pytest.approx(alpha_beta(m, peak=peak), rel=1e-12)


def test_smaller_than_measured_costs_the_smallest_measured_message() -> None:
    c = parse_cluster("dgx-a100")
    floor = 2 * 7 / 8 * 32 * 2**10 / 1.31e9
    assert allreduce_time(c, 1024, NODE) == pytest.approx(floor, rel=1e-12)


def test_without_the_curve_when_asked() -> None:
    # a coalesced part of one call (distir.sim.cost) adds its bytes at the peak
    c = parse_cluster("dgx-a100")
    m = 2**20
    assert allreduce_time(c, m, NODE, measured=False) == pytest.approx(alpha_beta(m), rel=1e-12)


def data_part(m: float, busbw_gb_s: float) -> float:
    """The measured 8-GPU time of an all-reduce less its 14 ring steps, at least the peak's."""
    return max(2 * 7 / 8 * m / (busbw_gb_s * 1e9) - 14 * STEP, 2 * 7 / 8 * m / 230e9)


def test_smaller_groups_pay_their_own_latency_and_the_scaled_data_part() -> None:
    c = parse_cluster("dgx-a100")
    for m in (32 * 2**10, 2**20, 64 * 2**20):
        for n in (2, 4):
            want = 2 * (n - 1) * STEP + (2 * (n - 1) / n) / (2 * 7 / 8) * data_part(m, A100_SWEEP[m])
            assert allreduce_time(c, m, range(n)) == pytest.approx(want, rel=1e-12), (m, n)
    # a 1 KiB all-reduce of 2 GPUs: its 2 steps and the smallest measured size's data part
    want = 2 * STEP + (1 / 1.75) * data_part(32 * 2**10, 1.31)
    assert allreduce_time(c, 1024, range(2)) == pytest.approx(want, rel=1e-12)
    assert allreduce_time(c, 1024, range(2)) < 8e-6


def test_curves_only_where_measured() -> None:
    # groups across nodes and collectives without a curve keep the alpha-beta formula
    c = parse_cluster("dgx-a100:2")
    m = 64 * 2**20
    assert allgather_time(c, m, NODE) == pytest.approx(7 / 8 * m / 230e9 + 7 * STEP, rel=1e-12)
    ab = parse_cluster("dgx-a100:2")
    net = allreduce_time(ab, m, range(16))
    plain = cluster_from_toml(
        '[types.n]\npreset = "dgx-a100"\n[types.n.busbw_curves.allreduce]\npoints = []\n'
        '[[nodes]]\ntype = "n"\ncount = 2\n'
    )
    assert net == allreduce_time(plain, m, range(16))
    assert allreduce_time(plain, m, NODE) == pytest.approx(alpha_beta(m), rel=1e-12)


NODES = '[[nodes]]\ntype = "n"\n'


def curve_file(points: str, collective: str = "allreduce", ranks: object = 8) -> str:
    head = f'[types.n]\npreset = "dgx-a100"\n[types.n.busbw_curves.{collective}]\n'
    return head + f"points = {points}\nranks = {ranks}\n" + NODES


def test_cluster_file_overrides_a_curve() -> None:
    c = cluster_from_toml(curve_file("[[1048576, 10], [1073741824, 20]]"))
    m = 2**20
    assert allreduce_time(c, m, NODE) == pytest.approx(2 * 7 / 8 * m / 10e9, rel=1e-12)
    assert c.nodes[0].curve_for("allreduce", 8) == BusBandwidthCurve(((2**20, 10e9), (2**30, 20e9)), 8, "")
    inherited = cluster_from_toml('[types.n]\npreset = "h100"\n' + NODES)
    assert inherited.nodes[0].busbw_curves == PRESETS["h100"].busbw_curves
    gathered = cluster_from_toml(curve_file("[[1048576, 10], [1073741824, 20]]", "allgather"))
    assert allgather_time(gathered, m, NODE) == pytest.approx(7 / 8 * m / 10e9, rel=1e-12)


@pytest.mark.parametrize(
    ("points", "match"),
    [
        ("[[1048576, 100]]", "two or more"),
        ("[[1048576, 100], [1024, 200]]", "sorted by size"),
        ("[[1048576, -1], [1073741824, 200]]", "positive"),
        ("[[1.5, 100], [1073741824, 200]]", "bytes"),
        ('"fast"', "expected"),
    ],
)
def test_cluster_file_curve_is_validated_in_one_line(points: str, match: str) -> None:
    with pytest.raises(ClusterError, match=match) as e:
        cluster_from_toml(curve_file(points))
    assert "types.n.busbw_curves.allreduce.points" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("ranks", ["1", '"8"', "0"])
def test_cluster_file_curve_ranks_are_validated_in_one_line(ranks: str) -> None:
    with pytest.raises(ClusterError, match=r"types\.n\.busbw_curves\.allreduce\.ranks") as e:
        cluster_from_toml(curve_file("[[1, 1], [2, 2]]", ranks=ranks))
    assert "\n" not in str(e.value)


def test_cluster_file_curve_names_a_collective() -> None:
    with pytest.raises(ClusterError, match="unknown key") as e:
        cluster_from_toml(curve_file("[[1, 1], [2, 2]]", "allredcue"))
    assert "\n" not in str(e.value)


def test_spec_validates_the_points() -> None:
    with pytest.raises(SpecError, match="sorted by size"):
        BusBandwidthCurve(((2, 1.0), (1, 1.0)), 8, "")
    with pytest.raises(SpecError, match="two or more"):
        BusBandwidthCurve(((2, 1.0),), 8, "")
    with pytest.raises(SpecError, match="ranks must be an int of at least 2"):
        BusBandwidthCurve(((1, 1.0), (2, 1.0)), 1, "")


def test_clusters_table_prints_the_curves_sources() -> None:
    console = Console(width=400, record=True)
    console.print(render_clusters_table())
    text = " ".join(console.export_text().split())
    assert (
        text.count("allreduce bus bandwidth by size on 8 GPUs (20 points") == 3
    )  # dgx-a100, ndm-a100-v4, h100
    assert "allgather bus bandwidth by size on 4 GPUs (19 points" in text
    assert "reducescatter bus bandwidth by size on 4 GPUs (19 points" in text
    assert "nccl-collectives-bench" in text
    assert "nccl-tests all_reduce_perf -b 32k -e 16G" in text
    assert "8x H200 node" in text
    assert "allreduce bus bandwidth by size on 4 GPUs (19 points" in text


# nccl-tests all_gather_perf / reduce_scatter_perf on 4 H100s of an NVSwitch node, out-of-place
# busbw (waynehacking8/nccl-collectives-bench at f9883f8, results/all_gather.txt and
# results/reduce_scatter.txt), a few of the sizes, typed in from the source
H100_4GPU = {  # bytes: (all-gather, reduce-scatter) busbw GB/s
    2**20: (35.00, 30.28),
    16 * 2**20: (186.64, 201.26),
    256 * 2**20: (305.51, 303.62),
    8 * 2**30: (343.92, 350.34),
}


def test_h100_all_gather_and_reduce_scatter_follow_their_4_gpu_sweeps() -> None:
    c = parse_cluster("h100")
    for m, (ag, rs) in H100_4GPU.items():
        for fn, busbw, peak in ((allgather_time, ag, 350e9), (reducescatter_time, rs, 360e9)):
            measured = 3 / 4 * m / (busbw * 1e9)
            ab = 3 / 4 * m / peak + 3 * STEP
            assert fn(c, m, range(4)) == pytest.approx(max(measured, ab), rel=1e-12), (fn, m)
            # 8 GPUs: their own 7 steps and the 4-GPU data part scaled by (7/8) / (3/4)
            data = max(measured - 3 * STEP, 3 / 4 * m / peak)
            want = 7 * STEP + (7 / 8) / (3 / 4) * data
            assert fn(c, m, NODE) == pytest.approx(want, rel=1e-12), (fn, m)
    # beyond the sweep's 8 GiB: the 8 GiB bus bandwidth, below the published peak
    m = 16 * 2**30
    data = max(3 / 4 * m / 343.92e9 - 3 * STEP, 3 / 4 * m / 350e9)
    assert allgather_time(c, m, NODE) == pytest.approx(7 * STEP + (7 / 8) / (3 / 4) * data, rel=1e-12)


def test_groups_across_nodes_use_no_curve() -> None:
    # neither the flat ring nor the hierarchical form's phases inside the nodes (h100's
    # all-gather and reduce-scatter curves)
    curves = "".join(
        f"[types.n.busbw_curves.{k}]\npoints = []\n" for k in ("allreduce", "allgather", "reducescatter")
    )
    plain = cluster_from_toml('[types.n]\npreset = "h100"\n' + curves + '[[nodes]]\ntype = "n"\ncount = 2\n')
    c = parse_cluster("h100:2")
    for m in (2**20, 64 * 2**20, 2**30):
        for group in (range(16), range(0, 16, 2)):
            assert allreduce_time(c, m, group) == allreduce_time(plain, m, group)
            assert allgather_time(c, m, group) == allgather_time(plain, m, group)


def test_past_the_sweep_the_time_keeps_growing() -> None:
    # the H100 all-gather sweep ends at 8 GiB below its peak: a byte more takes longer, not the
    # alpha-beta time at the peak
    c = parse_cluster("h100")
    m = 8 * 2**30
    for fn in (allgather_time, reducescatter_time):
        for n in (2, 4, 8):
            assert fn(c, m + 1, range(n)) > fn(c, m, range(n)), (fn, n)
    curve = BusBandwidthCurve(((2**20, 10e9), (2**30, 20e9)), 8, "")
    assert curve.bandwidth(2**40) == 20e9


CURVED = list(dict.fromkeys((p, name) for p, node in PRESETS.items() for name, _ in node.busbw_curves))
_PRESET_CLUSTERS = {p: parse_cluster(p) for p, _ in CURVED}


@pytest.mark.parametrize(("preset", "name"), CURVED)
@given(n=st.integers(2, 8), lo=st.floats(0.0, 1.0), step=st.floats(0.0, 1.0))
def test_time_never_falls_as_the_message_grows_past_the_sweep(
    preset: str, name: str, n: int, lo: float, step: float
) -> None:
    # from the curve's last measured segment to 8x its largest size, crossing the sweep's end
    # (below a few MiB the time follows the measured points, which fall in places: the A100
    # all-reduce's 2 MiB ran in 0.5% less time than its 1 MiB)
    c = _PRESET_CLUSTERS[preset]
    curve = c.nodes[0].curve_for(name, n)
    assert curve is not None
    a, b = math.log(curve.points[-2][0]), math.log(8 * curve.points[-1][0])
    m = math.exp(a + lo * (b - a))
    bigger = m * math.exp(step * (b - a)) + 1
    fn = COLLECTIVES[name]
    assert fn(c, bigger, range(n)) >= fn(c, m, range(n))


def test_curves_only_for_collectives_that_read_them() -> None:
    # each of CURVE_COLLECTIVES reads its curve (a slow one slows it); the others have none
    slow = BusBandwidthCurve(((2**20, 1e9), (2**30, 2e9)), 8, "")
    base = PRESETS["dgx-a100"]
    for name in CURVE_COLLECTIVES:
        node = replace(base, busbw_curves=((name, slow),))
        c, plain = Cluster("c", (node,)), Cluster("p", (replace(base, busbw_curves=()),))
        assert COLLECTIVES[name](c, 2**20, NODE) > COLLECTIVES[name](plain, 2**20, NODE), name
    for name in sorted(set(COLLECTIVES) - set(CURVE_COLLECTIVES)):
        with pytest.raises(SpecError, match=f"busbw_curves names '{name}', which reads no curve"):
            replace(base, busbw_curves=((name, slow),))
        with pytest.raises(ClusterError, match=f"types.n.busbw_curves.{name}: {name} reads no curve") as e:
            cluster_from_toml(curve_file("[[1, 1], [2, 2]]", name))
        assert "\n" not in str(e.value)


def test_a_preset_type_drops_the_curves_its_figures_override() -> None:
    # the reviewer's case: an H100 type with its own all-gather link runs at it at every size
    own = (
        '[types.n]\npreset = "h100"\n[types.n.collectives.allgather]\nbandwidth_gb_s = 700\nlatency_us = 3\n'
    )
    c = cluster_from_toml(own + NODES)
    assert c.nodes[0].curve_for("allgather", 8) is None
    assert c.nodes[0].curve_for("reducescatter", 8) == PRESETS["h100"].curve_for("reducescatter", 8)
    for m in (64 * 2**20, 2**30):
        assert allgather_time(c, m, NODE) == pytest.approx(7 / 8 * m / 700e9 + 7 * STEP, rel=1e-12)
    # a curve of its own for that collective stays
    mine = own + "[types.n.busbw_curves.allgather]\npoints = [[1048576, 10], [1073741824, 20]]\nranks = 8\n"
    assert cluster_from_toml(mine + NODES).nodes[0].curve_for("allgather", 4) is not None
    # the preset's link restated: the curve stays
    same = (
        '[types.n]\npreset = "h100"\n[types.n.collectives.allgather]\nbandwidth_gb_s = 350\nlatency_us = 3\n'
    )
    assert cluster_from_toml(same + NODES).nodes[0].busbw_curves == PRESETS["h100"].busbw_curves
    # the intra-node link: the curves of collectives running on it (none has a link of its own)
    bare = replace(PRESETS["h100"], collectives=())
    for key, n in (("intra_bandwidth_gb_s", 100.0), ("intra_latency_us", 9.0)):
        assert _kept_curves(bare, (), {key: n * 1e9 if "bandwidth" in key else n * 1e-6}) == (), key
        assert _kept_curves(PRESETS["h100"], PRESETS["h100"].collectives, {key: 1.0}) == bare.busbw_curves
    # another GPU name keeps them: the collectives' links are the preset's
    gpu = cluster_from_toml('[types.n]\npreset = "h100"\ngpu = "X"\n' + NODES).nodes[0]
    assert gpu.busbw_curves == PRESETS["h100"].busbw_curves


# nccl-tests all_reduce_perf on 4 H100s of an NVSwitch node, out-of-place busbw, the same run
# (results/all_reduce.txt at f9883f8), and ml-engineering's 8-GPU (H200) sweep, typed in
H100_ALLREDUCE = {  # bytes: (4-GPU, 8-GPU) busbw GB/s
    2**20: (58.18, 39.93),
    16 * 2**20: (246.47, 219.89),
    256 * 2**20: (340.82, 436.15),
    8 * 2**30: (366.37, 477.45),
}


def test_h100_all_reduce_rings_on_4_gpus_and_reduces_in_the_switch_on_8() -> None:
    # NCCL rings an all-reduce on 2 and 4 H100s and switches to NVLS from 6 (the source's
    # scaling_attributed report): groups of up to 5 read the 4-GPU sweep, 6 to 8 the 8-GPU one
    c = parse_cluster("h100")
    for m, (four, eight) in H100_ALLREDUCE.items():
        for n, busbw in ((4, four), (8, eight)):
            measured = 2 * (n - 1) / n * m / (busbw * 1e9)
            ab = 2 * (n - 1) / n * m / 480e9 + 2 * (n - 1) * STEP
            assert allreduce_time(c, m, range(n)) == pytest.approx(max(measured, ab), rel=1e-12), (n, m)
    four_gpu = PRESETS["h100"].curve_for("allreduce", 4)
    assert four_gpu is not None and four_gpu.ranks == 4
    picked = {n: PRESETS["h100"].curve_for("allreduce", n) for n in range(2, 9)}
    assert [c.ranks if c else None for c in picked.values()] == [4, 4, 4, 4, 8, 8, 8]
    # a large TP=4 all-reduce runs at the ring's 366 GB/s, not at NVLS's 480
    m = 8 * 2**30
    assert 2 * 3 / 4 * m / allreduce_time(c, m, range(4)) == pytest.approx(366.37e9, rel=1e-3)


def test_curves_on_several_group_sizes_pick_the_nearest_the_larger_on_a_tie() -> None:
    two = BusBandwidthCurve(((2**20, 10e9), (2**30, 20e9)), 2, "two")
    six = BusBandwidthCurve(((2**20, 30e9), (2**30, 40e9)), 6, "six")
    node = replace(PRESETS["dgx-a100"], busbw_curves=(("allgather", six), ("allgather", two)))
    assert [node.curve_for("allgather", n).source for n in range(2, 9)] == [  # type: ignore[union-attr]
        "two",
        "two",
        "six",
        "six",
        "six",
        "six",
        "six",
    ]
    assert node.curve_for("reducescatter", 4) is None
    with pytest.raises(SpecError, match="two allgather curves on 6 GPUs"):
        replace(node, busbw_curves=(("allgather", six), ("allgather", six)))


def test_cluster_file_gives_curves_on_several_group_sizes() -> None:
    head = '[types.n]\npreset = "h100"\n'
    curves = "".join(
        f"[[types.n.busbw_curves.allreduce]]\npoints = [[1048576, {b}], [1073741824, {2 * b}]]\nranks = {r}\n"
        for r, b in ((2, 10), (8, 30))
    )
    c = cluster_from_toml(head + curves + NODES)
    got = {curve.ranks: curve.points[0][1] for name, curve in c.nodes[0].busbw_curves if name == "allreduce"}
    assert got == {2: 10e9, 8: 30e9}  # the preset's 4- and 8-GPU all-reduce curves replaced
    assert c.nodes[0].curve_for("allgather", 4) == PRESETS["h100"].curve_for("allgather", 4)
    m = 2**20
    assert allreduce_time(c, m, range(2)) == pytest.approx(m / 10e9, rel=1e-12)
    twice = curves.replace("ranks = 8", "ranks = 2")
    with pytest.raises(ClusterError, match=r"types\.n\.busbw_curves\.allreduce\[1\]\.ranks.*second") as e:
        cluster_from_toml(head + twice + NODES)
    assert "\n" not in str(e.value)
    removed = cluster_from_toml(head + "[types.n.busbw_curves.allreduce]\npoints = []\n" + NODES)
    assert removed.nodes[0].curve_for("allreduce", 4) is None


def test_cluster_file_curve_errors_name_their_line_and_entry() -> None:
    head = '[types.n]\npreset = "h100"\n\n'
    one = "[[types.n.busbw_curves.allreduce]]\npoints = [[1048576, 10], [1073741824, 20]]\n"
    with pytest.raises(ClusterError) as e:  # an array of one table: its entry, at its line
        cluster_from_toml(head + one + NODES, "t.toml")
    where = "t.toml:4:1: types.n.busbw_curves.allreduce[0].ranks"
    assert str(e.value).startswith(where + ": missing required key")
    bad = "[types.n.busbw_curves.allreduce]\npoints = [[1048576, -1], [1073741824, 20]]\nranks = 8\n"
    with pytest.raises(ClusterError) as e:  # located once, not twice
        cluster_from_toml(head + bad + NODES, "t.toml")
    assert str(e.value).count("t.toml:") == 1 and "expected [[bytes, GB/s], ...]" in str(e.value)
    with pytest.raises(ClusterError, match="expected a table or an array of tables, got an empty array"):
        cluster_from_toml(head + "[types.n.busbw_curves]\nallreduce = []\n" + NODES)
    wide = "[types.n.busbw_curves.allreduce]\npoints = [[1048576, 10], [1073741824, 20]]\nranks = 64\n"
    with pytest.raises(ClusterError, match="measured on 64 GPUs, more than its 8") as e:
        cluster_from_toml(head + wide + NODES)
    assert "\n" not in str(e.value)
