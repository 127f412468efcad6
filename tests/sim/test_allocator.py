"""The caching allocator's per-stream pools (``distir.sim.allocator``): hand-counted pools of a
two-stream program against its allocated peak, one stream (small blocks in one 2 MiB segment),
the fit decision, the reduction stream and hand-overs, and the JSON key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import distir
from distir.autodiff.train import Optimizer
from distir.frontends.zoo.registry import build_model
from distir.hardware.cluster import Cluster, parse_cluster
from distir.hardware.specs import DeviceSpec, LinkSpec, NodeSpec, RuntimeMemory
from distir.interp.shapes import entry_args
from distir.ir import parse_module
from distir.ir.types import Device
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.allocator import BLOCK, block_bytes, over_capacity, stream_pools
from distir.sim.cost import RooflineCostModel
from distir.sim.devices import DeviceMap
from distir.sim.simulate import simulate
from distir.sim.summary import summary_dict

MIB = 1 << 20
# bytes of one (4096, 1024) f32 tensor: 16 MiB, a large-pool request whose segment is its own size
# (a multiple of 2 MiB, kRoundLarge; distir.sim.segments)
N = 4096 * 1024 * 4

# d0: GPU 0's compute stream, d1: its communication stream. x stays (an entry parameter); a and
# b are made on the compute stream, b is handed to the comm stream (s), which makes t and u
# there, and u comes back (v, returned). Live bytes after each op (compute | comm):
#   a: 2N | 0   b: 3N | 0 (then a freed: 2N)   s: 2N | N (b freed: N)   t: N | 2N (s freed: N)
#   u: N | 2N (t freed: N)   v: 2N | N (u freed: 0)
# so the compute pool peaks at 3N, the comm pool at 2N, everything together at 3N: the
# allocator reserves 5N where at most 3N is ever allocated.
TWO_STREAMS = """func @f(%x: Tensor[f32, (4096, 1024), d0]) {
  %a = Relu(%x)
  %b = Neg(%a)
  %s = Send(%b, dst=d1)
  %t = Neg(%s)
  %u = Relu(%t)
  %v = Send(%u, dst=d0)
  return %v
}
"""
# one stream, tensors of 400 bytes (100 f32): each a 512-byte block
ONE_STREAM = """func @f(%x: Tensor[f32, (100,), d0]) {
  %a = Relu(%x)
  %b = Neg(%a)
  return %b
}
"""


NONE = RuntimeMemory()


def cluster(runtime: RuntimeMemory = NONE, memory_bytes: int = 1 << 30) -> Cluster:
    dev = DeviceSpec("dev", 1e12, 1e12, 1e12, 1e12, 1e11, memory_bytes, 0.0, runtime=runtime)
    return Cluster("c", (NodeSpec("n", dev, 1, LinkSpec(1e10, 1e-6), LinkSpec(1e9, 1e-5)),))


def two_streams(runtime: RuntimeMemory = NONE, memory_bytes: int = 1 << 30) -> distir.SimResult:
    m = distir.check(parse_module(TWO_STREAMS))
    cl = cluster(runtime, memory_bytes)
    dm = DeviceMap.parse("d0=0,d1=0:comm", {Device(0), Device(1)}, cl.num_devices)
    return simulate(m, cl, dm, allocator=True)


def test_block_bytes_rounds_up_to_512() -> None:
    assert [block_bytes(x) for x in (0, 1, 511, 512, 512.5, 513, 400.0)] == [
        0,
        512,
        512,
        512,
        1024,
        1024,
        512,
    ]
    assert BLOCK == 512


def test_two_streams_reserve_their_pools_sum_beyond_the_allocated_peak() -> None:
    r = two_streams()
    assert r.peak_memory == {0: 3 * N}  # the simulator's allocated peak: unchanged
    assert r.stream_pools == {0: {"compute": 3 * N, "comm": 2 * N}}
    assert r.reserved_memory == {0: 5 * N}


def test_reserved_adds_the_fixed_runtime_memory_to_the_segments_not_the_flat_fraction() -> None:
    rt = RuntimeMemory(
        context_bytes=300 * MIB, workspace_bytes=32 * MIB, comm_bytes=100 * MIB, fragmentation=0.1
    )
    r = two_streams(rt)
    fixed = (300 + 32 + 100) * MIB
    assert r.peak_memory == {0: pytest.approx(3 * N * 1.1 + fixed)}
    assert r.reserved_memory == {0: pytest.approx(5 * N + fixed)}


def test_one_stream_packs_its_small_blocks_into_one_small_segment() -> None:
    m = distir.check(parse_module(ONE_STREAM))
    r = simulate(m, cluster(), allocator=True)
    assert r.peak_memory == {0: 3 * 400.0}
    assert r.stream_pools == {0: {"compute": 2.0 * MIB}}  # kSmallBuffer
    assert r.reserved_memory == {0: 2.0 * MIB}
    pools = stream_pools(
        m, m.entry, entry_args(m.entry, None), DeviceMap.default({Device(0)}, 1), RooflineCostModel(cluster())
    )
    assert pools.allocated == {0: 3 * 512.0} and pools.reserved(0) == 2.0 * MIB
    assert pools.live == {0: {"compute": 3 * 512.0}}


def test_a_reserved_peak_over_capacity_still_fits_when_the_allocated_peak_does() -> None:
    """Between 3N and 5N the allocator runs out of fresh memory, frees the comm stream's cached
    blocks and retries: the run fits. Below 3N the live tensors alone do not."""
    r = two_streams(memory_bytes=4 * N)
    assert r.oom_gpus == [] and over_capacity(r.reserved_memory, r.capacity) == [0]
    assert not summary_dict(r)["oom"]
    small = two_streams(memory_bytes=3 * N - 1)
    assert small.oom_gpus == [0]
    roomy = two_streams(memory_bytes=5 * N)
    assert over_capacity(roomy.reserved_memory, roomy.capacity) == []


def test_no_pools_unless_asked_and_the_json_key() -> None:
    m = distir.check(parse_module(TWO_STREAMS))
    cl = cluster()
    dm = DeviceMap.parse("d0=0,d1=0:comm", {Device(0), Device(1)}, cl.num_devices)
    plain = simulate(m, cl, dm)
    assert plain.reserved_memory == {} and plain.stream_pools == {}
    assert summary_dict(plain)["reserved_memory_bytes"] == {"d0": None, "d1": None}
    assert summary_dict(two_streams())["reserved_memory_bytes"] == {"d0": 5.0 * N, "d1": 5.0 * N}


def _fsdp() -> tuple[distir.Module, Cluster, DeviceMap]:
    s = parse_strategy("d4.t1.p1.k1.z3")
    mod = build_model("gpt:layers=2,hidden=256,heads=4,seq=64,vocab=512", batch=8)
    prog = distribute(mod, s, Optimizer("adam"), comm_streams=True, gather_copy_out=True)
    return prog, parse_cluster("dgx-a100"), device_map(s, True)


def test_fsdp_gradient_shards_fill_a_reduction_pool_and_gathers_a_gather_pool() -> None:
    """ZeRO-3 with communication streams: the reduce-scatters' results (the gradient shards,
    read by the optimizer at the end of the step) live in the reduction stream's own pool, the
    gathered weights in the gather stream's; the compute stream's pool is the allocated peak or
    less, and the allocated peak is the simulator's, within rounding to blocks."""
    prog, cl, dm = _fsdp()
    r = simulate(prog, cl, dm, allocator=True)
    rt = cl.device_spec(0).runtime
    pools = stream_pools(prog, prog.entry, entry_args(prog.entry, None), dm, RooflineCostModel(cl))
    for g, segments in r.stream_pools.items():
        tensors = r.peak_memory[g] - r.runtime_memory[g]
        assert set(segments) >= {"compute", "dp_gather", "dp_reduce/reduce"}
        assert pools.live[g]["compute"] <= tensors + 512 * 1000
        assert all(segments[k] >= v for k, v in pools.live[g].items())  # segments hold the live blocks
        assert sum(segments.values()) > tensors  # the other streams' caches are reserved beside it
        assert r.reserved_memory[g] == pytest.approx(sum(segments.values()) + rt.fixed_bytes)
    for g, top in pools.allocated.items():
        tensors = r.peak_memory[g] - r.runtime_memory[g]
        assert tensors <= top <= tensors * 1.01


