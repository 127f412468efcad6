"""``distir.sim.probe``: a program calling one function once, worked out from the call's summary,
has the figures ``simulate`` gives for it — every donation and every choice of results, on the
same shared domains."""

from __future__ import annotations

import itertools

import pytest

from distir.frontends.zoo.registry import parse_model_string
from distir.hardware.cluster import parse_cluster
from distir.ir.types import Device
from distir.parallel.distribute import sharded_layers
from distir.parallel.layer_sharder import unsharded_layers
from distir.search.profile import _probe
from distir.sim.cost import RooflineCostModel
from distir.sim.devices import DeviceMap, Slot
from distir.sim.probe import probe
from distir.sim.simulate import SharedPlans, simulate

GPT = "gpt:layers=2,hidden=64,heads=4,seq=16,vocab=128"


@pytest.mark.parametrize("t", [1, 2])
def test_probe_figures_equal_the_simulated_probe_program(t: int) -> None:
    cluster = parse_cluster("p3.8xlarge:1+g4dn.12xlarge:1")
    model = parse_model_string(GPT).build(2)
    layers = unsharded_layers(model) if t == 1 else sharded_layers(model, 1, t, sp=True)
    gpus = [3, 4][:t]  # a mixed group: two device kinds
    dmap = DeviceMap({Device(i): Slot(g) for i, g in enumerate(gpus)})
    cost = RooflineCostModel(cluster)
    fast, slow = SharedPlans(relabel=False), SharedPlans(relabel=False)
    n = 0
    for layer in layers:
        for fn, args in ((layer.fwd, layer.fwd_args), (layer.bwd, layer.bwd_args)):
            if fn is None:
                continue
            outs = range(len(fn.outputs))
            dyings = [frozenset(), frozenset(range(len(args))), frozenset({0})]
            keeps = [None, range(1, len(fn.outputs)), range(0)]
            for dying, keep in itertools.product(dyings, keeps):
                got = probe(fast, fn, args, cluster, dmap, cost, dying, keep)
                assert got is not None
                r = simulate(_probe(fn, args, dying, keep), cluster, dmap, cost, trace=True, shared=slow)
                assert r.memory_timeline is not None
                assert got.step_time_s == r.step_time_s and got.flops == r.flops
                assert got.peak_memory == r.peak_memory
                assert got.param_memory == r.param_memory
                assert got.runtime_memory == r.runtime_memory
                assert got.final_memory == {g: tl[-1][1] for g, tl in r.memory_timeline.items()}
                n += len(outs) > 0
    assert n > 0 and fast.hits > 0
