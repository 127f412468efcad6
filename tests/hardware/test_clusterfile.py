"""Cluster files (TOML): the shipped example, presets with overrides, and every validation error
naming the file, line:column, key path and expected vs actual."""

from __future__ import annotations

from pathlib import Path

import pytest

from distir.hardware.cluster import cluster_from_toml, load_cluster_file, parse_cluster
from distir.hardware.presets import GIB, PRESETS
from distir.hardware.specs import ClusterError, LinkSpec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "amp_hetero.toml"

INLINE = """\
[types.t]
gpu = "T"
devices_per_node = 2
fp32_tflops = 10
fp16_tflops = 100
memory_bandwidth_gb_s = 500
memory_gib = 16
intra_bandwidth_gb_s = 50
intra_latency_us = 4
inter_bandwidth_gb_s = 5
inter_latency_us = 40
"""


def err(text: str) -> ClusterError:
    with pytest.raises(ClusterError) as e:
        cluster_from_toml(text, "c.toml")
    return e.value


def test_example_file_parses_with_its_link_speeds() -> None:
    for c in (load_cluster_file(EXAMPLE), parse_cluster(str(EXAMPLE))):
        assert c.name == "amp-hetero" and c.num_devices == 16 and c.num_nodes == 4
        assert c.describe() == "3 × p3.8xlarge + 1 × g4dn.12xlarge (16 GPUs)"
        assert {c.kind_of(g) for g in range(12)} == {"V100-SXM2-16GB"}
        assert {c.kind_of(g) for g in range(12, 16)} == {"T4-16GB"}
        assert c.link(0, 1) == LinkSpec(50e9, 5e-6)  # p3 preset, latency overridden
        assert c.link(12, 13) == LinkSpec(15.75e9, 8e-6)  # PCIe Gen3 x16
        assert c.link(0, 4) == c.link(3, 12) == LinkSpec(1.25e9, 50e-6)  # [inter_node]
        assert c.device_spec(0) == PRESETS["p3.8xlarge"].device  # only a link was overridden
        t4 = c.device_spec(15)
        assert (t4.fp16, t4.memory_bandwidth, t4.memory_bytes) == (65e12, 320e9, 16 * GIB)


def test_inline_type_defaults_and_units() -> None:
    c = cluster_from_toml(INLINE + '[[nodes]]\ntype = "t"\ncount = 2\n', "x/my.toml")
    assert c.name == "my" and c.num_devices == 4
    d = c.device_spec(0)
    assert (d.fp32, d.tf32, d.bf16, d.fp16) == (10e12, 10e12, 10e12, 100e12)  # tf32/bf16 default fp32
    assert d.fp64 is None and d.launch_overhead_s == 5e-6 and d.memory_bytes == 16 * GIB
    assert c.link(0, 1) == LinkSpec(50e9, 4e-6) and c.link(1, 2) == LinkSpec(5e9, 40e-6)
    assert c.nodes[0].name == "t"


def test_preset_override_renames_the_device() -> None:
    c = cluster_from_toml('[types.fast]\npreset = "p3.8xlarge"\nfp32_tflops = 20\n[[nodes]]\ntype = "fast"\n')
    assert c.kind_of(0) == "V100-SXM2-16GB [fast]" and c.device_spec(0).fp32 == 20e12
    assert c.device_spec(0).fp16 == PRESETS["p3.8xlarge"].device.fp16 and c.nodes[0].name == "p3.8xlarge"
    named = '[types.f]\npreset = "p3.8xlarge"\ngpu = "V100-OC"\nmemory_gib = 32\n[[nodes]]\ntype = "f"\n'
    c2 = cluster_from_toml(named)
    assert c2.kind_of(0) == "V100-OC" and c2.device_spec(0).memory_bytes == 32 * GIB
    # a preset referenced directly from [[nodes]], mixed with an overridden copy of it
    mixed = cluster_from_toml(
        '[types.f]\npreset = "p3.8xlarge"\nfp32_tflops = 20\n'
        '[[nodes]]\ntype = "f"\n[[nodes]]\ntype = "p3.8xlarge"\ncount = 2\n'
    )
    assert mixed.num_devices == 12 and mixed.kind_of(4) == "V100-SXM2-16GB"


