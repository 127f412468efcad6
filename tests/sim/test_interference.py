"""Compute slowed by the collectives beside it (``distir.sim.interference``): hand timelines
against the rate model, no charge where nothing overlaps, the switch, and the planners agreeing."""

from __future__ import annotations

from dataclasses import replace

import pytest

import distir
from distir.autodiff.train import Optimizer
from distir.frontends.zoo.registry import build_model
from distir.hardware.cluster import Cluster, parse_cluster
from distir.hardware.specs import GemmProfile, SpecError
from distir.ir import parse_module
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.cost import FixedCostModel, RooflineCostModel
from distir.sim.devices import DeviceMap
from distir.sim.simulate import simulate
from sim.test_simulate import _devs, tiny_cluster  # tests/ is on sys.path

# d0/d1: the compute streams of GPUs 0 and 1; d2/d3: their communication streams. A Relu, its
# result handed to the communication stream (free: one GPU), an all-reduce there beside ``n``
# more Relus on the compute stream; with ``wait``, the compute then takes the reduced value.
HEAD = """func @step(%a: Tensor[f32, (8, 8), d0], %b: Tensor[f32, (8, 8), d1]) {
  %ga = Relu(%a)
  %gb = Relu(%b)
  %ca = Send(%ga, dst=d2)
  %cb = Send(%gb, dst=d3)
  %ra, %rb = AllReduce(%ca, %cb)
"""
DMAP = "d0=0,d1=1,d2=0:comm,d3=1:comm"


def program(n: int, wait: bool) -> str:
    body = HEAD
    xa, xb = "%ga", "%gb"
    for i in range(n):
        body += f"  %xa{i} = Relu({xa})\n  %xb{i} = Relu({xb})\n"
        xa, xb = f"%xa{i}", f"%xb{i}"
    if wait:
        body += "  %wa = Send(%ra, dst=d0)\n  %wb = Send(%rb, dst=d1)\n"
        body += f"  %za = Add(%wa, {xa})\n  %zb = Add(%wb, {xb})\n"
        return body + "  return %za, %zb\n}\n"
    return body + f"  return %ra, %rb, {xa}, {xb}\n}}\n"


def run(text: str, cost: FixedCostModel, dmap: str | None = DMAP) -> float:
    m = distir.check(parse_module(text))
    cl = tiny_cluster()
    dm = DeviceMap.parse(dmap, _devs(0, 1, 2, 3), cl.num_devices) if dmap else None
    return simulate(m, cl, dm, cost_model=cost).step_time_s


def compute_end(g: float, c: float, s: float) -> float:
    """By the rate model: when ``g`` seconds of compute work that start with a collective of
    ``c`` seconds (at 1 s) end, running at ``1 - s`` of full speed while the collective runs."""
    if g <= (1 - s) * c:
        return 1.0 + g / (1 - s)
    return 1.0 + c + (g - (1 - s) * c)


@pytest.mark.parametrize("s", [0.0, 0.25, 0.5])
@pytest.mark.parametrize(("n", "c"), [(2, 2.0), (1, 4.0), (3, 1.0), (0, 2.0)])
@pytest.mark.parametrize("wait", [False, True])
def test_compute_beside_a_collective_runs_at_the_rate_left_to_it(
    s: float, n: int, c: float, wait: bool
) -> None:
    """A Relu (1 s), then ``n`` Relus (1 s each) beside an all-reduce of ``c`` seconds on the
    communication streams: the step is the rate model's, whether the compute outlasts the
    collective, finishes first (and then, with ``wait``, waits for it to add its result: 1 s)
    or has nothing to do beside it (n = 0)."""
    cost = FixedCostModel(compute=1.0, comm=c, free_local=True, slowdown=s)
    want = max(compute_end(float(n), c, s), 1.0 + c) + (1.0 if wait else 0.0)
    assert run(program(n, wait), cost) == pytest.approx(want, abs=1e-12)


def test_zero_slowdown_is_the_timeline_without_interference() -> None:
    for n, wait in [(2, False), (1, True)]:
        text = program(n, wait)
        plain = FixedCostModel(compute=1.0, comm=2.0, free_local=True)
        assert run(text, replace(plain, slowdown=0.0)) == run(text, plain)


def test_a_collective_on_the_compute_stream_charges_nothing() -> None:
    """The same all-reduce on the compute streams themselves: one kernel at a time, no stall."""
    serial = program(2, False).replace("  %ca = Send(%ga, dst=d2)\n  %cb = Send(%gb, dst=d3)\n", "")
    serial = serial.replace("AllReduce(%ca, %cb)", "AllReduce(%ga, %gb)")
    for s in (0.0, 0.5):
        cost = FixedCostModel(compute=1.0, comm=2.0, free_local=True, slowdown=s)
        assert run(serial, cost, dmap=None) == 5.0  # Relu 0-1, all-reduce 1-3, Relus 3-4, 4-5


