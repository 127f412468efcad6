"""A GPU's host as a stream (``HOST_STREAM``; an offloaded optimizer's): values there are out of
the GPU's memory, ops there take the host's roofline on the GPU's share of the node's CPUs, a
transfer between the GPU and its host crosses its PCIe link. Timed against closed forms from the
``HostSpec``, alike for plain and DTensor programs and for the fast and reference planners."""

from __future__ import annotations

import pytest

import distir
from distir.hardware.cluster import parse_cluster
from distir.hardware.presets import PRESETS
from distir.hardware.specs import HostError, HostSpec, LinkSpec, SpecError
from distir.ir import Device, parse_module
from distir.sim.cost import RooflineCostModel
from distir.sim.devices import DeviceMap, Slot
from distir.sim.simulate import simulate

CLUSTER = parse_cluster("ndm-a100-v4:1")
HOST = PRESETS["ndm-a100-v4"].host
N = 1024 * 1024  # f32 elements: 4 MiB


def _host() -> HostSpec:
    assert HOST is not None
    return HOST


PLAIN = f"""func @f(%x: Tensor[f32, ({N},), d0]) {{
  %y = Send(%x, dst=d1)
  %z = Relu(%y)
  %w = Send(%z, dst=d0)
  %v = Relu(%w)
  return %v
}}"""
MESH = "mesh(dp=2; d0, d1)"
HOSTS = "dp=2; d2, d3"
SPMD = f"""func @f(%x: DTensor[f32, ({2 * N},), {MESH}, [S(0)]]) {{
  %y = MeshSend(%x, mesh="{HOSTS}")
  %z = Relu(%y)
  %w = MeshSend(%z, mesh="dp=2; d0, d1")
  %v = Relu(%w)
  return %v
}}"""


def _want(gpu_relu: float) -> float:
    h = _host()
    copy = h.copy_time(4 * N)
    relu = h.compute_time(N, 8 * N, 8)  # a pass over 4 MiB in and 4 MiB out on 1/8 of the host
    return copy + relu + copy + gpu_relu


@pytest.mark.parametrize("planner", ["fast", "reference"])
def test_a_plain_program_on_the_host(planner: str) -> None:
    m = distir.check(parse_module(PLAIN))
    dmap = DeviceMap({Device(0): Slot(0), Device(1): Slot(0, "host")})
    cost = RooflineCostModel(CLUSTER, comm_interference=False)
    r = simulate(m, CLUSTER, dmap, cost, planner=planner)
    relu = simulate(
        distir.check(
            parse_module(f"func @f(%x: Tensor[f32, ({N},), d0]) {{\n  %v = Relu(%x)\n  return %v\n}}")
        ),
        CLUSTER,
        DeviceMap({Device(0): Slot(0)}),
        cost,
    ).step_time_s
    assert r.step_time_s == pytest.approx(_want(relu), rel=1e-12)
    # the GPU holds x, the result back and its Relu (never the host's y and z): three 4 MiB tensors
    assert r.peak_memory[0] - r.runtime_memory[0] == 3 * 4 * N
    assert r.host_memory == {}


@pytest.mark.parametrize("planner", ["fast", "reference"])
def test_a_dtensor_program_on_the_hosts(planner: str) -> None:
    m = distir.check(parse_module(SPMD))
    dmap = DeviceMap.parse("d0=0,d1=1,d2=0:host,d3=1:host", [Device(i) for i in range(4)], 8)
    cost = RooflineCostModel(CLUSTER, comm_interference=False)
    r = simulate(m, CLUSTER, dmap, cost, planner=planner)
    one = parse_module(
        f"func @f(%x: DTensor[f32, ({2 * N},), {MESH}, [S(0)]]) {{\n  %v = Relu(%x)\n  return %v\n}}"
    )
    relu = simulate(distir.check(one), CLUSTER, DeviceMap.parse("d0=0,d1=1", [Device(0), Device(1)], 8), cost)
    assert r.step_time_s == pytest.approx(_want(relu.step_time_s), rel=1e-12)
    assert r.peak_memory[0] - r.runtime_memory[0] == 3 * 4 * N  # x's, w's and v's pieces


def test_host_params_are_reported_not_in_the_peak() -> None:
    m = distir.check(
        parse_module(f"func @f(%x: Tensor[f32, ({N},), d1]) {{\n  %y = Relu(%x)\n  return %y\n}}")
    )
    dmap = DeviceMap({Device(0): Slot(0), Device(1): Slot(0, "host")})
    r = simulate(m, CLUSTER, dmap, RooflineCostModel(CLUSTER))
    assert r.host_memory == {0: 4 * N}
    assert r.param_memory[0] == 0 and r.peak_memory[0] == r.runtime_memory[0]


def test_a_node_without_a_host_is_refused() -> None:
    m = distir.check(parse_module(PLAIN))
    dmap = DeviceMap({Device(0): Slot(0), Device(1): Slot(0, "host")})
    cl = parse_cluster("dgx-a100:1")
    with pytest.raises(HostError, match="describes no host"):
        simulate(m, cl, dmap, RooflineCostModel(cl))


def test_host_spec_figures_are_checked() -> None:
    h = _host()
    assert h.cores == 96 and h.memory_bandwidth == pytest.approx(409.6e9)
    assert h.pcie.bandwidth == pytest.approx(31.5e9, rel=1e-3)
    with pytest.raises(SpecError, match="memory_efficiency"):
        HostSpec("h", 1, 1e12, 1e11, 1e12, LinkSpec(1e10, 1e-5), memory_efficiency=1.5)
    with pytest.raises(SpecError, match="cores"):
        HostSpec("h", 0, 1e12, 1e11, 1e12, LinkSpec(1e10, 1e-5))
