"""Synchronous kernel launches (``CUDA_LAUNCH_BLOCKING=1``): ``DeviceMap.blocking`` runs a GPU's
streams one kernel at a time in program order, ``RooflineCostModel.host_s`` charges the host's
time per launched kernel in series; both off, the figures are unchanged."""

from __future__ import annotations

from dataclasses import replace

import pytest

import distir
from distir.autodiff.train import Optimizer
from distir.frontends.zoo.registry import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir import parse_module
from distir.ir.values import Device
from distir.ops.registry import CommCost, CommPattern
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.cost import EAGER_HOST_S, FixedCostModel, RooflineCostModel, charged
from distir.sim.devices import DeviceMap, Slot
from distir.sim.simulate import simulate
from sim.test_figures_unchanged import figures
from sim.test_interference import DMAP, program  # tests/ is on sys.path
from sim.test_simulate import _devs, tiny_cluster

GPT = "gpt:layers=4,hidden=64,heads=4,seq=16,vocab=128"


def _run(n: int, wait: bool, cost: object, blocking: bool) -> float:
    m = distir.check(parse_module(program(n, wait)))
    cl = tiny_cluster()
    dm = DeviceMap.parse(DMAP, _devs(0, 1, 2, 3), cl.num_devices)
    return simulate(m, cl, dm.blocking() if blocking else dm, cost_model=cost).step_time_s  # type: ignore[arg-type]


def test_blocking_puts_every_device_on_its_gpus_compute_stream() -> None:
    dm = DeviceMap.parse(DMAP, _devs(0, 1, 2, 3), 2)
    want = {Device(0): Slot(0), Device(1): Slot(1), Device(2): Slot(0), Device(3): Slot(1)}
    assert dm.blocking().mapping == want
    assert dm.blocking().slots == (Slot(0), Slot(1))
    compute_only = DeviceMap({Device(0): Slot(0), Device(1): Slot(1)})
    assert compute_only.blocking() == compute_only


@pytest.mark.parametrize(("n", "c"), [(2, 2.0), (1, 4.0), (3, 1.0)])
@pytest.mark.parametrize("wait", [False, True])
def test_compute_and_a_collective_on_two_streams_run_in_series(n: int, c: float, wait: bool) -> None:
    """A Relu (1 s), an all-reduce of ``c`` seconds on the communication streams beside ``n``
    Relus: overlapped by default, their sum with synchronous launches."""
    cost = FixedCostModel(compute=1.0, comm=c, free_local=True)
    tail = 1.0 if wait else 0.0
    assert _run(n, wait, cost, False) == pytest.approx(1.0 + max(float(n), c) + tail, abs=1e-12)
    assert _run(n, wait, cost, True) == pytest.approx(1.0 + n + c + tail, abs=1e-12)


@pytest.mark.parametrize("wait", [False, True])
def test_host_time_adds_once_per_kernel_in_series(wait: bool) -> None:
    """With the streams serialised, each kernel (the Relus, the all-reduce, the Add) adds
    ``host_s``; the hand-overs between a GPU's streams launch none (unfused: a Relu joining the
    kernel before it would launch none either)."""
    n, h = 3, 7e-6
    base = RooflineCostModel(tiny_cluster(), fuse=False)
    kernels = 1 + n + 1 + (1 if wait else 0)
    serial = _run(n, wait, base, True)
    assert _run(n, wait, replace(base, host_s=h), True) == pytest.approx(serial + kernels * h, rel=1e-12)


def test_default_is_unchanged() -> None:
    base = RooflineCostModel(tiny_cluster())
    assert base.host_s == 0.0
    assert _run(2, True, base, False) == _run(2, True, replace(base, host_s=0.0), False)


def test_a_coalesced_part_and_a_local_hand_over_pay_no_host_time() -> None:
    cl = tiny_cluster()
    base, host = RooflineCostModel(cl), RooflineCostModel(cl, host_s=EAGER_HOST_S)
    part = CommCost(CommPattern.ALLREDUCE, 2**20, (Device(0), Device(1)), coalesced=True)
    assert charged(host, part, [0, 1]) == pytest.approx(charged(base, part, [0, 1]), abs=1e-15)
    call = replace(part, coalesced=False)
    assert charged(host, call, [0, 1]) == pytest.approx(charged(base, call, [0, 1]) + EAGER_HOST_S, abs=1e-15)
    local = CommCost(CommPattern.P2P, 2**20, (Device(0), Device(2)))
    assert host.comm_time(local, [0, 0]) == base.comm_time(local, [0, 0]) == 0.0


@pytest.mark.parametrize("strategy", ["d2.t2.p2.k4.1f1b", "d4.z1", "d2.t2.sp.p2.k2.z1.1f1b.rsel"])
def test_the_reference_gives_the_fast_planners_figures_with_every_stream_on_one(strategy: str) -> None:
    """Several program devices on one slot (the compute, send and reduction streams' devices of
    each GPU): both planners agree, and the step is longer than with the streams apart and no host time."""
    s = parse_strategy(strategy)
    prog = distribute(build_model(GPT, 8), s, Optimizer("adam"), comm_streams=True)
    cl = parse_cluster("p3.8xlarge:2")
    dmap = device_map(s, True)
    cost = RooflineCostModel(cl, host_s=EAGER_HOST_S)
    ref = figures(simulate(prog, cl, dmap.blocking(), cost, batch=8, planner="reference"))
    assert ref == figures(simulate(prog, cl, dmap.blocking(), cost, batch=8))
    apart = simulate(prog, cl, dmap, RooflineCostModel(cl), batch=8).step_time_s
    assert float(ref["step_time_s"]) > apart