def test_matrices_in_the_file() -> None:
    nodes = '[[nodes]]\ntype = "local"\ncount = 2\n'
    text = "bandwidth_matrix_gb_s = [[0, 10], [20, inf]]\n"
    c = cluster_from_toml(text + nodes)
    assert c.link(0, 1) == LinkSpec(10e9, 50e-6) and c.link(1, 0) == LinkSpec(20e9, 50e-6)
    c2 = cluster_from_toml(text + "latency_matrix_us = [[0, 7], [9, 0]]\n" + nodes)
    assert c2.link(1, 0) == LinkSpec(20e9, 9e-6)


def test_inter_node_section() -> None:
    c = cluster_from_toml(
        '[[nodes]]\ntype = "h100"\ncount = 2\n[inter_node]\nbandwidth_gb_s = 50\nlatency_us = 0\n'
    )
    assert c.node_link(0, 1) == LinkSpec(50e9, 0.0)
    # a GPU pair crosses on one of the h100 node's 8 NICs: an eighth of the nodes' link, at the
    # 47 of 50 GB/s NCCL reaches on an NDR NIC (the preset's network_efficiency)
    assert c.link(0, 8) == LinkSpec(50e9 / 8 * (47 / 50), 0.0)


def test_nics_key() -> None:
    base = '[types.n]\npreset = "h100"\n'
    nodes = '[[nodes]]\ntype = "n"\ncount = 2\n'
    assert cluster_from_toml(base + nodes).nodes[0].nics == 8  # the preset's
    c = cluster_from_toml(base + "nics = 2\n" + nodes)
    assert c.nodes[0].nics == 2
    assert c.link(0, 8).bandwidth == 400e9 / 2 * (47 / 50)  # at NCCL's share of the line rate
    with pytest.raises(ClusterError, match=r"types\.n\.nics"):
        cluster_from_toml(base + "nics = 0\n" + nodes)


NODES = '[[nodes]]\ntype = "t"\n'


