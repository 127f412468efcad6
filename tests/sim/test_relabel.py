"""The simulator's shortcuts for DTensor programs against planning everything the long way.

``simulate`` plans a DTensor program with units assumed from the entry's types (``Units.assume``,
checked after planning, else planned again after ``Units.prepare``'s pass) and carries a callee's
summary from one mesh to another alike (``distir.sim.relabel``). The reference here plans with
``Units.prepare`` and ``relabel=False``: every call planned on its own mesh. Contract: every field
of the result is bit-identical (compared by ``repr``), traced or not; and the shortcuts are taken
where they apply (counted), refused where they would not be exact (a collective over GPUs linked
otherwise, unevenly sharded types met while planning).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import distir
from distir.autodiff.train import Optimizer
from distir.frontends.zoo.registry import build_model
from distir.hardware.cluster import Cluster, parse_cluster
from distir.hardware.specs import DeviceSpec, LinkSpec, NodeSpec
from distir.interp.shapes import entry_args
from distir.ir import Device, DTensorType, DType, Module, parse_module
from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import Mesh, Shard
from distir.ops.dist import format_mesh_attr
from distir.ops.registry import REGISTRY
from distir.parallel.distribute import device_map, distribute
from distir.parallel.sharding.legalize import legalize
from distir.parallel.sharding.propagate import propagate
from distir.parallel.sharding.shard_function import strip_types
from distir.parallel.strategy import parse_strategy
from distir.sim import relabel, units
from distir.sim.cost import RooflineCostModel
from distir.sim.devices import DeviceMap, Slot
from distir.sim.plan import PlanDomain, PlanOptions
from distir.sim.simulate import SimResult, _run, simulate
from parallel.gen import annotations, meshes, mlp_programs, places_text

FIELDS = (
    "step_time_s",
    "slots",
    "slot_devices",
    "busy_s",
    "comm_s",
    "peak_memory",
    "param_memory",
    "capacity",
    "flops",
    "n_ops",
    "peak_flops",
    "slices",
    "memory_timeline",
)

GPT = "gpt:layers=4,hidden=64,heads=4,seq=16,vocab=128"
GPT8 = "gpt:layers=8,hidden=64,heads=4,seq=16,vocab=128"


def reference(m: Module, cluster: Cluster, dmap: DeviceMap, *, trace: bool = False, **kw: Any) -> SimResult:
    """The long way: units from ``Units.prepare``'s pass, every call planned on its own mesh."""
    cost = kw.get("cost_model") or RooflineCostModel(cluster)
    dom = PlanDomain(
        m, dmap, cost, PlanOptions(entry_param_uses=False, entry_memory_columns=not trace, relabel=False)
    )
    plan = dom.plan(m.entry, entry_args(m.entry))
    assert dom.units.relabels == 0
    return _run(plan, dom, cluster, dmap, trace, kw.get("batch"))


def assert_same(a: SimResult, b: SimResult) -> None:
    for f in FIELDS:
        assert repr(getattr(a, f)) == repr(getattr(b, f)), f


@contextmanager
def counted() -> Iterator[dict[str, int]]:
    """Counts of the shortcuts ``simulate`` takes: calls carried, carrying refused for a callee
    seen before, assumed units confirmed and not."""
    counts = {"carried": 0, "refused": 0, "confirmed": 0, "replanned": 0}
    carried, confirm = relabel.Relabeler.carried, units.Units.confirm

    def counting_carried(self: relabel.Relabeler, callee: Any, key: Any, mesh: Mesh) -> Any:
        got = carried(self, callee, key, mesh)
        if got is not None:
            counts["carried"] += 1
        elif self._seen.get(key) is not None:
            counts["refused"] += 1
        return got

    def counting_confirm(self: units.Units) -> bool:
        ok = confirm(self)
        counts["confirmed" if ok else "replanned"] += self._assumed
        return ok

    relabel.Relabeler.carried = counting_carried  # type: ignore[method-assign]
    units.Units.confirm = counting_confirm  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        relabel.Relabeler.carried = carried  # type: ignore[method-assign]
        units.Units.confirm = confirm  # type: ignore[method-assign]


