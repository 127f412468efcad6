"""distribute(..., offload_optimizer=True): DeepSpeed's ZeRO-Offload. The fp32 masters, Adam's
moments and the step live on each GPU's host (program devices on the ``host`` stream); each
reduced gradient partition is copied there, the step runs on the host's CPUs, and the new master
partition is copied back and cast. The step computes the numbers of the step without offload; the
simulated GPU peak falls by the 12 bytes of master, m and v per partition parameter, which the
result reports as host memory; the host's ops take the host's roofline and PCIe times."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from distir.autodiff.precision import PrecisionError
from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.hardware.presets import PRESETS
from distir.hardware.specs import HostError
from distir.ir.dtensor import DTensorType
from distir.ir.types import DType
from distir.parallel.check import initial_values, run_distributed
from distir.parallel.distribute import STREAMS, device_map, distribute
from distir.parallel.sharding.materialize import local_shape
from distir.parallel.strategy import StrategyError, parse_strategy
from distir.parallel.zero3_fetch import Zero3Fetch
from distir.sim.cost import RooflineCostModel
from distir.sim.simulate import simulate

GPT = "gpt:layers=2,hidden=8,heads=2,seq=4,vocab=16"


def _run(strategy: str, offload: bool, **kw: Any) -> tuple[Any, list[Any]]:
    s = parse_strategy(strategy)
    model = build_model(GPT, batch=s.k * s.d, dtype=DType.f16)
    opt = Optimizer("adam", lr=0.01, max_norm=1.0)
    vals = initial_values(model, opt, 0, "mixed")
    prog = distribute(model, s, opt, precision="mixed", offload_optimizer=offload, **kw)
    return model, run_distributed(prog, model, s, vals)[1]


@pytest.mark.parametrize(
    ("strategy", "kw"),
    [
        ("d2.t1.p1.k1.z3", {}),
        ("d2.t1.p1.k2.1f1b.z3", {"comm_streams": True}),
        ("d2.t1.p1.k2.1f1b.z1", {}),
        ("d2.t1.p1.k2.1f1b.z2", {"comm_streams": True}),
        ("d2.t2.p2.k4.1f1b.z1", {"comm_streams": True}),
        ("d2.t1.p1.k1.z3", {"comm_streams": True, "zero3_fetch": Zero3Fetch(), "one_dp_stream": True}),
        ("d2.t1.p1.k2.1f1b.z3", {"comm_streams": True, "zero3_fetch": Zero3Fetch()}),
    ],
)
def test_the_offloaded_step_equals_the_step_on_the_gpus(strategy: str, kw: dict[str, bool]) -> None:
    _, want = _run(strategy, False, **kw)
    _, got = _run(strategy, True, **kw)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):  # loss, masters, m, v, the new compute copies
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_the_state_is_on_the_hosts_and_adam_runs_there() -> None:
    s = parse_strategy("d2.t1.p1.k1.z3")
    model = build_model(GPT, batch=2, dtype=DType.f16)
    prog = distribute(model, s, Optimizer("adam"), precision="mixed", offload_optimizer=True)
    host = {d for d, slot in device_map(s, True, host=True).mapping.items() if slot.stream == "host"}
    assert host == {d for d in device_map(s, False, host=True).mapping if d.id >= (len(STREAMS) + 1) * 2}
    names = {w.name for w in model.weights}
    for p in prog.entry.params:
        t = p.type
        assert isinstance(t, DTensorType)
        on_host = set(t.mesh.devices) <= host
        if p.name in names or p.name.startswith(("m_", "v_", "step_")):
            assert on_host, p.name
        else:  # the compute copies and the inputs
            assert not set(t.mesh.devices) & host, p.name
    masters = {p for p in prog.entry.params if p.name in names}
    adams = [op for op in prog.entry.ops() if op.name == "Adam"]
    assert len(adams) == len(names) and all(op.inputs[0] in masters for op in adams)  # on the host's masters


def _sim(spec: str, strategy: str, offload: bool) -> Any:
    s = parse_strategy(strategy)
    cl = parse_cluster("ndm-a100-v4")
    model = build_model(spec, batch=s.k * s.d, dtype=DType.f16)
    prog = distribute(
        model, s, Optimizer("adam"), precision="mixed", comm_streams=True, offload_optimizer=offload
    )
    return prog, simulate(prog, cl, device_map(s, True, host=offload), RooflineCostModel(cl))


@pytest.mark.parametrize("strategy", ["d4.t1.p1.k1.z3", "d4.t1.p1.k2.1f1b.z1", "d2.t2.p2.k4.1f1b.z2"])
def test_the_gpu_peak_falls_by_twelve_bytes_per_partition_parameter(strategy: str) -> None:
    spec = "gpt:layers=4,hidden=512,heads=8,seq=128,vocab=512"
    _, before = _sim(spec, strategy, False)
    prog, after = _sim(spec, strategy, True)
    part: dict[int, int] = {}  # the master elements each GPU's host holds
    for p in prog.entry.params:
        t = p.type
        if isinstance(t, DTensorType) and t.dtype is DType.f32:
            for d in t.mesh.devices:
                g = d.id % parse_strategy(strategy).devices
                part[g] = part.get(g, 0) + int(np.prod(local_shape(t, d)))
    for g in before.param_memory:
        masters = part[g] // 3  # master, m, v alike
        assert before.param_memory[g] - after.param_memory[g] == pytest.approx(12 * masters + 8)  # + the step
        assert after.host_memory[g] == pytest.approx(12 * masters + 8)
        saved = (before.peak_memory[g] - before.runtime_memory[g]) - (
            after.peak_memory[g] - after.runtime_memory[g]
        )
        assert saved >= 12 * masters * 0.98, (g, saved, masters)


def test_the_host_ops_take_the_hosts_roofline_and_pcie_times() -> None:
    host = PRESETS["ndm-a100-v4"].host
    assert host is not None
    spec = "gpt:layers=2,hidden=1024,heads=8,seq=128,vocab=512"
    _, r = _sim_traced(spec, "d8.t1.p1.k1.z3")
    assert r.slices is not None
    n = 1024 * 1024 // 8  # a 1024 x 1024 weight's partition over 8 ranks
    adam = [x for x in r.slices if x[0] == "Adam"]
    # Adam reads w, g, m, v (and the 8-byte step) and writes w, m, v: 28 bytes an element, at
    # the host's memory bandwidth shared by its 8 GPUs' ranks
    want = (28 * n + 8) * 8 / (host.memory_bandwidth * host.memory_efficiency)
    assert any(x[2] - x[1] == pytest.approx(want, rel=1e-9) for x in adam)
    copies = [x[2] - x[1] for x in r.slices if x[0] == "MeshSend"]
    d2h = host.pcie.latency_s + 2 * n / (host.pcie.bandwidth * host.pcie_efficiency)  # the fp16 gradient
    h2d = host.pcie.latency_s + 4 * n / (host.pcie.bandwidth * host.pcie_efficiency)  # the fp32 master
    assert any(t == pytest.approx(d2h, rel=1e-9) for t in copies)
    assert any(t == pytest.approx(h2d, rel=1e-9) for t in copies)


def _sim_traced(spec: str, strategy: str) -> Any:
    s = parse_strategy(strategy)
    cl = parse_cluster("ndm-a100-v4")
    model = build_model(spec, batch=s.k * s.d, dtype=DType.f16)
    prog = distribute(
        model, s, Optimizer("adam"), precision="mixed", comm_streams=True, offload_optimizer=True
    )
    return prog, simulate(prog, cl, device_map(s, True, host=True), RooflineCostModel(cl), trace=True)


def test_a_cluster_without_a_host_is_refused() -> None:
    s = parse_strategy("d2.t1.p1.k1.z3")
    cl = parse_cluster("dgx-a100")
    model = build_model(GPT, batch=2, dtype=DType.f16)
    prog = distribute(model, s, Optimizer("adam"), precision="mixed", offload_optimizer=True)
    with pytest.raises(HostError, match="describes no host"):
        simulate(prog, cl, device_map(s, True, host=True), RooflineCostModel(cl))


@pytest.mark.parametrize(
    ("strategy", "precision", "opt", "err", "match"),
    [
        ("d2.t1.p1.k1", "mixed", "adam", StrategyError, "ZeRO 1-3"),
        ("d2.t1.p1.k1.z3", "pure", "adam", PrecisionError, "fp32 master"),
        ("d2.t1.p1.k1.z3", "mixed", "sgd", StrategyError, "CPU Adam"),
        ("d4.t1.p1.k1.z3h2", "mixed", "adam", StrategyError, "HSDP"),
    ],
)
def test_refused_outside_a_zero_mixed_adam_step(
    strategy: str, precision: str, opt: str, err: type, match: str
) -> None:
    s = parse_strategy(strategy)
    model = build_model(GPT, batch=s.d, dtype=DType.f16)
    with pytest.raises(err, match=match):
        distribute(model, s, Optimizer(opt), precision=precision, offload_optimizer=True)


def test_refused_for_inference() -> None:
    s = parse_strategy("d2.t1.p1.k1.z3")
    model = build_model(GPT, batch=2, dtype=DType.f16)
    with pytest.raises(StrategyError, match="inference"):
        distribute(model, s, Optimizer("adam"), train=False, precision="mixed", offload_optimizer=True)


def test_under_deepspeeds_fetch_each_bucket_goes_to_the_host_in_the_backward() -> None:
    """With DeepSpeed's ZeRO-3 fetch and one microbatch, each reduced partition is copied to the
    host as its bucket is reduced (``__partition_grads``): the copies are in the backward, after a
    hand-back that makes the compute stream wait for the reduction; none is left for the step."""
    s = parse_strategy("d2.t1.p1.k1.z3")
    model = build_model(GPT, batch=2, dtype=DType.f16)
    prog = distribute(
        model,
        s,
        Optimizer("adam"),
        precision="mixed",
        comm_streams=True,
        zero3_fetch=Zero3Fetch(),
        offload_optimizer=True,
    )
    to_host = {
        name: [op for op in fn.ops() if op.name == "MeshSend" and op.outputs[0].name.endswith("_host")]
        for name, fn in ((f.name, f) for f in prog.functions)
    }
    at_step = {
        op.inputs[0].name.removeprefix("g_") for op in to_host["step"] if op.outputs[0].name.startswith("g_")
    }
    in_bwd = {op.inputs[0].name.removeprefix("g_") for n, ops in to_host.items() if n != "step" for op in ops}
    assert in_bwd and not in_bwd & at_step
    assert in_bwd | at_step == {w.name for w in model.weights}  # each gradient copied once
    assert all(len(w.type.shape) == 1 for w in model.weights if w.name in at_step)  # biases and norms