@pytest.mark.parametrize(
    ("text", "key", "needle", "line"),
    [
        ("nodez = 1\n" + INLINE + NODES, "nodez", "unknown key; did you mean nodes?", 1),
        (
            INLINE.replace("fp32_tflops", "fp32_tflop") + NODES,
            "types.t.fp32_tflop",
            "did you mean fp32_tflops?",
            4,
        ),
        (
            INLINE.replace("fp16_tflops = 100\n", "") + NODES,
            "types.t.fp16_tflops",
            "missing required key (dense fp16 peak, TFLOP/s; no preset to take it from)",
            1,
        ),
        (
            INLINE.replace("fp32_tflops = 10", "fp32_tflops = -1") + NODES,
            "types.t.fp32_tflops",
            "expected a positive number (dense fp32 peak, TFLOP/s), got -1",
            4,
        ),
        (
            INLINE.replace("memory_gib = 16", 'memory_gib = "16"') + NODES,
            "types.t.memory_gib",
            'expected a positive number (device memory, GiB), got "16" (a string)',
            7,
        ),
        (
            INLINE.replace("intra_latency_us = 4", "intra_latency_us = -4") + NODES,
            "types.t.intra_latency_us",
            "expected a non-negative number (intra-node latency, µs), got -4",
            9,
        ),
        (
            INLINE.replace("devices_per_node = 2", "devices_per_node = 2.0") + NODES,
            "types.t.devices_per_node",
            "expected a positive integer (GPUs per node), got 2.0",
            3,
        ),
        (
            INLINE + NODES + '[[nodes]]\ntype = "t"\ncount = 0\n',
            "nodes[1].count",
            "expected a positive integer (number of nodes), got 0",
            16,
        ),
        (INLINE + NODES + "count = true\n", "nodes[0].count", "got true (a boolean)", 14),
        (
            INLINE + '[[nodes]]\ntype = "u"\n',
            "nodes[0].type",
            "unknown node type 'u' (types defined here: t;",
            13,
        ),
        (INLINE + "[[nodes]]\ncount = 2\n", "nodes[0].type", "missing required key", 12),
        (
            INLINE + '[[nodes]]\ntype = "t"\nsize = 2\n',
            "nodes[0].size",
            "unknown key; (known keys: type, count)",
            14,
        ),
        (INLINE, "nodes", "missing required key (an array of [[nodes]] tables", None),
        ('[types.p]\npreset = "p3.8xl"\n' + NODES, "types.p.preset", "did you mean 'p3.8xlarge'?", 2),
        ("types = 3\n" + NODES, "types", "expected a table of node types, got 3", 1),
        (
            INLINE + NODES + "[inter_node]\nbandwidth_gb_s = 10\nlatency_us = -5\n",
            "inter_node.latency_us",
            "expected a non-negative number (µs), got -5",
            16,
        ),
        (
            INLINE + NODES + "[inter_node]\nbandwidth_gb_s = 10\n",
            "inter_node.latency_us",
            "missing required key",
            14,
        ),
        (
            "bandwidth_matrix_gb_s = [[0, 1], [1, 0], [1, 1]]\n" + INLINE + NODES,
            "bandwidth_matrix_gb_s",
            "expected an array of 2 rows (one per GPU), got 3 rows",
            1,
        ),
        (
            "name = 'm'\nbandwidth_matrix_gb_s = [\n  [0, 1],  # [x]\n  [0, 0],\n]\n" + INLINE + NODES,
            "bandwidth_matrix_gb_s[1][0]",
            "expected a positive number (GB/s), got 0",
            2,
        ),
        (
            "latency_matrix_us = [[0, 1], [1]]\n" + INLINE + NODES,
            "latency_matrix_us[1]",
            "expected an array of 2 numbers, got 1 entries",
            1,
        ),
        (
            "bandwidth_matrix_gb_s = [\n  [0, 1],\n  [1, 0],\n]\n"
            + INLINE.replace("memory_gib = 16", "memory_gib = 0")
            + NODES,
            "types.t.memory_gib",
            "expected a positive number (device memory, GiB), got 0",
            11,
        ),
        (
            INLINE
            + INLINE.replace("[types.t]", "[types.u]").replace("fp32_tflops = 10", "fp32_tflops = 11")
            + NODES,
            "types.u.gpu",
            "device name 'T' is also used by types.t with different figures",
            13,
        ),
    ],
)
def test_validation_errors_name_key_and_problem(text: str, key: str, needle: str, line: int | None) -> None:
    e = err(text)
    assert e.key == key, str(e)
    assert needle in e.message, str(e)
    assert e.line == line, str(e)
    loc = "c.toml" if line is None else f"c.toml:{line}:1"
    assert str(e) == f"{loc}: {key}: {e.message}"


def test_toml_syntax_errors_give_line_and_column(tmp_path: Path) -> None:
    e = err('[[nodes]]\ntype = "t"\ncount = \n')
    assert (e.line, e.col) == (3, 9) and e.key is None
    assert str(e) == "c.toml:3:9: invalid TOML: Invalid value"
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[types.a\n', encoding="utf-8")
    with pytest.raises(ClusterError) as info:
        parse_cluster(str(bad))
    assert str(info.value).startswith(f"{bad}:2:") and "invalid TOML" in str(info.value)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="no such file"):
        load_cluster_file(tmp_path / "missing.toml")
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00name")
    with pytest.raises(ClusterError, match="cannot read"):
        load_cluster_file(binary)


# -- GEMM curve and runtime memory ----------------------------------------------------------------
def test_gemm_and_runtime_memory_defaults() -> None:
    """An inline type gets no GEMM profile (a flat fraction) and the CUDA runtime defaults; a
    preset type keeps its preset's."""
    from distir.hardware.presets import CUDA_RUNTIME

    dev = cluster_from_toml(INLINE + '[[nodes]]\ntype = "t"\n').nodes[0].device
    assert dev.gemm is None and dev.runtime == CUDA_RUNTIME
    a100 = cluster_from_toml('[[nodes]]\ntype = "dgx-a100"\n').nodes[0].device
    assert a100 == PRESETS["dgx-a100"].device


