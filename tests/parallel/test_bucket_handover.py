"""Gradient buckets handed to the reduction stream one way (``distir.parallel.grad_reduction``):
on a data-parallel step whose bucket reductions queue on the ``dp_reduce`` stream, the backward's
compute runs back to back — never waiting for the reductions queued before its hand-overs — and
the step still ends after the last reduction, which the optimizer waits for."""

from __future__ import annotations

from itertools import pairwise

import pytest

from distir.autodiff.train import Optimizer
from distir.frontends.zoo.registry import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir import parse_module
from distir.ir.function import Module
from distir.ir.ops import Op
from distir.ir.printer import print_module
from distir.parallel.distribute import device_map, distribute
from distir.parallel.grad_reduction import handover_waits_one_way
from distir.parallel.strategy import Strategy, parse_strategy
from distir.sim.cost import RooflineCostModel
from distir.sim.devices import Slot
from distir.sim.simulate import SimResult, simulate
from distir.sim.tracedetail import DetailSlice

# large gradients for little compute, over two nodes' 50 Gb/s: the buckets' all-reduces queue
MODEL = "gpt:layers=4,hidden=512,heads=4,seq=32,vocab=256"
STRATEGY = "d8.t1.p1.k1"
CLUSTER = parse_cluster("g4dn.12xlarge:2")
BATCH = 8


def _program(**kw: object) -> tuple[Strategy, Module]:
    s = parse_strategy(STRATEGY)
    opt = Optimizer("sgd")
    return s, distribute(build_model(MODEL, BATCH), s, opt, comm_streams=True, bucket_mb=1.0, **kw)  # type: ignore[arg-type]


def _two_way(m: Module) -> Module:
    """The same program with every hand-over an ordinary (two-way) MeshSend."""
    return parse_module(print_module(m).replace(", event=true", ""))


def _simulate(s: Strategy, m: Module) -> SimResult:
    # no compute slowed beside a collective (``distir.sim.interference``): the compute stream's
    # clock moves by its own ops' costs and by its waits only
    cost = RooflineCostModel(CLUSTER, comm_interference=False)
    return simulate(m, CLUSTER, device_map(s, True), cost, batch=BATCH, trace=True, trace_detail="op")


def _ops(r: SimResult, stream: str) -> list[DetailSlice]:
    """GPU 0's ops on ``stream`` that take time, by start."""
    j = r.slots.index(Slot(0, stream))
    detail = r.trace_detail()
    return sorted(
        (x for x in detail.slices if x.slot == j and "op" in x.args and x.end > x.start),
        key=lambda x: x.start,
    )


def _backward(compute: list[DetailSlice]) -> list[DetailSlice]:
    """The compute stream's ops before the optimizer's first (which reads a reduced gradient)."""
    first = next(i for i, x in enumerate(compute) if x.name == "SGD")
    return compute[:first]


def _gaps(ops: list[DetailSlice]) -> list[float]:
    return [b.start - a.end for a, b in pairwise(ops)]


def test_the_backward_never_waits_for_queued_reductions() -> None:
    s, m = _program()
    r = _simulate(s, m)
    compute, reductions = _ops(r, "compute"), _ops(r, "dp_reduce")
    backward = _backward(compute)
    assert len(reductions) > 8  # several buckets, each a coalesced call
    # the reductions queue: some still waits to start when the backward's last op is done
    assert reductions[-1].start > backward[-1].end
    # the compute ran back to back from its first op to the optimizer: it waited for nothing
    assert backward[0].start == 0.0
    assert max(_gaps(backward)) == pytest.approx(0.0, abs=1e-12)


def test_the_step_ends_after_the_last_reduction() -> None:
    s, m = _program()
    r = _simulate(s, m)
    compute, reductions = _ops(r, "compute"), _ops(r, "dp_reduce")
    optimizer = compute[len(_backward(compute)) :]
    assert optimizer[0].start >= reductions[-1].end  # the last bucket's gradient is reduced first
    assert r.step_time_s >= reductions[-1].end
    assert r.step_time_s == pytest.approx(optimizer[-1].end, rel=1e-12)


def test_a_two_way_hand_over_stalls_the_backward() -> None:
    """The contrast (the former form, still FSDP2's): each hand-over waits for the reductions
    queued before it, so the compute idles inside the backward; the step is no shorter."""
    s, m = _program()
    one_way, two_way = _simulate(s, m), _simulate(s, _two_way(m))
    assert max(_gaps(_backward(_ops(two_way, "compute")))) > 1e-4
    assert two_way.step_time_s >= one_way.step_time_s


@pytest.mark.parametrize(("copy_in", "one_way"), [("", True), ("copy", True), ("cast", False)])
def test_which_trainers_hand_buckets_over_one_way(copy_in: str, one_way: bool) -> None:
    """DDP / Megatron-LM / FSDP1 hand over one way; FSDP2 waits for the previous reduce-scatter."""
    assert handover_waits_one_way(copy_in) is one_way
    s = parse_strategy("d2.t1.p1.k1.z3")
    m = distribute(build_model(MODEL, 4), s, Optimizer("adam"), comm_streams=True, grad_copy_in=copy_in)
    sends = [i for f in m.functions for i in f.body if type(i) is Op and i.name == "MeshSend"]
    events = [i for i in sends if i.attrs.get("event")]
    assert sends
    assert bool(events) is one_way
