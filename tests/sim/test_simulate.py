"""The simulator: DistIR timing semantics (Figure 3), hand-computed timelines and memory,
call summaries agreeing with inlined programs, and the trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import distir
from distir.hardware.cluster import Cluster, parse_cluster
from distir.hardware.specs import DeviceSpec, LinkSpec, NodeSpec
from distir.ir import Module, Op, parse_module, print_module
from distir.ir.rewrite import inline_calls
from distir.report.demo import example_text
from distir.sim.cost import FixedCostModel, RooflineCostModel
from distir.sim.devices import DeviceMap, DeviceMapError, Slot
from distir.sim.simulate import simulate
from distir.sim.trace import trace_events, write_trace


def UnitCost() -> FixedCostModel:
    """Every op that does any work costs 1 s, MatMul 2 s; every communication 0.5 s."""
    return FixedCostModel(compute=1.0, comm=0.5, by_op={"MatMul": 2.0})


def tiny_cluster(memory_bytes: int = 1 << 30, gpus: int = 2) -> Cluster:
    dev = DeviceSpec("tiny", 1e12, 1e12, 1e12, 1e12, 1e11, memory_bytes, 0.0)
    node = NodeSpec("tinynode", dev, gpus, LinkSpec(1e10, 1e-6), LinkSpec(1e9, 1e-5))
    return Cluster("tiny", (node,))


T = "Tensor[f32, (4, 2), d{}]"
PIPE = f"""func @pp(%x: {T.format(0)}) {{
  %x1, %x2 = Split(%x, dim=0, num_splits=2)
  %a1 = Relu(%x1)
  %b1 = Send(%a1, dst=d1)
  %a2 = Relu(%x2)
  %c1 = Relu(%b1)
  %b2 = Send(%a2, dst=d1)
  %c2 = Relu(%b2)
  return %c1, %c2
}}
"""


def sim(text: str, **kw: object):  # type: ignore[no-untyped-def]
    m = distir.check(parse_module(text))
    return simulate(m, kw.pop("cluster", tiny_cluster()), cost_model=kw.pop("cost", UnitCost()), **kw)  # type: ignore[arg-type]


def test_two_stage_pipeline_timeline_by_hand() -> None:
    r = sim(PIPE, trace=True)
    # d0: Split 0-1, a1 1-2, send b1 2-2.5, a2 2.5-3.5, send b2 3.5-4
    # d1: send b1 2-2.5, c1 2.5-3.5, send b2 3.5-4, c2 4-5
    assert r.step_time_s == 5.0
    assert r.busy_s == [3.0, 2.0] and r.comm_s == [1.0, 1.0]
    got = sorted((n, s, e, d) for n, s, e, d, _ in r.slices)  # type: ignore[union-attr]
    assert got == sorted(
        [
            ("Split", 0.0, 1.0, 0),
            ("Relu", 1.0, 2.0, 0),
            ("Send", 2.0, 2.5, 0),
            ("Send", 2.0, 2.5, 1),
            ("Relu", 2.5, 3.5, 0),
            ("Relu", 2.5, 3.5, 1),
            ("Send", 3.5, 4.0, 0),
            ("Send", 3.5, 4.0, 1),
            ("Relu", 4.0, 5.0, 1),
        ]
    )
    assert r.bubble_fraction == pytest.approx(((5 - 4) / 5 + (5 - 3) / 5) / 2)


def test_program_order_is_the_schedule() -> None:
    """Swapping c1 and the second Send (no data dependence) serializes d1 behind the Send."""
    swapped = PIPE.replace(
        "  %c1 = Relu(%b1)\n  %b2 = Send(%a2, dst=d1)\n", "  %b2 = Send(%a2, dst=d1)\n  %c1 = Relu(%b1)\n"
    )
    assert swapped != PIPE
    assert sim(swapped).step_time_s == 6.0


def _fig3_variant() -> str:
    text = example_text("fig2_mlp_pipeline.distir")
    a, b = "  %p_1 = @dense(%w2, %ar_1)\n", "  %ar_2 = Send(%as_2, dst=d2)\n"
    assert a + b in text
    return text.replace(a + b, b + a)


@pytest.mark.parametrize("cluster", ["dgx2-v100", "p3.8xlarge"])
def test_figure3_swapping_lines_10_and_11_is_slower(cluster: str) -> None:
    cl = parse_cluster(cluster)
    fig2 = distir.check(parse_module(example_text("fig2_mlp_pipeline.distir")))
    var = distir.check(parse_module(_fig3_variant()))
    a, b = simulate(fig2, cl), simulate(var, cl)
    assert b.step_time_s > a.step_time_s
    assert b.flops == a.flops and b.n_ops == a.n_ops


def test_figure3_trace_order() -> None:
    """Each device's slices follow Figure 3's op order (top: @mlpPP; bottom: the variant)."""
    cl = parse_cluster("dgx2-v100")
    top = [
        "Split",
        "@dense",
        "Send",
        "@dense",
        "Send",
        "Send",
        "@denseGrad",
        "Send",
        "@denseGrad",
        "Sum",
        "SGD",
    ]
    d2 = [
        "Split",
        "Send",
        "@dense",
        "Send",
        "@lossGrad",
        "@denseGrad",
        "Send",
        "@dense",
        "@lossGrad",
        "@denseGrad",
        "Send",
        "Sum",
        "SGD",
    ]
    for text, p1_before_ar2 in ((example_text("fig2_mlp_pipeline.distir"), True), (_fig3_variant(), False)):
        r = simulate(distir.check(parse_module(text)), cl, trace=True)
        per = {0: [], 1: []}  # type: dict[int, list[tuple[float, str]]]
        for name, s, _, slot, _ in r.slices or []:
            per[slot].append((s, name))
        order0 = [n for _, n in sorted(per[0], key=lambda x: x[0])]
        order1 = [n for _, n in sorted(per[1], key=lambda x: x[0])]
        assert order0 == top
        want1 = d2 if p1_before_ar2 else ["Split", "Send", "Send", "@dense", *d2[4:]]
        assert order1 == want1
        # top: %as_2 on d1 starts with %p_1 on d2 (they overlap); bottom: %p_1 waits for %ar_2
        as2 = sorted(per[0])[3]
        p1 = next(x for x in sorted(per[1]) if x[1] == "@dense")
        sends1 = sorted((s, e) for n, s, e, slot, _ in r.slices or [] if n == "Send" and slot == 1)
        if p1_before_ar2:
            assert as2[1] == "@dense" and as2[0] == p1[0]
        else:
            assert p1[0] >= sends1[1][1] > as2[0]  # after the second Send (ar_2) ends


def test_memory_peak_by_hand_and_oom() -> None:
    text = """func @m(%x: Tensor[f32, (256,), d0]) {
  %a = Relu(%x)
  %b = Relu(%a)
  %c = Add(%b, %x)
  %r = Reshape(%c, %s)
  return %c
}
"""
    text = text.replace("  %r = Reshape(%c, %s)\n", "")
    r = sim(text)
    # x (1 KiB, parameter) + a + b live during the second Relu; a is freed after it
    assert r.param_memory == {0: 1024.0}
    assert r.peak_memory == {0: 3072.0}
    assert r.oom_gpus == []
    small = sim(text, cluster=tiny_cluster(memory_bytes=3000))
    assert small.oom_gpus == [0]
    from distir.sim.summary import summary_dict

    d = summary_dict(small)
    assert d["oom"] is True and d["oom_devices"] == ["d0"] and d["peak_memory_bytes"] == {"d0": 3072.0}


def test_views_do_not_allocate() -> None:
    text = """func @m(%x: Tensor[f32, (256,), d0]) {
  %s = Constant(value=[16, 16], device=d0)
  %a = Relu(%x)
  %v = Reshape(%a, %s)
  %b = Relu(%v)
  return %b
}
"""
    r = sim(text)
    # x 1024 + s 16 + a 1024 (aliased by v until b's last read) + b 1024
    assert r.peak_memory == {0: 1024.0 + 16 + 1024 + 1024}


@pytest.mark.parametrize(
    "name", ["fig2_mlp_pipeline.distir", "fig8_checkpointing.distir", "fig9_zero.distir"]
)
def test_call_summaries_match_the_inlined_program(name: str) -> None:
    m = distir.check(parse_module(example_text(name)))
    flat = Module((inline_calls(m),))
    for cl in (parse_cluster("dgx2-v100"), tiny_cluster()):
        # fused chains do not cross calls (inlining can fuse more: distir.sim.fusion), so the
        # summaries are compared op for op, unfused; fused, the inlined program is no slower
        unfused = RooflineCostModel(cl, fuse=False)
        a, b = simulate(m, cl, cost_model=unfused), simulate(flat, cl, cost_model=unfused)
        assert simulate(flat, cl).step_time_s <= simulate(m, cl).step_time_s * (1 + 1e-12)
        assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-12)
        assert a.busy_s == pytest.approx(b.busy_s) and a.comm_s == pytest.approx(b.comm_s)
        assert a.peak_memory == b.peak_memory
        assert a.n_ops == b.n_ops == sum(len(f.body) for f in flat.functions)


def test_recomputation_lowers_peak_memory_and_costs_time() -> None:
    seq = distir.check(parse_module(example_text("mlp_sequential.distir")))
    ckpt = distir.check(parse_module(example_text("fig8_checkpointing.distir")))
    cl = parse_cluster("dgx2-v100")
    a, b = simulate(seq, cl), simulate(ckpt, cl)
    assert b.step_time_s > a.step_time_s
    assert b.flops > a.flops


def test_streams_on_one_gpu_share_memory_and_send_for_free() -> None:
    text = """func @s(%x: Tensor[f32, (1024,), d0]) {
  %y = Send(%x, dst=d1)
  %z = Relu(%y)
  return %z
}
"""
    m = distir.check(parse_module(text))
    cl = tiny_cluster()
    dm = DeviceMap.parse(
        "d0=0,d1=0:comm",
        {d for d in (m.entry.params[0].type.device,)}
        | {  # type: ignore[union-attr]
            m.entry.params[0].type.device.__class__(1)
        },
        cl.num_devices,
    )  # type: ignore[union-attr]
    r = simulate(m, cl, dm, trace=True)
    assert r.slots == (Slot(0), Slot(0, "comm"))
    send = [s for s in r.slices or [] if s[0] == "Send"]
    assert send and all(e - s == 0.0 for _, s, e, _, _ in send)
    assert r.peak_memory == {0: 3 * 4096.0}  # one GPU holds x, y and z
    with pytest.raises(DeviceMapError, match="both mapped"):
        DeviceMap.parse("d0=0,d1=0", set(), cl.num_devices)
    with pytest.raises(DeviceMapError, match="has 2 GPUs"):
        DeviceMap.default({m.entry.params[0].type.device.__class__(i) for i in range(3)}, 2)  # type: ignore[union-attr]


def test_trace_file_is_chrome_trace_json(tmp_path: Path) -> None:
    r = sim(PIPE, trace=True)
    out = tmp_path / "t.json"
    write_trace(r, out)
    doc = json.loads(out.read_text())
    ev = doc["traceEvents"]
    xs = [e for e in ev if e["ph"] == "X"]
    assert len(xs) == len(r.slices or [])
    sends = [e for e in xs if e["name"] == "Send"]
    assert {e["tid"] for e in sends} == {0, 1} and all(e["cat"] == "comm" for e in sends)
    counters = [e for e in ev if e["ph"] == "C"]
    assert {e["pid"] for e in counters} == {0, 1}
    assert max(e["ts"] + e["dur"] for e in xs) == pytest.approx(5e6)
    with pytest.raises(ValueError, match="trace=True"):
        trace_events(sim(PIPE))


def test_collective_op_costs_its_model() -> None:
    from distir.sim.collectives import allreduce_time

    text = """func @ar(%a: Tensor[f32, (1024, 1024), d0], %b: Tensor[f32, (1024, 1024), d1]) {
  %x, %y = AllReduce(%a, %b)
  return %x, %y
}
"""
    cl = parse_cluster("dgx2-v100")
    r = simulate(distir.check(parse_module(text)), cl)
    assert r.step_time_s == pytest.approx(allreduce_time(cl, 4 * 1024 * 1024, [0, 1]))
    assert r.comm_s == [r.step_time_s, r.step_time_s]


def test_unmapped_device_is_an_error() -> None:
    text = PIPE
    m = distir.check(parse_module(text))
    with pytest.raises(DeviceMapError):
        simulate(m, tiny_cluster(gpus=1))
    assert print_module(m)  # the module is untouched
    assert isinstance(m.entry.body[0], Op)


def test_collective_on_comm_streams_overlaps_compute() -> None:
    """Gradient all-reduce placed on each GPU's communication stream (devices d2, d3) runs while
    the compute streams (d0, d1) keep computing; on the compute streams it would serialize."""
    overlapped = """func @step(%a: Tensor[f32, (8, 8), d0], %b: Tensor[f32, (8, 8), d1]) {
  %ga = Relu(%a)
  %gb = Relu(%b)
  %ca = Send(%ga, dst=d2)
  %cb = Send(%gb, dst=d3)
  %ra, %rb = AllReduce(%ca, %cb)
  %xa = Relu(%ga)
  %xb = Relu(%gb)
  %ya = Relu(%xa)
  %yb = Relu(%xb)
  return %ra, %rb, %ya, %yb
}
"""
    m = distir.check(parse_module(overlapped))
    cl = tiny_cluster()
    dm = DeviceMap.parse("d0=0,d1=1,d2=0:comm,d3=1:comm", _devs(0, 1, 2, 3), cl.num_devices)
    r = simulate(m, cl, dm, cost_model=UnitCost())
    # d0: Relu 0-1, free Send to its comm stream costs 0.5 in UnitCost (1-1.5), Relu 1.5-2.5, 2.5-3.5
    # comm streams: AllReduce 1.5-2.0, in parallel with the compute stream's Relus
    assert r.step_time_s == 3.5
    serial = overlapped.replace("  %ca = Send(%ga, dst=d2)\n  %cb = Send(%gb, dst=d3)\n", "").replace(
        "AllReduce(%ca, %cb)", "AllReduce(%ga, %gb)"
    )
    s = simulate(distir.check(parse_module(serial)), cl, cost_model=UnitCost())
    # d0: Relu 0-1, AllReduce 1-1.5, Relu 1.5-2.5, Relu 2.5-3.5: the all-reduce is on the critical path
    assert s.step_time_s == 3.5
    heavy = UnitCostHeavyComm()
    # overlapped: d0 Relu 0-1, free Send, AllReduce on the comm streams 1-3 while d0 runs 1-2, 2-3
    assert simulate(m, cl, dm, cost_model=heavy).step_time_s == 3.0
    # serial: Relu 0-1, AllReduce 1-3, Relu 3-4, Relu 4-5
    assert simulate(distir.check(parse_module(serial)), cl, cost_model=heavy).step_time_s == 5.0


def UnitCostHeavyComm() -> FixedCostModel:
    """Compute 1 s per op (MatMul 2 s); a collective 2 s; Sends between streams of one GPU free."""
    return FixedCostModel(compute=1.0, comm=2.0, by_op={"MatMul": 2.0}, free_local=True)


def _devs(*ids: int) -> set:  # type: ignore[type-arg]
    from distir.ir import Device

    return {Device(i) for i in ids}