def test_point_to_point_transfers_charge_nothing() -> None:
    """A Send between the communication streams of two GPUs beside the compute: no stall (NCCL
    runs a transfer on a couple of channels)."""
    text = """func @step(%a: Tensor[f32, (8, 8), d0]) {
  %g = Relu(%a)
  %c = Send(%g, dst=d2)
  %d = Send(%c, dst=d3)
  %x = Relu(%g)
  %y = Relu(%x)
  return %d, %y
}
"""
    for s in (0.0, 0.5):
        cost = FixedCostModel(compute=1.0, comm=2.0, free_local=True, slowdown=s)
        assert run(text, cost) == 3.0


def test_the_stall_is_busy_time_of_the_compute_stream() -> None:
    m = distir.check(parse_module(program(2, False)))
    cl = tiny_cluster()
    dm = DeviceMap.parse(DMAP, _devs(0, 1, 2, 3), cl.num_devices)
    r = simulate(m, cl, dm, cost_model=FixedCostModel(compute=1.0, comm=2.0, free_local=True, slowdown=0.25))
    assert r.busy_s[0] == pytest.approx(3.0 + 0.25 * 2.0)  # three Relus and a quarter of the all-reduce
    assert r.comm_s[1] == pytest.approx(2.0)  # the comm stream of GPU 0 (slots: gpu0, gpu0:comm, ...)


# -- the GPU figure --------------------------------------------------------------------------------
def test_presets_take_nccls_sms_from_the_compute() -> None:
    for name, sms, comm in [("h100", 132, 24), ("dgx-a100", 108, 24)]:
        g = parse_cluster(name).device_spec(0).gemm
        assert g is not None and (g.sms, g.comm_sms) == (sms, comm) and g.comm_source
        assert g.comm_share == comm / sms
        assert RooflineCostModel(parse_cluster(name)).interference(0) == comm / sms
        assert RooflineCostModel(parse_cluster(name), comm_interference=False).interference(0) == 0.0
    assert parse_cluster("local").device_spec(0).gemm is None  # CPU: no figure


def test_comm_sms_must_leave_sms_to_the_compute() -> None:
    g = parse_cluster("h100").device_spec(0).gemm
    assert g is not None
    for bad in (-1, 132, 1.5, True):
        with pytest.raises(SpecError, match="comm_sms"):
            replace(g, comm_sms=bad)
    assert replace(g, comm_sms=0).comm_share == 0.0
    assert GemmProfile(10, 0.5, (1, 1, 1), "x").comm_sms == 0  # the default: none


# -- a zoo FSDP program ------------------------------------------------------------------------------
def _without_comm_sms(cl: Cluster) -> Cluster:
    nodes = tuple(
        replace(n, device=replace(n.device, gemm=replace(n.device.gemm, comm_sms=0))) if n.device.gemm else n
        for n in cl.nodes
    )
    return replace(cl, nodes=nodes)


def _fsdp() -> tuple[distir.Module, Cluster, DeviceMap]:
    s = parse_strategy("d4.t1.p1.k1.z3")
    mod = build_model("gpt:layers=2,hidden=256,heads=4,seq=64,vocab=512", batch=8)
    prog = distribute(mod, s, Optimizer("adam"), comm_streams=True)
    return prog, parse_cluster("dgx-a100"), device_map(s, True)


def test_fsdp_compute_is_charged_its_share_of_the_collectives_beside_it() -> None:
    prog, cl, dm = _fsdp()
    on = simulate(prog, cl, dm, trace=True, trace_detail="op")
    off = simulate(prog, cl, dm, RooflineCostModel(cl, comm_interference=False))
    zero = simulate(prog, _without_comm_sms(cl), dm)
    assert (off.step_time_s, off.busy_s) == (zero.step_time_s, zero.busy_s)  # two ways to turn it off
    assert on.step_time_s > off.step_time_s
    # GPU 0's compute stream is busy for its kernels and 24/108 of the collectives on its other
    # streams (every collective there: the gathers and reduce-scatters, not the MeshSends)
    collectives = sum(
        x.end - x.start
        for x in on.trace_detail().slices
        if "op" in x.args  # a leaf: an op
        and x.comm
        and on.slots[x.slot].gpu == 0
        and on.slots[x.slot].stream != "compute"
        and x.args["op"] != "MeshSend"
    )
    assert collectives > 0
    assert on.busy_s[0] - off.busy_s[0] == pytest.approx(24 / 108 * collectives, rel=1e-9)


def test_the_reference_planner_gives_the_stalled_figures() -> None:
    prog, cl, dm = _fsdp()
    fast = simulate(prog, cl, dm)
    ref = simulate(prog, cl, dm, planner="reference")
    assert (fast.step_time_s, fast.busy_s, fast.comm_s) == (ref.step_time_s, ref.busy_s, ref.comm_s)
    assert (
        fast.step_time_s > simulate(prog, cl, dm, RooflineCostModel(cl, comm_interference=False)).step_time_s
    )
