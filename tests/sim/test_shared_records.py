"""``SharedRecords``: planning domains of one device map, cost model and units share op records;
every simulation gives the figures it gives alone."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from distir.frontends.zoo.registry import parse_model_string
from distir.hardware.cluster import parse_cluster
from distir.ir.builder import FunctionBuilder
from distir.ir.function import Function, Module
from distir.ir.types import Device, Type
from distir.ops.registry import REGISTRY
from distir.parallel.distribute import sharded_layers
from distir.parallel.layer_sharder import split_backward
from distir.sim.cost import RooflineCostModel
from distir.sim.devices import DeviceMap, Slot
from distir.sim.simulate import SharedPlans, SharedRecords, SimResult, simulate

# a vocabulary of 129 shards unevenly over two devices (the head's and loss's types)
GPT = "gpt:layers=2,hidden=64,heads=4,seq=16,vocab=129"


def _probe(fn: Function, args: Sequence[Type], keep_first: bool = False) -> Module:
    fb = FunctionBuilder("probe", REGISTRY.out_arity)
    params = [fb.param(f"a{i}", t) for i, t in enumerate(args)]
    outs = fb.call(fn, *params, n_out=len(fn.outputs))
    return Module((fn, fb.ret(*(outs[:1] if keep_first else outs))))


def _figures(r: SimResult) -> tuple[object, ...]:
    return (r.step_time_s, r.busy_s, r.comm_s, r.peak_memory, r.flops, r.n_ops, r.memory_timeline)


def _probes(t: int, b: int) -> list[Module]:
    """Every layer's forward, backward and zero-bubble input-gradient part, with and without
    sequence parallelism and under two recomputations: programs that share most of their ops."""
    model = parse_model_string(GPT).build(b)
    out: list[Module] = []
    for sp in (False, True) if t > 1 else (False,):
        for recompute in ("none", "full"):
            for L in sharded_layers(model, 1, t, recompute, sp=sp):
                out.append(_probe(L.fwd, L.fwd_args))
                out.append(_probe(L.fwd, L.fwd_args, keep_first=True))
                if L.bwd is not None and L.vjp is not None:
                    out.append(_probe(L.bwd, L.bwd_args))
                    n_dx = 1 if 0 in L.vjp.wrt else 0
                    out.append(_probe(split_backward(L.bwd, n_dx, L.bwd_args)[0], L.bwd_args))
    return out


@pytest.mark.parametrize(("t", "gpus"), [(1, [0]), (2, [0, 1]), (2, [3, 4]), (4, [2, 3, 4, 5])])
def test_shared_records_give_every_probe_its_own_figures(t: int, gpus: list[int]) -> None:
    """On one TP group (of one GPU kind, of two, and of two kinds mixed — whose devices form
    units of their own), probes planned with the records of the others give exactly the
    figures of each planned alone, traced or not; and records are taken."""
    cluster = parse_cluster("p3.8xlarge:1+g4dn.12xlarge:1")
    dmap = DeviceMap({Device(i): Slot(g) for i, g in enumerate(gpus)})
    cost = RooflineCostModel(cluster)
    records = SharedRecords()
    for trace in (False, True):
        for m in _probes(t, 2):
            shared = SharedPlans(records)  # a new domain per program: only records are shared
            got = simulate(m, cluster, dmap, cost, trace=trace, shared=shared)
            assert _figures(got) == _figures(simulate(m, cluster, dmap, cost, trace=trace))
    assert records.taken > 0 and records.size > 0


def test_records_are_shared_only_by_domains_of_the_same_device_map() -> None:
    """Another device map (other GPUs: other costs) starts a store of its own."""
    cluster = parse_cluster("p3.8xlarge:1+g4dn.12xlarge:1")
    cost = RooflineCostModel(cluster)
    records = SharedRecords()
    m = _probes(2, 2)[0]
    for gpus in ([0, 1], [4, 5]):
        dmap = DeviceMap({Device(i): Slot(g) for i, g in enumerate(gpus)})
        got = simulate(m, cluster, dmap, cost, shared=SharedPlans(records))
        assert _figures(got) == _figures(simulate(m, cluster, dmap, cost))
    assert records.taken == 0


# stage 1's 3 × 3 tokens shard unevenly over two devices inside the block, where its entry's
# types shard evenly: the units the entry's types call for are not the program's
TRANSGAN = "transgan:wide_layers=1,narrow_layers=1,dim=128,bottom=3,window=8,latent=16,heads=2"


@pytest.mark.parametrize("t", [2, 4])
def test_a_program_of_other_units_than_its_entry_assumes_is_kept_on_prepared_units(t: int) -> None:
    """A layer whose units are not confirmed is planned on prepared units (``Units.prepare``);
    that domain is kept — the next program calling the same function on the same types plans on
    it — and its records go to a store of prepared domains only (another function's prepared
    domain takes them; the assuming domains of the other layers do not): every figure as
    planned alone."""
    cluster = parse_cluster("p3.8xlarge:1")
    dmap = DeviceMap({Device(i): Slot(i) for i in range(t)})
    cost = RooflineCostModel(cluster)
    records = SharedRecords()
    layers = sharded_layers(parse_model_string(TRANSGAN).build(1), 1, t)
    uneven = [L for L in layers if L.fwd.name.startswith("block_1")]
    assert uneven
    prepared = 0
    for L in layers:
        shared = SharedPlans(records, relabel=False)
        for m in (_probe(L.fwd, L.fwd_args), _probe(L.fwd, L.fwd_args, keep_first=True)):
            for trace in (False, True):
                got = simulate(m, cluster, dmap, cost, trace=trace, shared=shared)
                assert _figures(got) == _figures(simulate(m, cluster, dmap, cost, trace=trace))
        assert shared.hits == 3  # every program after the first planned on the kept domain
        ((domain, _),) = shared._domains.values()
        prepared += not domain.units.assumed
        assert domain.units.assumed == (L not in uneven)
    assert prepared == len(uneven)
    # the block under full recomputation (another forward, mostly the same ops) on prepared
    # units takes records the first one's domain made
    full = sharded_layers(parse_model_string(TRANSGAN).build(1), 1, t, "full")
    (L,) = [x for x in full if x.fwd.name.startswith("block_1")]
    before = records.taken
    m = _probe(L.fwd, L.fwd_args)
    shared = SharedPlans(records, relabel=False)
    got = simulate(m, cluster, dmap, cost, shared=shared)
    assert _figures(got) == _figures(simulate(m, cluster, dmap, cost))
    ((domain, _),) = shared._domains.values()
    assert not domain.units.assumed and records.taken > before
