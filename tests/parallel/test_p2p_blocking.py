"""distribute(..., p2p_blocking=True): Megatron-LM's pipeline transfers as its schedules wait on
them (``overlap_p2p_comm`` off: always under 1F1B). The transfers run between the stages'
compute streams, none on the send and receive streams; the step computes what it computes with
them on streams, and takes at least as long."""

from __future__ import annotations

import pytest

from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir.types import DType
from distir.parallel.distribute import STREAMS, device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.cost import RooflineCostModel
from distir.sim.simulate import simulate

from .helpers import assert_mixed_step_matches

GPT = "gpt:layers=4,hidden=8,heads=2,seq=4,vocab=16"


def _p2p_stream_sends(prog: object, n: int) -> int:
    """The MeshSends that touch a pipeline send or receive stream (``STREAMS``: program devices
    (k + 1)·n … (k + 2)·n − 1 for stream k of the n compute devices)."""
    p2p = {
        (k + 1) * n + d
        for k, name in enumerate(STREAMS)
        if "send" in name or "recv" in name
        for d in range(n)
    }
    hits = 0
    for op in prog.entry.ops():  # type: ignore[attr-defined]
        if op.name == "MeshSend":
            text = str(op.attrs["mesh"])  # "dp=2, tp=1; d0, d1"
            ids = {int(d.strip().removeprefix("d")) for d in text.split(";")[1].split(",")}
            hits += bool(ids & p2p)
    return hits


@pytest.mark.parametrize("strategy", ["d1.t1.p2.k4.1f1b", "d2.t1.p2.k4.interleaved.v2.z1"])
def test_transfers_run_between_the_compute_streams(strategy: str) -> None:
    s = parse_strategy(strategy)
    model = build_model(GPT, batch=s.k * s.d, dtype=DType.bf16)
    n = s.devices
    got = {}
    for blocking in (False, True):
        prog = distribute(
            model, s, Optimizer("adam"), precision="mixed", comm_streams=True, p2p_blocking=blocking
        )
        got[blocking] = _p2p_stream_sends(prog, n)
    assert got[False] > 0 and got[True] == 0


@pytest.mark.parametrize("strategy", ["d1.t1.p2.k4.1f1b", "d2.t1.p2.k4.1f1b.z1"])
def test_the_step_equals_the_sequential_step(strategy: str) -> None:
    assert_mixed_step_matches(GPT, strategy, comm_streams=True, p2p_blocking=True)


def test_without_a_pipeline_nothing_changes() -> None:
    s = parse_strategy("d2.t1.p1.k2.1f1b.z1")
    model = build_model(GPT, batch=4, dtype=DType.bf16)
    a, b = (
        distribute(model, s, Optimizer("adam"), precision="mixed", comm_streams=True, p2p_blocking=x)
        for x in (False, True)
    )
    assert str(a) == str(b)


def test_blocking_transfers_take_at_least_as_long() -> None:
    s = parse_strategy("d1.t1.p4.k8.1f1b")
    cl = parse_cluster("dgx-a100")
    model = build_model("gpt:layers=8,hidden=1024,heads=8,seq=1024,vocab=1024", batch=8, dtype=DType.bf16)
    times = {}
    for blocking in (False, True):
        prog = distribute(model, s, Optimizer("adam"), comm_streams=True, p2p_blocking=blocking)
        times[blocking] = simulate(prog, cl, device_map(s, True), RooflineCostModel(cl)).step_time_s
    assert times[True] > times[False]
