"""The reference planner (``distir.sim.reference``) against the fast planner and each of its
fast paths, bit for bit: on the golden programs (bench programs, examples, the zoo cases of
``test_figures_unchanged.py``), on zoo models distributed under every kind of strategy, and on
random programs (``gen_programs``, every call pattern on, with unit and roofline costs). The
reference itself is held to the independent oracle (``oracle.py``: a naive simulator of the
inlined program) and to the fast planner on the inlined program, which decide where the two
planners differ."""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import distir
from distir.autodiff.train import Optimizer
from distir.cli import app
from distir.frontends.zoo.registry import build_model
from distir.hardware.cluster import Cluster, parse_cluster
from distir.interp.loop import InterpretError
from distir.ir import Module, parse_module
from distir.ir.rewrite import inline_calls
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.cost import RooflineCostModel
from distir.sim.devices import DeviceMap
from distir.sim.simulate import SimResult, simulate
from sim.gen_programs import Feats, programs
from sim.helpers import UnitCost, tiny_cluster
from sim.oracle import has_multi_result_gpu, oracle
from sim.test_call_summaries import DEVICE_MAPS, MULTI_NODE
from sim.test_fast_paths import FAST_PATHS, run
from sim.test_fast_paths import programs as fast_path_programs
from sim.test_figures_unchanged import EXAMPLES, ZOO, _bench_cases, figures

Case = tuple[Module, Cluster, DeviceMap | None, int | None]


@cache
def golden_programs() -> dict[str, Case]:
    """The programs of ``figures_golden.json``."""
    out: dict[str, Case] = {}
    for name, (m, cluster, batch) in _bench_cases().items():
        out[name] = (m, parse_cluster(cluster), None, batch)
    for path in EXAMPLES:
        out[f"example.{path.stem}"] = (
            parse_module(path.read_text()),
            parse_cluster("p3.8xlarge:2"),
            None,
            None,
        )
    for model, strategy, cluster, batch, train in ZOO:
        s = parse_strategy(strategy)
        prog = distribute(build_model(model, batch), s, Optimizer("adam"), train=train, comm_streams=True)
        out[f"zoo.{model.split(':')[0]}.{strategy}"] = (
            prog,
            parse_cluster(cluster),
            device_map(s, True),
            batch,
        )
    return out


def _untraced(
    m: Module, cluster: Cluster, dmap: DeviceMap | None, batch: int | None, planner: str
) -> dict[str, Any]:
    return figures(simulate(m, cluster, dmap, batch=batch, planner=planner))


def _traced(r: SimResult) -> dict[str, Any]:
    """A traced run's figures; slices as a set (the fast planner lists a DTensor op's slices by
    units of devices, the reference by slot), no memory timeline (the reference draws none)."""
    got = figures(dataclasses.replace(r, slices=None, memory_timeline=None))
    got["slices"] = sorted(r.slices or [])
    return got


@pytest.mark.parametrize("name", sorted(golden_programs()))
def test_the_reference_gives_the_fast_planners_figures_on_the_golden_programs(name: str) -> None:
    m, cluster, dmap, batch = golden_programs()[name]
    assert _untraced(m, cluster, dmap, batch, "reference") == _untraced(m, cluster, dmap, batch, "fast")
    fast = simulate(m, cluster, dmap, batch=batch, trace=True)
    ref = simulate(m, cluster, dmap, batch=batch, trace=True, planner="reference")
    assert _traced(ref) == _traced(fast)


@pytest.mark.parametrize("path", sorted(FAST_PATHS))
def test_each_fast_path_gives_the_references_figures(path: str) -> None:
    """Each ``PlanOptions`` fast path on its own (``test_fast_paths.FAST_PATHS``), untraced."""
    for name, (m, cluster, dmap) in fast_path_programs().items():
        want = _untraced(m, cluster, dmap, None, "reference")
        assert run(m, cluster, dmap, FAST_PATHS[path], False) == want, name