def test_gemm_and_runtime_memory_overrides() -> None:
    text = """\
[types.a]
preset = "dgx-a100"
matmul_efficiency = 0.7
cuda_context_mib = 300
allocator_fragmentation = 0.1
runtime_memory_source = "measured"
[types.t]
gpu = "T"
devices_per_node = 2
fp32_tflops = 10
fp16_tflops = 100
memory_bandwidth_gb_s = 500
memory_gib = 16
intra_bandwidth_gb_s = 50
intra_latency_us = 4
inter_bandwidth_gb_s = 5
inter_latency_us = 40
sm_count = 20
matmul_efficiency = 0.6
matmul_anchor = [4096, 4096, 4096]
matmul_anchor_is_max = true
comm_buffers_mib = 0
[[nodes]]
type = "a"
[[nodes]]
type = "t"
"""
    c = cluster_from_toml(text)
    a, t = c.nodes[0].device, c.nodes[1].device
    base = PRESETS["dgx-a100"].device
    assert a.name == f"{base.name} [a]"  # other figures than the preset's: another name
    assert a.gemm is not None and base.gemm is not None
    assert a.gemm.fraction == 0.7 and a.gemm.sms == base.gemm.sms and a.gemm.anchor == base.gemm.anchor
    assert a.runtime.context_bytes == 300 << 20 and a.runtime.fragmentation == 0.1
    assert a.runtime.workspace_bytes == base.runtime.workspace_bytes and a.runtime.source == "measured"
    assert t.gemm is not None and (t.gemm.sms, t.gemm.fraction, t.gemm.anchor) == (
        20,
        0.6,
        (4096, 4096, 4096),
    )
    assert t.runtime.comm_bytes == 0 and t.runtime.context_bytes > 0
    assert t.gemm.anchor_is_max and a.gemm.anchor_is_max == base.gemm.anchor_is_max


@pytest.mark.parametrize(
    ("line", "key", "needle"),
    [
        ("matmul_efficiency = 1.5", "types.a.matmul_efficiency", "(0, 1]"),
        ("matmul_efficiency = 0", "types.a.matmul_efficiency", "positive number"),
        ("sm_count = 0", "types.a.sm_count", "positive integer"),
        ("matmul_anchor = [1, 2]", "types.a.matmul_anchor", "[M, N, K]"),
        ("cuda_context_mib = -1", "types.a.cuda_context_mib", "non-negative"),
        ("allocator_fragmentation = 1.0", "types.a.allocator_fragmentation", "[0, 1)"),
        ('workspace_mib = "big"', "types.a.workspace_mib", "non-negative number"),
        ("matmul_efficency = 0.5", "types.a.matmul_efficency", "did you mean matmul_efficiency"),
        ("comm_sm_count = 108", "types.a.comm_sm_count", "[0, sm_count=108)"),
        ("comm_sm_count = -1", "types.a.comm_sm_count", "integer"),
        ("comm_sm_source = 3", "types.a.comm_sm_source", "string"),
        ("matmul_anchor_is_max = 1", "types.a.matmul_anchor_is_max", "true or false"),
    ],
)
def test_bad_gemm_and_runtime_values_are_clear_errors(line: str, key: str, needle: str) -> None:
    e = err(f'[types.a]\npreset = "dgx-a100"\n{line}\n[[nodes]]\ntype = "a"\n')
    assert e.key == key and needle in e.message and e.line == 3, str(e)


def test_gemm_curve_needs_its_two_keys_without_a_preset() -> None:
    e = err(INLINE + 'matmul_efficiency = 0.6\n[[nodes]]\ntype = "t"\n')
    assert e.key == "types.t.sm_count" and "sm_count and matmul_efficiency" in e.message


def test_comm_sm_count_overrides_the_preset_and_zero_turns_it_off() -> None:
    base = PRESETS["dgx-a100"].device.gemm
    assert base is not None and base.comm_sms == 24
    for n in (0, 16):
        c = cluster_from_toml(f'[types.a]\npreset = "dgx-a100"\ncomm_sm_count = {n}\n[[nodes]]\ntype = "a"\n')
        g = c.nodes[0].device.gemm
        assert g is not None and g.comm_sms == n and g.comm_share == n / base.sms


