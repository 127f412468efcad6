"""Fused-attention speed by shape (distir.hardware.attention) and its use by the cost model."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from distir.hardware.attention import FlashShape, attention_efficiency, attention_tflops, interpolate
from distir.hardware.cluster import parse_cluster
from distir.hardware.presets import PRESETS
from distir.hardware.specs import AttentionProfile, FamilyRates, SpecError
from distir.ir.types import Device, DType, TensorType
from distir.ir.values import Attrs
from distir.ops.attention import ATTENTION, ATTENTION_GRAD, forward_flops
from distir.sim.cost import RooflineCostModel

H100 = PRESETS["h100"].device
FA2 = H100.attention_profile("fa2")


def test_h100_has_fa2_and_cudnn_and_v100_none() -> None:
    assert FA2 is not None and H100.attention_profile("cudnn") is not None
    assert PRESETS["dgx2-v100"].device.attention == ()  # FlashAttention-2 does not run on Volta


def test_the_curve_passes_through_every_published_point() -> None:
    assert FA2 is not None
    for pts, causal, bwd in (
        (FA2.forward, False, False),
        (FA2.forward_causal, True, False),
        (FA2.backward, False, True),
    ):
        for seq, tflops in pts:
            assert attention_tflops(FA2, FlashShape(2, 16, seq, 128, causal, bwd)) == tflops


def test_between_points_linear_in_log_sequence_and_flat_beyond() -> None:
    pts = ((1024, 100.0), (4096, 200.0))
    assert interpolate(pts, 2048) == pytest.approx(150.0)
    assert interpolate(pts, 16) == 100.0
    assert interpolate(pts, 1 << 20) == 200.0


def test_causal_backward_derived_from_the_forward_ratio() -> None:
    assert FA2 is not None and FA2.backward_causal is None
    for seq in (512, 3000, 8192):
        want = (
            interpolate(FA2.backward, seq)
            * interpolate(FA2.forward_causal, seq)
            / interpolate(FA2.forward, seq)
        )
        got = attention_tflops(FA2, FlashShape(1, 32, seq, 128, causal=True, backward=True))
        assert got == pytest.approx(want)


def test_a100_profile_plateaus_at_the_papers_fractions() -> None:
    a100 = PRESETS["dgx-a100"].device.attention_profile("fa2")
    assert a100 is not None
    long = 1 << 16
    assert attention_efficiency(a100, FlashShape(1, 32, long, 128, False, False)) == pytest.approx(0.73)
    assert attention_efficiency(a100, FlashShape(1, 32, long, 128, False, True)) == pytest.approx(0.63)


def _qkv(b: int, s: int, h: int, d: int) -> list[TensorType]:
    t = TensorType(DType.bf16, (b, s, h, d), Device(0))
    return [t, t, t]


def test_cost_model_runs_attention_at_the_published_speed() -> None:
    cl = parse_cluster("h100")
    b, s, h, d = 2, 8192, 32, 128
    ins = _qkv(b, s, h, d)
    out = TensorType(DType.bf16, (b, s, h, d), Device(0))
    lse = TensorType(DType.f32, (b, h, s), Device(0))
    attrs = Attrs({"causal": True})
    flops = forward_flops(b, s, h, d, True)
    launch = H100.launch_overhead_s
    for kernel, tflops in (("fa2", 333.0), ("cudnn", 529.0)):  # FA3 paper Fig. 5, causal, 8k
        cost = RooflineCostModel(cl, attention_kernel=kernel)
        t = cost.compute_time(ATTENTION, ins, [out, lse], attrs, 0)
        assert t == pytest.approx(launch + flops / (989.5e12 * tflops / 989.5), rel=1e-9)
    grad_ins = [out, *ins, out, lse]
    cost = RooflineCostModel(cl)
    t = cost.compute_time(ATTENTION_GRAD, grad_ins, ins, attrs, 0)
    assert FA2 is not None
    bwd = attention_tflops(FA2, FlashShape(b, h, s, d, True, True))
    assert t == pytest.approx(launch + 2.5 * flops / (bwd * 1e12), rel=1e-9)


def test_an_unknown_kernel_falls_back_to_the_family_fraction() -> None:
    cl = parse_cluster("h100")
    ins = _qkv(1, 4096, 16, 128)
    outs = [ins[0], TensorType(DType.f32, (1, 16, 4096), Device(0))]
    cost = RooflineCostModel(cl, attention_kernel="fa3")
    t = cost.compute_time(ATTENTION, ins, outs, Attrs({}), 0)
    flops = forward_flops(1, 4096, 16, 128, False)
    assert t == pytest.approx(H100.launch_overhead_s + flops / (989.5e12 * 0.5), rel=1e-9)


def test_calibrated_family_rates_come_before_the_published_profile() -> None:
    import dataclasses

    from distir.hardware.cluster import Cluster

    base = parse_cluster("h100")
    node = base.nodes[0]
    rates = FamilyRates(flop=0.2, memory=0.5, launch_s=1e-5)
    dev = dataclasses.replace(node.device, name="h100-cal", families=(("attention", rates),))
    cl = Cluster("cal", (dataclasses.replace(node, device=dev),), inter_node=base.inter_node)
    ins = _qkv(1, 4096, 16, 128)
    outs = [ins[0], TensorType(DType.f32, (1, 16, 4096), Device(0))]
    t = RooflineCostModel(cl).compute_time(ATTENTION, ins, outs, Attrs({}), 0)
    flops = forward_flops(1, 4096, 16, 128, False)
    assert t == pytest.approx(1e-5 + flops / (989.5e12 * 0.2), rel=1e-9)


@pytest.mark.parametrize(
    "field,value",
    [
        ("forward", ()),
        ("forward", ((2048, 10.0), (1024, 12.0))),
        ("backward", ((0, 10.0),)),
        ("forward_causal", ((512, -1.0),)),
        ("peak_tflops", math.nan),
        ("head_dim", 0),
    ],
)
def test_a_malformed_profile_is_a_spec_error(field: str, value: object) -> None:
    assert FA2 is not None
    kwargs = {f: getattr(FA2, f) for f in AttentionProfile.__dataclass_fields__}
    kwargs[field] = value
    with pytest.raises(SpecError, match=field):
        AttentionProfile(**kwargs)  # type: ignore[arg-type]


def test_a_cluster_file_overrides_a_kernel_profile(tmp_path: Path) -> None:
    from distir.hardware.cluster import cluster_from_toml

    text = (
        '[types.x]\npreset = "h100"\n[types.x.attention.fa2]\npeak_tflops = 989.5\nhead_dim = 128\n'
        "forward = [[1024, 400.0]]\nforward_causal = [[1024, 300]]\nbackward = [[1024, 200]]\n"
        '[[nodes]]\ntype = "x"\n'
    )
    dev = cluster_from_toml(text).nodes[0].device
    fa2 = dev.attention_profile("fa2")
    assert fa2 is not None and fa2.forward == ((1024, 400.0),)
    assert dev.attention_profile("cudnn") == H100.attention_profile("cudnn")  # the preset's, kept


@pytest.mark.parametrize(
    "entry,key",
    [
        ("forward = [[2048, 1.0], [1024, 2.0]]", "forward"),
        ("forward = [[0, 1.0]]", "forward"),
        ("forward = 3", "forward"),
        ("bogus = 1", "bogus"),
    ],
)
def test_a_malformed_cluster_attention_table_is_a_cluster_error(entry: str, key: str) -> None:
    from distir.hardware.cluster import cluster_from_toml
    from distir.hardware.specs import ClusterError

    base = {"peak_tflops": "989.5", "head_dim": "128", "forward": "[[1024, 1.0]]"}
    base |= {"forward_causal": "[[1024, 1.0]]", "backward": "[[1024, 1.0]]"}
    k0 = entry.split(" =")[0]
    lines = [f"{k} = {v}" for k, v in base.items() if k != k0] + [entry]
    text = (
        '[types.x]\npreset = "h100"\n[types.x.attention.fa2]\n'
        + "\n".join(lines)
        + '\n[[nodes]]\ntype = "x"\n'
    )
    with pytest.raises(ClusterError, match=f"attention.fa2.{key}"):
        cluster_from_toml(text)


# FlashAttention v1's forward + backward TFLOP/s, as the FlashAttention-2 paper's Fig. 4 (A100
# 80GB SXM4) and Fig. 7 (H100 80GB SXM5) print them on the bars 'FlashAttention' (flash-attention's
# assets/flash2_{a100,h100}_fwd_bwd_benchmark.png), at sequence lengths 512 ... 16k, without and
# with causal mask: the speed distir gives FlashAttention in Triton (fa-triton).
_FA1_FWD_BWD = {
    ("dgx-a100", 64): ((91, 92, 104, 108, 110, 110), (58, 70, 77, 87, 92, 97)),
    ("dgx-a100", 128): ((76, 72, 76, 80, 82, 83), (55, 62, 69, 76, 80, 83)),
    ("h100", 64): ((157, 159, 161, 161, 166, 168), (104, 123, 136, 138, 149, 156)),
    ("h100", 128): ((127, 127, 128, 131, 137, 139), (98, 109, 108, 126, 135, 137)),
}


@pytest.mark.parametrize(("preset", "head_dim"), sorted(_FA1_FWD_BWD))
def test_fa_triton_takes_the_published_forward_backward_time(preset: str, head_dim: int) -> None:
    profile = PRESETS[preset].device.attention_profile("fa-triton", head_dim)
    assert profile is not None and profile.head_dim == head_dim
    seqs = (512, 1024, 2048, 4096, 8192, 16384)
    for causal, published in zip((False, True), _FA1_FWD_BWD[preset, head_dim], strict=True):
        for seq, tflops in zip(seqs, published, strict=True):
            shape = FlashShape(16384 // seq, 2048 // head_dim, seq, head_dim, causal, False)
            fwd = attention_tflops(profile, shape)
            bwd = attention_tflops(profile, shape._replace(backward=True))
            # the benchmark's FLOPs: forward F, backward 2.5 F, together 3.5 F in the published time
            assert 3.5 / (1 / fwd + 2.5 / bwd) == pytest.approx(tflops)


def test_the_profile_nearest_the_head_dimension_is_taken() -> None:
    dev = PRESETS["dgx-a100"].device
    for head_dim, want in ((32, 64), (64, 64), (80, 64), (96, 128), (112, 128), (256, 128)):
        got = dev.attention_profile("fa-triton", head_dim)
        assert got is not None and got.head_dim == want, head_dim
    assert dev.attention_profile("fa2", 64) is dev.attention_profile("fa2")  # one head dim: that one
    assert dev.attention_profile("cudnn", 128) is None  # not published on A100


def test_cost_model_charges_the_head_dimensions_profile() -> None:
    cl = parse_cluster("dgx-a100")
    a100 = PRESETS["dgx-a100"].device
    for d, tflops in ((64, 77.0), (128, 69.0)):  # the causal bars at 2k
        b, s, h = 8, 2048, 2048 // d
        ins = _qkv(b, s, h, d)
        outs = [ins[0], TensorType(DType.f32, (b, h, s), Device(0))]
        t = RooflineCostModel(cl, attention_kernel="fa-triton").compute_time(
            ATTENTION, ins, outs, Attrs({"causal": True}), 0
        )
        flops = forward_flops(b, s, h, d, True)
        assert t == pytest.approx(a100.launch_overhead_s + flops / (tflops * 1e12), rel=1e-9)


def test_fa_triton_is_slower_than_fa2_at_every_published_length() -> None:
    # FlashAttention-2 is 1.7-3.0x faster than FlashAttention (v1) on A100 (the paper's §4.1)
    for preset in ("dgx-a100", "h100"):
        dev = PRESETS[preset].device
        tri, fa2 = dev.attention_profile("fa-triton"), dev.attention_profile("fa2")
        assert tri is not None and fa2 is not None
        for seq in (512, 2048, 16384):
            for causal, bwd in ((False, False), (True, False), (False, True), (True, True)):
                shape = FlashShape(1, 16, seq, 128, causal, bwd)
                assert attention_tflops(tri, shape) < attention_tflops(fa2, shape)


def test_simulate_takes_each_published_kernel_and_names_a_bad_one() -> None:
    import json

    from typer.testing import CliRunner

    from distir.cli import app

    base = ["simulate", "--model", "gpt:layers=2,hidden=512,heads=4,seq=2048,vocab=512", "--batch", "4"]
    base += ["--cluster", "h100", "--dtype", "bf16", "--precision", "mixed", "--json"]
    step = {}
    for kernel in ("fa2", "fa-triton"):
        r = CliRunner().invoke(app, [*base, "--attention-kernel", kernel])
        assert r.exit_code == 0, r.stderr
        step[kernel] = json.loads(r.stdout)["step_time_s"]
    assert step["fa-triton"] > step["fa2"]
    bad = CliRunner().invoke(app, [*base, "--attention-kernel", "triton"])
    assert bad.exit_code == 2
    assert "--attention-kernel must be one of fa2, cudnn, fa-triton, got 'triton'" in bad.stderr


def test_a_cluster_file_gives_a_kernel_per_head_dimension(tmp_path: Path) -> None:
    from distir.hardware.cluster import cluster_from_toml
    from distir.hardware.specs import ClusterError

    curves = "forward = [[1024, {t}]]\nforward_causal = [[1024, {t}]]\nbackward = [[1024, {t}]]\n"
    entry = "[[types.x.attention.fa-triton]]\npeak_tflops = 312\nhead_dim = {d}\n" + curves
    text = '[types.x]\npreset = "dgx-a100"\n' + entry.format(d=64, t=100) + entry.format(d=128, t=50)
    dev = cluster_from_toml(text + '[[nodes]]\ntype = "x"\n').nodes[0].device
    got = [a for a in dev.attention if a.kernel == "fa-triton"]
    assert [(a.head_dim, a.forward) for a in got] == [(64, ((1024, 100.0),)), (128, ((1024, 50.0),))]
    assert dev.attention_profile("fa2") == PRESETS["dgx-a100"].device.attention_profile("fa2")
    twice = '[types.x]\npreset = "dgx-a100"\n' + entry.format(d=64, t=1) + entry.format(d=64, t=2)
    with pytest.raises(ClusterError, match="head_dim 64 given twice"):
        cluster_from_toml(twice + '[[nodes]]\ntype = "x"\n')


def test_a_device_with_a_kernel_twice_at_one_head_dimension_is_a_spec_error() -> None:
    import dataclasses

    a100 = PRESETS["dgx-a100"].device
    with pytest.raises(SpecError, match="twice"):
        dataclasses.replace(a100, attention=(*a100.attention, a100.attention[0]))
