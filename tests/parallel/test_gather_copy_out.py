"""distribute(..., gather_copy_out=True): PyTorch FSDP2's copy-out of every ZeRO-3 parameter
all-gather into the parameters' storage, on the compute stream, in the forward and again in the
backward. The program gains one ``Identity`` per gathered weight and gather; without
communication streams (every op in one chain) the simulated step is longer by exactly those
copies' cost, counted by hand: a read and a write of the whole weight over the GPU's bandwidth
at the cost model's memory efficiency, plus a launch each."""

from __future__ import annotations

import pytest

from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir.function import Module
from distir.ir.types import DType
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.cost import RooflineCostModel
from distir.sim.simulate import simulate

LLAMA = "llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=128,seq=16,vocab=64"
STRATEGY = "d2.t1.p1.k1.1f1b.z3"


def _program(copy_out: bool, streams: bool = False) -> Module:
    s = parse_strategy(STRATEGY)
    model = build_model(LLAMA, batch=2 * s.d, dtype=DType.bf16)
    return distribute(
        model, s, Optimizer("adam"), precision="mixed", comm_streams=streams, gather_copy_out=copy_out
    )


def _count(prog: Module, name: str, fn_name: str | None = None) -> int:
    """``name`` ops in the function ``fn_name``, or in the functions the entry calls."""
    called = {c.callee for c in prog.entry.calls()} if fn_name is None else {fn_name}
    return sum(op.name == name for fn in prog.functions if fn.name in called for op in fn.ops())


def _block_weight_bytes() -> int:
    """One layer's weights in bf16: the norms, wq, wk, wv, wo, w1, w3, w2."""
    h, kv, ffn = 64, 2 * (64 // 4), 128
    return 2 * (2 * h + h * h + 2 * h * kv + h * h + 3 * h * ffn)


WEIGHTS = 2 * 9 + 3  # two blocks of nine, the token embedding, the final norm, the head


def test_one_copy_per_gathered_weight_and_gather() -> None:
    plain, copied = _program(False), _program(True)
    assert _count(plain, "Identity") == 0
    assert _count(copied, "Identity", "c0_fwd") == WEIGHTS == _count(copied, "Redistribute", "c0_fwd")
    assert _count(copied, "Identity", "c0_bwd_red") == WEIGHTS
    assert _count(copied, "Redistribute") == _count(plain, "Redistribute")


@pytest.mark.parametrize("streams", [False, True])
def test_the_copies_run_on_the_compute_stream(streams: bool) -> None:
    cluster = parse_cluster("dgx-a100")
    cost = RooflineCostModel(cluster, fuse=False)
    dm = device_map(parse_strategy(STRATEGY), streams)
    plain = simulate(_program(False, streams), cluster, dm, cost, batch=4)
    copied = simulate(_program(True, streams), cluster, dm, cost, batch=4)
    assert copied.busy_s[0] > plain.busy_s[0]
    if streams:
        return
    spec = cluster.device_spec(0)
    mem = spec.memory_bandwidth * 0.8
    # every weight of the two blocks, the embedding, the final norm and the head: forward and backward
    weights = 2 * _block_weight_bytes() + 2 * (64 * 64) + 2 * 64 + 2 * (64 * 64)
    copies = 2 * WEIGHTS
    want = 2 * (2 * weights) / mem + copies * spec.launch_overhead_s
    assert copied.step_time_s - plain.step_time_s == pytest.approx(want, rel=1e-6)