def test_fp8_keys_set_the_fp8_peak_and_its_gemm_curve() -> None:
    """A preset's FP8 figures carry over; ``fp8_tflops`` and ``fp8_matmul_*`` override them; an
    inline type takes its float8 curve's SMs from its bf16 curve; without ``fp8_tflops`` a GPU
    has no FP8 tensor cores."""
    h100 = PRESETS["h100"].device
    assert h100.fp8 == 1979e12 and h100.gemm_fp8 is not None
    same = cluster_from_toml('[types.h]\npreset = "h100"\nmemory_gib = 96\n[[nodes]]\ntype = "h"\n')
    dev = same.nodes[0].device
    assert (dev.fp8, dev.gemm_fp8) == (h100.fp8, h100.gemm_fp8)
    text = '[types.h]\npreset = "h100"\nfp8_tflops = 1500\nfp8_matmul_efficiency = 0.6\n'
    dev = cluster_from_toml(text + '[[nodes]]\ntype = "h"\n').nodes[0].device
    assert dev.fp8 == 1500e12 and dev.gemm_fp8 is not None and dev.gemm_fp8.fraction == 0.6
    assert dev.gemm_fp8.anchor == h100.gemm_fp8.anchor and dev.name != h100.name
    inline = INLINE + "sm_count = 40\nmatmul_efficiency = 0.7\n"
    inline += "fp8_tflops = 200\nfp8_matmul_efficiency = 0.5\n"
    dev = cluster_from_toml(inline + '[[nodes]]\ntype = "t"\n').nodes[0].device
    assert dev.fp8 == 200e12 and dev.gemm_fp8 is not None
    assert (dev.gemm_fp8.sms, dev.gemm_fp8.fraction, dev.gemm_fp8.anchor) == (40, 0.5, (8192, 8192, 8192))
    assert cluster_from_toml(INLINE + '[[nodes]]\ntype = "t"\n').nodes[0].device.fp8 is None


@pytest.mark.parametrize(
    ("text", "key", "needle"),
    [
        (INLINE + "fp8_matmul_efficiency = 0.5\n", "types.t.fp8_matmul_efficiency", "needs fp8_tflops"),
        (INLINE + "fp8_tflops = -1\n", "types.t.fp8_tflops", "positive number"),
        (
            '[types.t]\npreset = "h100"\nfp8_matmul_efficiency = 1.5\n',
            "types.t.fp8_matmul_efficiency",
            "(0, 1]",
        ),
        ('[types.t]\npreset = "h100"\nfp8_matmul_anchor = [1]\n', "types.t.fp8_matmul_anchor", "[M, N, K]"),
    ],
)
def test_bad_fp8_keys_are_clear_errors(text: str, key: str, needle: str) -> None:
    e = err(text + '[[nodes]]\ntype = "t"\n')
    assert e.key == key and needle in e.message, str(e)


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("memory_gib = 1e300", "memory_gib"),  # overflowed converting to bytes (a traceback)
        ("memory_gib = 85899345920", "memory_gib"),  # bytes written for GiB
        ("fp32_tflops = 67e12", "fp32_tflops"),  # FLOP/s written for TFLOP/s
        ("fp32_tflops = 1e-300", "fp32_tflops"),  # a step of 10^297 s
        ("memory_bandwidth_gb_s = 3.35e12", "memory_bandwidth_gb_s"),  # B/s for GB/s
        ("launch_overhead_us = 1e9", "launch_overhead_us"),  # 1,000 s a kernel
        ("cuda_context_mib = 1e12", "cuda_context_mib"),
    ],
)
def test_a_figure_in_another_unit_is_an_error_naming_the_key(line: str, key: str) -> None:
    """A figure far outside what any GPU or link has (``PLAUSIBLE``, by the unit its key names)
    is one error naming the key and the unit, not a cluster that simulates absurdly or a
    traceback."""
    text = f'[types.t]\npreset = "h100"\n{line}\n' + NODES
    e = err(text)
    assert e.key == f"types.t.{key}" and e.line == 3, str(e)
    assert "is outside what any GPU or link has" in e.message and "check the unit" in e.message
    assert len(str(e).splitlines()) == 1


