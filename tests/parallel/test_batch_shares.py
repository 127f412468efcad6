"""Uneven data parallelism: batch shares on the dp axis (``Strategy.shares``, ``.b2-1-1``;
``distir.ir.dtensor.AxisSize``). Every dim sharded along the axis splits in proportion; the
training step still equals the sequential one, per rank and globally, and a faster replica given
more of the batch shortens the step of a data-parallel group that mixes GPU kinds."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from distir.autodiff.train import Optimizer
from distir.frontends.zoo.registry import build_model
from distir.hardware.cluster import parse_cluster
from distir.interp.lockstep import check_deadlock_free
from distir.interp.project import project
from distir.ir import parse_module, print_module
from distir.ir.dtensor import AxisSize, DTensorType, Mesh, Shard, axis_size, shares_of, split_sizes
from distir.ir.types import DType, IRTypeError
from distir.ir.verify import verify
from distir.parallel.check import check_against_sequential
from distir.parallel.distribute import device_map, distribute
from distir.parallel.sharding.materialize import local_shape
from distir.parallel.strategy import StrategyError, parse_strategy
from distir.sim.simulate import simulate

FAMILIES = {
    "mlp": "mlp:layers=4,hidden=6",
    "gpt": "gpt:layers=4,hidden=8,heads=2,seq=4,vocab=16",
    "llama": "llama:layers=4,hidden=8,heads=4,kv_heads=2,ffn=12,vocab=16,seq=4",
    "transgan": "transgan:wide_layers=2,narrow_layers=2,dim=128,bottom=1,window=4,latent=8,heads=2",
}
SEQUENCE = {"gpt", "llama"}  # the families declaring a sequence dim (TransGAN's activations change meaning)
# (strategy, batch): the microbatch divides by the shares' sum
STRATEGIES = [
    ("d3.t1.p1.k2.1f1b.b2-1-1", 8),
    ("d2.t1.p2.k2.zb1.b3-1", 8),
    ("d2.t2.p1.k1.gpipe.b1-3", 4),
    ("d2.t1.p2.k2.interleaved.v2.rsel.b1-3", 8),
    ("d3.t1.p1.k1.1f1b.rfull.b1-2-3", 6),
    ("d2.t2.sp.p1.k2.1f1b.b3-1", 8),  # sequence parallelism: the families with a sequence dim
]


# -- the axis ----------------------------------------------------------------------------------
@given(st.integers(0, 200), st.lists(st.integers(1, 6), min_size=2, max_size=6))
def test_weighted_split_is_proportional_and_exact(n: int, shares: list[int]) -> None:
    size = axis_size(len(shares), tuple(shares))
    got = split_sizes(n, size)
    assert sum(got) == n and len(got) == len(shares)
    total = sum(shares)
    for g, w in zip(got, shares, strict=True):
        assert abs(g - n * w / total) < 1  # within one of the exact share
    if n % total == 0:
        assert got == [n * w // total for w in shares]
    if len(set(shares)) == 1:  # equal shares: the near-equal split, as a plain int
        assert type(size) is int and got == split_sizes(n, len(shares))


def test_axis_sizes_are_canonical_and_compare_with_their_shares() -> None:
    a = axis_size(3, (4, 2, 2))
    assert type(a) is AxisSize and shares_of(a) == (2, 1, 1) and int(a) == 3
    assert a == axis_size(3, (2, 1, 1)) and hash(a) == hash(axis_size(3, (2, 1, 1)))
    assert a != 3 and a != axis_size(3, (1, 2, 1))
    assert pickle.loads(pickle.dumps(a)) == a
    m = Mesh.parse("dp=3[2:1:1], tp=2")
    assert m != Mesh.parse("dp=3, tp=2") and m == Mesh.parse("dp=3[4:2:2], tp=2")
    with pytest.raises(IRTypeError, match="needs 3 positive integer shares"):
        axis_size(3, (1, 2))
    with pytest.raises(IRTypeError, match="shares are not like"):
        Mesh.parse("dp=2[2:x]")


def test_weighted_mesh_prints_and_parses() -> None:
    text = (
        "func @f(%x: DTensor[f32, (12, 4), mesh(dp=3[2:1:1], tp=2; d0, d1, d2, d3, d4, d5), [S(0), R]]) {\n"
        "  %y = Relu(%x)\n"
        "  return %y\n"
        "}\n"
    )
    m = parse_module(text)
    assert print_module(m) == text and print_module(parse_module(print_module(m))) == text
    x = m.entry.params[0].type
    assert isinstance(x, DTensorType)
    assert [local_shape(x, d)[0] for d in x.mesh.devices] == [6, 6, 3, 3, 3, 3]
    bad = text.replace("[2:1:1]", "[2:1]")
    with pytest.raises(ValueError, match=r"1:\d+: .*needs 3 positive integer shares"):
        parse_module(bad)


# -- strategies --------------------------------------------------------------------------------
def test_share_strategies_round_trip_and_errors() -> None:
    for text in ["d3.t1.p1.k2.1f1b.b2-1-1", "d2.t2.p2.k4.zb1.L2-3.b3-1.@1-0-2-3-4-5-6-7"]:
        s = parse_strategy(text)
        assert str(s) == text and parse_strategy(str(s)) == s
    assert parse_strategy("d2.t1.p1.k1.1f1b.b4-2").shares == (2, 1)  # lowest terms
    assert parse_strategy("d2.t1.p1.k1.1f1b.b3-3").shares is None  # equal shares: even
    with pytest.raises(StrategyError, match="d = 2 positive integers"):
        parse_strategy("d2.b1-1-1")
    with pytest.raises(StrategyError, match="do not combine with ZeRO"):
        parse_strategy("d2.z1.b2-1")
    model = build_model(FAMILIES["mlp"], batch=6)
    with pytest.raises(StrategyError, match="the batch 6 does not split in the batch shares 2-1-1"):
        distribute(model, parse_strategy("d3.k2.b2-1-1"))  # microbatch 3, shares sum to 4


@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "strategy", "batch"),
    [(f, st, b) for f in sorted(FAMILIES) for st, b in STRATEGIES if f in SEQUENCE or ".sp." not in st],
)
def test_uneven_shares_train_as_the_sequential_step(family: str, strategy: str, batch: int) -> None:
    s = parse_strategy(strategy)
    model = build_model(FAMILIES[family], batch=batch, dtype=DType.f64)
    cmp = check_against_sequential(model, s)
    # updates, not weights: a key bias's gradient is zero in exact arithmetic (softmax ignores a
    # shift of all scores), so its update is rounding noise with no relative accuracy
    err, where = cmp.update_error()
    assert err < 1e-9, f"{family} {s}: {where} differs by {err:.2e}"
    verify(cmp.distributed)
    verify(cmp.materialized)
    ranks = project(cmp.materialized)
    check_deadlock_free(ranks)
    # the pieces are uneven as the shares say: the first microbatch's input, per replica
    x = cmp.distributed.entry.params[0].type
    assert isinstance(x, DTensorType) and isinstance(x.placements[0], Shard)
    assert s.shares is not None
    mb = batch // s.k
    rows = [local_shape(x, x.mesh.devices[r * s.t])[0] for r in range(s.d)]
    assert rows == [mb * w // sum(s.shares) for w in s.shares]


# -- simulation --------------------------------------------------------------------------------
def test_the_faster_replica_taking_more_shortens_the_step() -> None:
    """One replica on a node of V100s, the other on a node of T4s (about half as fast): 2-1 beats
    even, and the V100s hold more activations."""
    cluster = parse_cluster("p3.8xlarge:1+g4dn.12xlarge:1")
    model = "gpt:layers=4,hidden=256,heads=4,seq=128,vocab=512"
    times, peaks = {}, {}
    for text in ["d2.t4.p1.k2.1f1b", "d2.t4.p1.k2.1f1b.b2-1"]:
        s = parse_strategy(text)
        prog = distribute(build_model(model, 48), s, Optimizer("adam"), comm_streams=True)
        r = simulate(prog, cluster, device_map(s, True), batch=48)
        times[text], peaks[text] = r.step_time_s, r.peak_memory
    even, uneven = times["d2.t4.p1.k2.1f1b"], times["d2.t4.p1.k2.1f1b.b2-1"]
    assert uneven < 0.95 * even, (uneven, even)
    p = peaks["d2.t4.p1.k2.1f1b.b2-1"]
    assert p[0] > p[4]  # GPU 0 (V100, 2 shares) holds more than GPU 4 (T4, 1 share)
    assert peaks["d2.t4.p1.k2.1f1b"][0] == peaks["d2.t4.p1.k2.1f1b"][4]
