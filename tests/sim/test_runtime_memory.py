"""Runtime memory (CUDA context, workspaces, communication buffers, allocator reserve) in the
simulator's peak memory, its OOM decision and its JSON summary."""

from __future__ import annotations

import dataclasses

import pytest

from distir.hardware.cluster import Cluster
from distir.hardware.specs import DeviceSpec, LinkSpec, NodeSpec, RuntimeMemory, SpecError
from distir.ir import parse_module
from distir.sim.simulate import simulate
from distir.sim.summary import summary_dict

MIB = 1 << 20
PROG = """func @f(%x: Tensor[f32, (256, 1024), d0]) {
  %a = Relu(%x)
  %b = Neg(%a)
  return %b
}
"""
TENSORS = 3 * 256 * 1024 * 4.0  # x, a and b live together at the peak (b made while a is live)


def cluster(runtime: RuntimeMemory, memory_bytes: int = 1 << 30) -> Cluster:
    dev = DeviceSpec("dev", 1e12, 1e12, 1e12, 1e12, 1e11, memory_bytes, 0.0, runtime=runtime)
    return Cluster("c", (NodeSpec("n", dev, 1, LinkSpec(1e10, 1e-6), LinkSpec(1e9, 1e-5)),))


def test_no_runtime_memory_by_default() -> None:
    r = simulate(parse_module(PROG), cluster(RuntimeMemory()))
    assert r.peak_memory == {0: TENSORS} and r.runtime_memory == {0: 0.0}


def test_runtime_memory_is_counted_in_the_peak() -> None:
    rt = RuntimeMemory(
        context_bytes=300 * MIB, workspace_bytes=32 * MIB, comm_bytes=100 * MIB, fragmentation=0.1
    )
    r = simulate(parse_module(PROG), cluster(rt))
    extra = (300 + 32 + 100) * MIB + 0.1 * TENSORS
    assert r.runtime_memory == {0: pytest.approx(extra)}
    assert r.peak_memory == {0: pytest.approx(TENSORS + extra)}
    d = summary_dict(r)
    assert d["runtime_memory_bytes"] == {"d0": pytest.approx(extra)}
    assert d["peak_memory_bytes"] == {"d0": pytest.approx(TENSORS + extra)}


def test_runtime_memory_decides_oom() -> None:
    """The tensors fit in 512 MiB; with a 510 MiB context they do not."""
    small = 512 * MIB
    assert not simulate(parse_module(PROG), cluster(RuntimeMemory(), small)).oom_gpus
    r = simulate(parse_module(PROG), cluster(RuntimeMemory(context_bytes=510 * MIB), small))
    assert r.oom_gpus == [0] and summary_dict(r)["oom"]


def test_tensor_capacity_inverts_the_overhead() -> None:
    rt = RuntimeMemory(context_bytes=1 << 30, fragmentation=0.05)
    cap = 80.0 * (1 << 30)
    fits = rt.tensor_capacity(cap)
    assert fits + rt.overhead(fits) == pytest.approx(cap)
    dev = cluster(rt, 80 << 30).nodes[0].device
    assert dev.tensor_capacity == pytest.approx(fits)


@pytest.mark.parametrize(
    ("kw", "what"),
    [
        ({"context_bytes": -1}, "context_bytes"),
        ({"comm_bytes": 1.5}, "comm_bytes"),
        ({"fragmentation": 1.0}, "fragmentation"),
    ],
)
def test_bad_runtime_memory_is_a_spec_error(kw: dict[str, object], what: str) -> None:
    with pytest.raises(SpecError, match=what):
        dataclasses.replace(RuntimeMemory(), **kw)  # type: ignore[arg-type]