def test_cli_simulate_reserved_fills_the_json_key_and_the_table_column(tmp_path: Path) -> None:
    from test_cli import EX, run  # tests/ is on sys.path

    prog = tmp_path / "two.distir"
    prog.write_text(TWO_STREAMS)
    code, out, _ = run("simulate", str(prog), "--device-map", "d0=0,d1=0:comm", "--reserved", "--json")
    assert code == 0
    d = json.loads(out)
    rt = parse_cluster("dgx2-v100").device_spec(0).runtime
    want = 5 * N + rt.fixed_bytes
    assert d["reserved_memory_bytes"] == {"d0": pytest.approx(want), "d1": pytest.approx(want)}
    code, out, _ = run("simulate", str(EX / "fig9_zero.distir"), "--cluster", "p3.8xlarge", "--reserved")
    assert code == 0 and "reser" in out  # the column (its header cut to the width)
    code, out, _ = run("simulate", str(EX / "fig9_zero.distir"), "--cluster", "p3.8xlarge", "--json")
    assert code == 0 and set(json.loads(out)["reserved_memory_bytes"].values()) == {None}


# two GPUs, each with its compute stream (d0, d1: mesh A) and a communication stream (d2, d3:
# mesh B); x (N per GPU) and a (returned) stay on the compute streams. a is handed to the comm
# streams (b: the same GPUs, so the same allocation, in the compute pool), where c is made;
# across GPUs (d2, d3 to d1, d0) the MeshSend is a transfer, received into a new buffer e on the
# compute stream. Per GPU (compute | comm): a: 2N | 0; b: 2N | 0; c: 2N | N (b freed: a stays);
# e: 3N | N (then c freed). Pools 3N and N: 4N reserved. Were b a new allocation, the comm pool
# would hold b and c (2N); were e a hand-over, the compute pool would stay at 2N.
HANDED = """func @f(%x: DTensor[f32, (8192, 1024), mesh(dp=2; d0, d1), [S(0)]]) {
  %a = Relu(%x)
  %b = MeshSend(%a, mesh="dp=2; d2, d3")
  %c = Neg(%b)
  %e = MeshSend(%c, mesh="dp=2; d1, d0")
  return %e, %a
}
"""


