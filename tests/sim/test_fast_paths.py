"""Each of the planner's fast paths (``PlanOptions``) against the reference (``REFERENCE``: the
interpreter's walk, ``build_plan``'s liveness, every call planned on its own mesh): the same
figures, bit for bit, traced and untraced, on the bench programs (flat, layered with calls, a
DTensor pipeline), the example programs and distributed zoo models. The reference itself is
checked against the independent oracle (``oracle.py``) in ``test_call_summaries.py``."""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from distir.autodiff.train import Optimizer
from distir.frontends.zoo.registry import build_model
from distir.hardware.cluster import Cluster, parse_cluster
from distir.interp.shapes import entry_args
from distir.ir import Module, parse_module
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.cost import RooflineCostModel
from distir.sim.devices import DeviceMap
from distir.sim.plan import REFERENCE, PlanDomain, PlanOptions
from distir.sim.simulate import _program_devices, _run
from sim.test_figures_unchanged import _bench_cases, figures

ROOT = Path(__file__).resolve().parents[2]

FAST_PATHS = {  # name -> the reference with that one fast path taken
    "flat": dataclasses.replace(REFERENCE, fast_path=True),
    "relabel": dataclasses.replace(REFERENCE, relabel=True),
    "assume_units": dataclasses.replace(REFERENCE, assume_units=True),
    "columns": dataclasses.replace(REFERENCE, fast_path=True, entry_memory_columns=True),
    "all": PlanOptions(entry_param_uses=False, entry_memory_columns=True, assume_units=True),
}


@cache
def programs() -> dict[str, tuple[Module, Cluster, DeviceMap | None]]:
    out: dict[str, tuple[Module, Cluster, DeviceMap | None]] = {}
    for name, (m, cluster, _batch) in _bench_cases().items():
        out[name] = (m, parse_cluster(cluster), None)
    for path in sorted((ROOT / "examples").glob("*.distir")):
        out[path.stem] = (parse_module(path.read_text()), parse_cluster("p3.8xlarge:2"), None)
    for model, strategy in [
        ("gpt:layers=4,hidden=64,heads=4,seq=16,vocab=128", "d2.t2.sp.p2.k2.z3.1f1b"),
        ("llama:layers=3,hidden=64,heads=4,kv_heads=2,seq=16,vocab=128", "d1.t2.p2.k4.1f1b"),
    ]:
        s = parse_strategy(strategy)
        prog = distribute(build_model(model, 8), s, Optimizer("adam"), comm_streams=True)
        out[f"{model.split(':')[0]}.{strategy}"] = (prog, parse_cluster("p3.8xlarge:2"), device_map(s, True))
    return out


def run(
    m: Module, cluster: Cluster, dmap: DeviceMap | None, options: PlanOptions, trace: bool
) -> dict[str, Any]:
    """The figures of ``m`` planned with ``options`` and run."""
    if dmap is None:
        dmap = DeviceMap.default(_program_devices(m, m.entry), cluster.num_devices)
    dom = PlanDomain(m, dmap, RooflineCostModel(cluster), options)
    plan = dom.plan(m.entry, entry_args(m.entry, None))
    assert dom.units.confirm(), "the assumed units are the prepared ones on these programs"
    return figures(_run(plan, dom, cluster, dmap, trace, None))


@pytest.mark.slow
@pytest.mark.parametrize("trace", [False, True])
@pytest.mark.parametrize("path", sorted(FAST_PATHS))
def test_a_fast_path_gives_the_references_figures(path: str, trace: bool) -> None:
    options = FAST_PATHS[path]
    if trace and options.entry_memory_columns:
        options = dataclasses.replace(options, entry_memory_columns=False)  # columns: untraced only
    for name, (m, cluster, dmap) in programs().items():
        assert run(m, cluster, dmap, options, trace) == run(m, cluster, dmap, REFERENCE, trace), name


def test_the_fast_paths_are_taken() -> None:
    m, cluster, dmap = programs()["bench.layered"]
    dmap = DeviceMap.default(_program_devices(m, m.entry), cluster.num_devices)
    fast = PlanDomain(m, dmap, RooflineCostModel(cluster), FAST_PATHS["columns"])
    assert fast.plan(m.entry, entry_args(m.entry, None)).flat is False  # an entry with calls
    flat, cl, _ = programs()["bench.flat"]
    fdmap = DeviceMap.default(_program_devices(flat, flat.entry), cl.num_devices)
    got = PlanDomain(flat, fdmap, RooflineCostModel(cl), FAST_PATHS["columns"]).plan(
        flat.entry, entry_args(flat.entry, None)
    )
    ref = PlanDomain(flat, fdmap, RooflineCostModel(cl), REFERENCE).plan(
        flat.entry, entry_args(flat.entry, None)
    )
    assert got.columns is not None and ref.columns is None and not ref.flat
    spmd, cl2, _ = programs()["bench.spmd"]
    sdmap = DeviceMap.default(_program_devices(spmd, spmd.entry), cl2.num_devices)
    dom = PlanDomain(spmd, sdmap, RooflineCostModel(cl2), FAST_PATHS["all"])
    dom.plan(spmd.entry, entry_args(spmd.entry, None))
    assert dom.units.relabels > 0