# (model, strategy, cluster, batch, precision): pipelines of one to four stages, tensor and
# sequence parallelism, ZeRO, interleaving, zero-bubble, mixed precision, GPUs of two kinds,
# stages whose tensor-parallel groups span nodes or not (``@``), and unevenly sharded activations
ZOO = [
    (GPT, "d2.t1.p2.k4.zb1", "g4dn.12xlarge:2", 16, "pure"),
    (GPT, "d1.t2.p2.k2.1f1b", "g4dn.12xlarge:2", 8, "pure"),
    (GPT, "d1.t1.p4.k8.1f1b", "g4dn.12xlarge:2", 16, "pure"),
    (GPT8, "d1.t1.p4.k8.interleaved.v2.z1", "p3.8xlarge:1+g4dn.12xlarge:1", 16, "pure"),
    (GPT, "d2.t2.p2.k2.z3.1f1b", "g4dn.12xlarge:2", 8, "pure"),
    (GPT, "d2.t2.sp.p2.k2.1f1b", "g4dn.12xlarge:2", 8, "mixed"),
    (GPT, "d2.t2.p2.k2.1f1b.@0-4-1-5-2-3-6-7", "g4dn.12xlarge:2", 8, "pure"),
    (GPT, "d1.t1.p2.k2.zb1", "p3.8xlarge:1+g4dn.12xlarge:1", 8, "pure"),
    ("gpt:layers=4,hidden=60,heads=3,seq=15,vocab=128", "d1.t2.p2.k2.1f1b", "g4dn.12xlarge:2", 8, "pure"),
    ("transgan-hetero:wide_layers=2,narrow_layers=2", "d2.t1.p4.k4.zb1", "p3.8xlarge:2", 16, "pure"),
]


@pytest.mark.parametrize(("model", "strategy", "cluster", "batch", "precision"), ZOO)
def test_zoo_programs_simulate_as_the_long_way(
    model: str, strategy: str, cluster: str, batch: int, precision: str
) -> None:
    s = parse_strategy(strategy)
    m = build_model(model, batch, DType.bf16 if precision == "mixed" else DType.f32)
    prog = distribute(m, s, Optimizer("adam"), comm_streams=True, precision=precision)
    cl, dmap = parse_cluster(cluster), device_map(s, True)
    with counted() as n:
        fast = simulate(prog, cl, dmap, batch=batch)
    assert n["confirmed"] + n["replanned"] == 1
    assert_same(fast, reference(prog, cl, dmap, batch=batch))
    if "@" in strategy:  # stage 0's tensor-parallel groups span the nodes, stage 1's do not
        assert n["refused"] > 0 and n["carried"] == 0
    elif "seq=15" in model:  # unevenly sharded inside the layers, not in the entry
        assert n["replanned"] == 1
    elif s.p > 1:  # the stages share their layer functions
        assert n["carried"] > 0 and n["confirmed"] == 1


def test_traced_runs_match_the_long_way() -> None:
    s = parse_strategy("d2.t1.p2.k4.zb1")
    prog = distribute(build_model(GPT, 16), s, comm_streams=True)
    cl, dmap = parse_cluster("g4dn.12xlarge:2"), device_map(s, True)
    with counted() as n:
        fast = simulate(prog, cl, dmap, trace=True, batch=16)
    assert n["carried"] > 0
    slow = reference(prog, cl, dmap, trace=True, batch=16)
    assert fast.slices and {name for name, *_ in fast.slices} == {name for name, *_ in slow.slices or ()}
    assert_same(fast, slow)


def test_errors_are_reported_as_without_the_shortcuts() -> None:
    """Planning under assumed units fails quietly and plans again the long way, which reports
    the program's error precisely."""
    s = parse_strategy("d1.t1.p2.k2.1f1b")
    prog = distribute(build_model(GPT, 4), s, comm_streams=True)
    cl = parse_cluster("g4dn.12xlarge:1")
    dmap = device_map(s, True)
    partial = DeviceMap({d: slot for d, slot in dmap.mapping.items() if d.id != 1})  # stage 1 unmapped
    with pytest.raises(Exception, match="device d1 is not mapped onto the cluster") as fast:
        simulate(prog, cl, partial)
    with pytest.raises(Exception, match="device d1 is not mapped onto the cluster") as slow:
        reference(prog, cl, partial)
    assert str(fast.value) == str(slow.value)