def test_a_hand_over_to_another_stream_of_the_gpu_stays_in_its_pool() -> None:
    m = distir.check(parse_module(HANDED))
    node = cluster().nodes[0]
    cl = Cluster("c", (NodeSpec("n", node.device, 2, node.intra, node.inter),))
    devs = {Device(i) for i in range(4)}
    dm = DeviceMap.parse("d0=0,d1=1,d2=0:comm,d3=1:comm", devs, cl.num_devices)
    r = simulate(m, cl, dm, allocator=True)
    for g in (0, 1):
        assert r.stream_pools[g] == {"compute": 3 * N, "comm": N}
        assert r.reserved_memory[g] == 4 * N


def test_a_program_above_the_allocator_bound_is_refused_before_the_walk() -> None:
    from distir.sim.simulate import AllocatorSizeError

    m = distir.check(parse_module(ONE_STREAM))
    n = simulate(m, cluster()).n_ops
    with pytest.raises(AllocatorSizeError, match=rf"program's {n} ops .* above {n - 1}"):
        simulate(m, cluster(), allocator=True, allocator_max_ops=n - 1)
    assert simulate(m, cluster(), allocator=True, allocator_max_ops=n).reserved_memory == {0: 2.0 * MIB}


def test_cli_reserved_is_bounded_by_a_share_of_max_ops(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from distir.cli import main

    argv = ["distir", "simulate", "--model", "gpt:layers=2,hidden=64,heads=2,seq=16,vocab=64"]
    argv += ["--strategy", "d1.t1.p2.k4.1f1b", "--cluster", "dgx-a100", "--reserved", "--max-ops", "2000"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert "above 100 (--max-ops / 20" in err and "raise --max-ops" in err