def test_real_figures_are_inside_the_plausible_ranges() -> None:
    """The repository's cluster files (published machines), zero latencies and half a GiB pass
    the unit check."""
    for path in sorted((Path(__file__).parents[2] / "bench" / "clusters").glob("*.toml")):
        load_cluster_file(path)
    zeros = "intra_latency_us = 0\nlaunch_overhead_us = 0\n"
    text = f'[types.t]\npreset = "h100"\n{zeros}memory_gib = 0.5\n' + NODES
    assert cluster_from_toml(text, "c.toml").nodes[0].device.memory_bytes == GIB // 2


@pytest.mark.parametrize("key", ["intra_bandwidth_gb_s = 10", "intra_latency_us = 40"])
def test_a_preset_types_intra_link_serves_every_collective_but_its_own(key: str) -> None:
    """`intra_*` on a type based on `dgx-a100` replaces the preset's per-collective links (NCCL's
    230 GB/s) and so its all-reduce curve: the user's figure held only for the collectives the
    preset names none for (an all-reduce over NVLink at 10 GB/s simulated as at 230). A
    collective the type names keeps the type's link; restating the preset's figure keeps all."""
    base = PRESETS["dgx-a100"]
    c = cluster_from_toml(f'[types.a]\npreset = "dgx-a100"\n{key}\n[[nodes]]\ntype = "a"\n')
    node = c.nodes[0]
    assert node.intra != base.intra and node.collectives == () and node.busbw_curves == ()
    for name in ("allreduce", "allgather", "reducescatter", "broadcast", "reduce"):
        assert base.intra_for(name) != node.intra and node.intra_for(name) == node.intra
    own = cluster_from_toml(
        f'[types.a]\npreset = "dgx-a100"\n{key}\n'
        "[types.a.collectives.allgather]\nbandwidth_gb_s = 100\nlatency_us = 2\n"
        '[[nodes]]\ntype = "a"\n'
    ).nodes[0]
    assert own.intra_for("allgather") == LinkSpec(100e9, 2e-6) and own.intra_for("allreduce") == own.intra
    same = cluster_from_toml(
        '[types.a]\npreset = "dgx-a100"\nintra_bandwidth_gb_s = 300\n[[nodes]]\ntype = "a"\n'
    )
    assert same.nodes[0].collectives == base.collectives and same.nodes[0].busbw_curves == base.busbw_curves


def test_a_preset_type_with_fewer_gpus_a_node_keeps_the_curves_measured_on_as_few() -> None:
    """`devices_per_node = 4` on `h100` keeps its curves measured on 4 GPUs and drops those on 8
    (the type was refused: "its allreduce curve was measured on 8 GPUs, more than its 4"); on 3
    GPUs none is left. The type's own curve on more GPUs than its node is still an error."""
    base = PRESETS["h100"]
    four = cluster_from_toml('[types.a]\npreset = "h100"\ndevices_per_node = 4\n[[nodes]]\ntype = "a"\n')
    kept = four.nodes[0].busbw_curves
    assert kept == tuple((n, c) for n, c in base.busbw_curves if c.ranks <= 4)
    assert kept and len(kept) < len(base.busbw_curves)
    three = cluster_from_toml('[types.a]\npreset = "dgx-a100"\ndevices_per_node = 3\n[[nodes]]\ntype = "a"\n')
    assert three.nodes[0].busbw_curves == () and three.num_devices == 3
    e = err(
        '[types.a]\npreset = "dgx-a100"\ndevices_per_node = 3\n[types.a.busbw_curves.allreduce]\n'
        'points = [[32768, 1.0], [1073741824, 200]]\nranks = 8\n[[nodes]]\ntype = "a"\n'
    )
    assert "measured on 8 GPUs, more than its 3" in str(e)