# -- generated pipelines -----------------------------------------------------------------------
def _two_nodes(gpus_per_node: int = 2) -> Cluster:
    """Two nodes of a fast intra-node link and a slow network: groups spanning nodes take longer."""
    dev = DeviceSpec("gen", 1e12, 2e12, 4e12, 4e12, 1e11, 1 << 30, 1e-6)
    node = NodeSpec("gennode", dev, gpus_per_node, LinkSpec(1e10, 1e-6), LinkSpec(1e9, 1e-5))
    return Cluster("gen", (node, node))


@st.composite
def pipelines(draw: st.DrawFn) -> tuple[Module, DeviceMap]:
    """A random sharded MLP as a layer function, called on every stage's mesh (two or three
    stages, each its own devices) from a chunk function (the layer twice) or directly, its
    first result sent on to the next stage; mapped onto two nodes in a random order."""
    text, params = draw(mlp_programs(dtype="f32").filter(lambda tp: "Constant" not in tp[0]))
    mesh0 = draw(meshes)
    ann = draw(annotations(params, mesh0))
    layer_mod = distir.check(
        legalize(propagate(parse_module(text), mesh0, {k: places_text(v) for k, v in ann.items()}).module)
    )
    typed = layer_mod.entry
    layer = strip_types(typed, "layer")
    n = len(mesh0.devices)
    stages = draw(st.integers(2, 3))
    nested = draw(st.booleans())
    fb_chunk = FunctionBuilder("chunk", REGISTRY.out_arity)
    cps = [fb_chunk.param(p.name) for p in layer.params]
    first = fb_chunk.call(layer, *cps)
    second = fb_chunk.call(layer, *cps)
    chunk = fb_chunk.ret(*first, *second)
    fb = FunctionBuilder("main", REGISTRY.out_arity)
    outs = []
    sent = None
    for st_i in range(stages):
        mesh = Mesh(mesh0.axes, tuple(Device(st_i * n + i) for i in range(n)))
        args = []
        for p in typed.params:
            t = p.type
            assert isinstance(t, DTensorType)
            args.append(fb.param(f"{p.name}_{st_i}", DTensorType(t.dtype, t.shape, mesh, t.placements)))
        got = fb.call(chunk, *args) if nested else fb.call(layer, *args)
        if sent is not None:
            outs.append(fb.op("MeshSend", sent, mesh=format_mesh_attr(mesh))[0])
        sent = got[0]
        outs.extend(got)
    m = distir.check(Module((layer, chunk, fb.ret(*outs))))
    gpus = draw(st.permutations(range(stages * n)))
    dmap = DeviceMap({Device(i): Slot(g) for i, g in enumerate(gpus)})
    return m, dmap


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(pipelines())
def test_generated_pipelines_simulate_as_the_long_way(case: tuple[Module, DeviceMap]) -> None:
    m, dmap = case
    n_gpus = max(s.gpu for s in dmap.slots) + 1
    cluster = _two_nodes((n_gpus + 1) // 2)
    assert_same(simulate(m, cluster, dmap), reference(m, cluster, dmap))


def test_a_declared_type_is_checked_on_every_mesh() -> None:
    """A callee whose body declares a type (on the first mesh) is not carried to another mesh:
    there the declaration does not hold, and that is reported as without carrying."""
    mesh0, mesh1 = (Mesh((("x", 2),), (Device(i), Device(i + 1))) for i in (0, 2))

    def on(mesh: Mesh) -> DTensorType:
        return DTensorType(DType.f32, (4, 4), mesh, (Shard(0),))

    fb = FunctionBuilder("layer", REGISTRY.out_arity)
    (y,) = fb.op("Relu", fb.param("x"), types=[on(mesh0)])
    layer = fb.ret(y)
    fb = FunctionBuilder("main", REGISTRY.out_arity)
    (a,) = fb.call(layer, fb.param("a", on(mesh0)))
    (b,) = fb.call(layer, fb.param("b", on(mesh1)))
    m = Module((layer, fb.ret(a, b)))
    cl = _two_nodes()
    dmap = DeviceMap({Device(i): Slot(i) for i in range(4)})
    with pytest.raises(Exception, match="is declared") as fast:
        simulate(m, cl, dmap)
    with pytest.raises(Exception, match="is declared") as slow:
        reference(m, cl, dmap)
    assert str(fast.value) == str(slow.value)
