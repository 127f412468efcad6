"""Pipeline transfers on communication streams (``distribute(..., comm_streams=True)``): per
direction one stream sends and one receives, so a stage receives microbatch m+1 while it sends
microbatch m on, and its compute overlaps both."""

from __future__ import annotations

import itertools

from distir.autodiff.train import Optimizer
from distir.frontends.zoo.registry import build_model
from distir.hardware.cluster import parse_cluster
from distir.interp.shapes import infer_types
from distir.ir.dtensor import DTensorType
from distir.ir.function import Module
from distir.ir.ops import Op
from distir.parallel.distribute import STREAMS, device_map, distribute
from distir.parallel.strategy import Strategy, parse_strategy
from distir.sim.simulate import simulate

MODEL = "gpt:layers=4,hidden=256,heads=4,seq=256,vocab=512"
# one stage per node (4 GPUs each): every transfer crosses the network
STRATEGY = "d4.t1.p3.k6.gpipe.L2-2-0"


def _program(strategy: str = STRATEGY) -> tuple[Strategy, Module]:
    s = parse_strategy(strategy)
    return s, distribute(build_model(MODEL, 24), s, Optimizer("sgd"), comm_streams=True)


def test_every_transfer_goes_from_a_send_stream_to_a_receive_stream() -> None:
    s, prog = _program()
    n = s.devices
    slots = device_map(s, comm_streams=True).mapping
    stream = {d: slots[d].stream for d in slots}
    _, types = infer_types(prog)
    crossings = 0
    for i in prog.entry.body:
        if type(i) is not Op or i.name != "MeshSend":
            continue
        (src_t,), (dst_t,) = [types[v] for v in i.inputs], [types[v] for v in i.outputs]
        assert isinstance(src_t, DTensorType) and isinstance(dst_t, DTensorType)
        src, dst = stream[src_t.mesh.devices[0]], stream[dst_t.mesh.devices[0]]
        gpu_src, gpu_dst = slots[src_t.mesh.devices[0]].gpu, slots[dst_t.mesh.devices[0]].gpu
        if gpu_src != gpu_dst:  # across GPUs: from a send stream to the same direction's receive
            crossings += 1
            way = src.split("_")[0]
            assert (src, dst) == (f"{way}_send", f"{way}_recv"), (src, dst)
        else:  # on one GPU: compute -> a send stream, or a receive stream -> compute (or to a
            # data-parallel collective's stream and back: the gradient buckets)
            assert (src == "compute") != (dst == "compute")
            dp = src.startswith("dp_") or dst.startswith("dp_")
            assert dst.endswith("_send") or src.endswith("_recv") or dp, (src, dst)
    assert crossings == 2 * 2 * 6  # 2 cuts, 6 microbatches, forward and backward
    assert sorted({slot.stream for slot in slots.values()}) == sorted(("compute", *STREAMS))
    assert len(slots) == (1 + len(STREAMS)) * n


def test_a_middle_stage_receives_while_it_sends() -> None:
    """GPipe's forward phase on the middle stage of three, each stage on its own node: in the
    steady state the stage starts a forward every max(compute, transfer) — not compute +
    transfer, which a single stream per direction gave (each receive waiting behind the send
    written before it)."""
    s, prog = _program()
    r = simulate(prog, parse_cluster("g4dn.12xlarge:3"), device_map(s, True), batch=24, trace=True)
    assert r.slices is not None
    compute = r.slots.index(next(sl for sl in r.slots if sl.gpu == 4 and sl.stream == "compute"))
    recv = r.slots.index(next(sl for sl in r.slots if sl.gpu == 4 and sl.stream == "fwd_recv"))
    fwd = sorted(x for x in r.slices if x[3] == compute and x[0] == "@c1_fwd")
    transfers = sorted(x for x in r.slices if x[3] == recv and x[2] > x[1])
    assert len(fwd) == 6 and len(transfers) == 6
    t_fwd = max(x[2] - x[1] for x in fwd)
    t_transfer = max(x[2] - x[1] for x in transfers)
    assert t_fwd > 0 and t_transfer > 0.05 * t_fwd  # both take real time
    periods = [b[1] - a[1] for a, b in itertools.pairwise(fwd[1:])]  # after the first: steady
    for p in periods:
        assert p < 0.999 * (t_fwd + t_transfer), (p, t_fwd, t_transfer)
        assert p >= 0.999 * max(t_fwd, t_transfer)