ZOO_STRATEGIES = [  # (model, strategy, cluster, global batch): every kind of parallelism
    ("gpt", "d4", "p3.8xlarge:1", 8),
    ("gpt", "d2.t2.sp", "p3.8xlarge:1", 8),
    ("gpt", "d1.t2.p2.k4.1f1b", "p3.8xlarge:1", 8),
    ("gpt", "d1.t1.p2.k4.interleaved.v2", "p3.8xlarge:1", 8),
    ("gpt", "d2.t1.p2.k4.zb1", "p3.8xlarge:1", 16),
    ("gpt", "d4.z1", "p3.8xlarge:1", 8),
    ("gpt", "d4.z2", "p3.8xlarge:1", 8),
    ("gpt", "d2.t2.z3", "p3.8xlarge:1", 8),
    ("gpt", "d1.t2.p2.k2.1f1b.rfull", "p3.8xlarge:1", 8),
    ("gpt", "d2.t2.sp.p2.k2.z3.1f1b.rsel", "p3.8xlarge:2", 8),
    ("llama", "d1.t2.sp.p2.k2.1f1b", "p3.8xlarge:1", 8),
    ("llama", "d2.t2.z2.rsel", "p3.8xlarge:1", 8),
    ("llama", "d1.t1.p2.k4.interleaved.v2.rfull", "p3.8xlarge:1", 8),
    ("mlp", "d4", "p3.8xlarge:1", 8),
    ("mlp", "d2.t2.z3", "p3.8xlarge:1", 8),
    ("mlp", "d1.t1.p2.k2.1f1b", "p3.8xlarge:1", 8),
]
MODELS = {
    "gpt": "gpt:layers=4,hidden=64,heads=4,seq=16,vocab=128",
    "llama": "llama:layers=4,hidden=64,heads=4,kv_heads=2,seq=16,vocab=128",
    "mlp": "mlp:layers=4,hidden=64",
}


@pytest.mark.parametrize(("model", "strategy", "cluster", "batch"), ZOO_STRATEGIES)
def test_the_reference_gives_the_fast_planners_figures_on_distributed_zoo_models(
    model: str, strategy: str, cluster: str, batch: int
) -> None:
    s = parse_strategy(strategy)
    prog = distribute(build_model(MODELS[model], batch), s, Optimizer("adam"), comm_streams=True)
    cl, dmap = parse_cluster(cluster), device_map(s, True)
    assert _untraced(prog, cl, dmap, batch, "reference") == _untraced(prog, cl, dmap, batch, "fast")


@pytest.mark.parametrize("strategy", ["d1.t4.sp", "d1.t2.sp.p2.k4.1f1b", "d2.t2.sp.p2.k2.z1.1f1b.rsel"])
def test_the_reference_gives_the_fast_planners_figures_with_tp_comm_overlap(strategy: str) -> None:
    """Tensor-parallel collectives pipelined with their GEMMs (``distir.sim.overlap``)."""
    s = parse_strategy(strategy)
    prog = distribute(build_model(MODELS["gpt"], 8), s, Optimizer("adam"), comm_streams=True)
    cl, dmap = parse_cluster("p3.8xlarge:2"), device_map(s, True)
    cost = RooflineCostModel(cl, tp_comm_overlap=True)
    ref = figures(simulate(prog, cl, dmap, cost, batch=8, planner="reference"))
    assert ref == figures(simulate(prog, cl, dmap, cost, batch=8))
    assert ref != figures(simulate(prog, cl, dmap, RooflineCostModel(cl), batch=8))  # it overlaps


@pytest.mark.parametrize("name", ["bench.layered", "zoo.gpt.d1.t2.p2.k2.1f1b", "zoo.llama.d1.t2.p3.k3.1f1b"])
def test_the_references_peak_is_the_inlined_programs(name: str) -> None:
    """Calls change no memory figure: the reference on a program with calls gives the fast
    planner's peak on the inlined program (no call summary there)."""
    m, cluster, dmap, batch = golden_programs()[name]
    flat = Module((inline_calls(m),))
    ref = simulate(m, cluster, dmap, batch=batch, planner="reference")
    assert ref.peak_memory == simulate(flat, cluster, dmap, batch=batch).peak_memory


SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
)
EVERY_PATTERN = Feats()  # every call pattern
KEYS = ("step_time_s", "busy_s", "comm_s", "peak_memory", "param_memory", "flops", "n_ops")


def _same(a: SimResult, b: SimResult) -> None:
    for key in KEYS:
        assert getattr(a, key) == getattr(b, key), key


@SETTINGS
@given(programs(EVERY_PATTERN), st.sampled_from(DEVICE_MAPS))
def test_the_reference_equals_the_fast_planner_and_the_oracle_on_random_programs(
    m: Module, dm: DeviceMap | None
) -> None:
    """Unit costs (exact floats): the reference == the fast planner == the naive oracle of the
    inlined program."""
    m = distir.check(m)
    cluster, cost = tiny_cluster(gpus=8), UnitCost()
    ref = simulate(m, cluster, dm, cost_model=cost, planner="reference")
    _same(ref, simulate(m, cluster, dm, cost_model=cost))
    flat = Module((inline_calls(m),))
    if dm is None:
        dm = DeviceMap({d: ref.slots[i] for i, ds in enumerate(ref.slot_devices) for d in ds})
    want = oracle(flat, dm, cost)
    assert (ref.step_time_s, ref.busy_s, ref.comm_s, ref.n_ops) == (
        want.step_time_s,
        want.busy_s,
        want.comm_s,
        want.n_ops,
    )
    if not has_multi_result_gpu(flat, dm):
        assert {g: b for g, b in ref.peak_memory.items()} == want.peak_memory


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(programs(EVERY_PATTERN), st.sampled_from(DEVICE_MAPS))
def test_the_reference_equals_the_fast_planner_bit_for_bit_with_roofline_costs(
    m: Module, dm: DeviceMap | None
) -> None:
    """The roofline model's float costs on two nodes: the planners group sums alike (a call's
    body from zero), so even the float figures and the traced slices are identical."""
    m = distir.check(m)
    ref = simulate(m, MULTI_NODE, dm, trace=True, planner="reference")
    fast = simulate(m, MULTI_NODE, dm, trace=True)
    _same(ref, fast)
    assert sorted(ref.slices or []) == sorted(fast.slices or [])


def test_the_reference_reports_a_wrong_program_naming_the_op() -> None:
    m = parse_module("""func @m(%x: Tensor[f32, (4,), d0], %y: Tensor[f32, (5,), d0]) {
  %z = Add(%x, %y)
  return %z
}""")
    with pytest.raises(InterpretError, match="Add"):
        simulate(m, tiny_cluster(), planner="reference")


def test_simulate_names_the_planners() -> None:
    m = parse_module("func @m(%x: Tensor[f32, (4,), d0]) {\n  return %x\n}")
    with pytest.raises(ValueError, match="planner must be one of fast, reference"):
        simulate(m, tiny_cluster(), planner="slow")


def test_the_cli_planner_option() -> None:
    """``distir simulate --planner reference`` prints the default planner's figures; an unknown
    planner, or a trace with the reference, is one line and exit 2."""
    ex = str(Path(distir.__file__).parent / "examples" / "fig2_mlp_pipeline.distir")
    got = {}
    for planner in ("fast", "reference"):
        r = CliRunner().invoke(app, ["simulate", ex, "--planner", planner, "--json"])
        assert r.exit_code == 0, r.stderr
        d = json.loads(r.stdout)
        got[planner] = {k: d[k] for k in ("step_time_s", "peak_memory_bytes", "flops", "ops", "devices")}
    assert got["fast"] == got["reference"]
    bad = CliRunner().invoke(app, ["simulate", ex, "--planner", "slow"])
    assert bad.exit_code == 2 and "--planner must be fast or reference" in bad.stderr
    traced = CliRunner().invoke(app, ["simulate", ex, "--planner", "reference", "--trace", "/tmp/never.json"])
    assert traced.exit_code == 2 and "--trace needs the fast planner" in traced.stderr
