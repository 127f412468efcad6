"""The memos of grouping devices into units: ``Units.met_groups`` (kept up to date as types are
met) gives ``device_groups`` of every type met, and ``uniform_shape`` (memoized per type) gives
``even_shape``."""

from __future__ import annotations

from collections.abc import Sequence

from distir.frontends.zoo.registry import parse_model_string
from distir.hardware.cluster import parse_cluster
from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import DTensorType, Mesh, Partial, Replicate, Shard, axis_size
from distir.ir.function import Module
from distir.ir.types import Device, DType, TensorType, Type
from distir.ops.registry import REGISTRY
from distir.parallel.distribute import sharded_layers
from distir.sim.cost import RooflineCostModel
from distir.sim.devices import DeviceMap, Slot
from distir.sim.grouping import device_groups
from distir.sim.layout import even_shape, uniform_shape
from distir.sim.units import Units

# a vocabulary of 129 shards unevenly over two devices (the head's and loss's types)
GPT = "gpt:layers=2,hidden=64,heads=4,seq=16,vocab=129"


def _types(mesh: Mesh) -> list[DTensorType]:
    """Even, uneven (129 rows over 2), shared-axis and replicated types on ``mesh``."""
    n = mesh.shape[-1]
    lead = (Replicate(),) * (len(mesh.axes) - 1)
    return [
        DTensorType(DType.f32, (8, 64), mesh, (*lead, Shard(1))),
        DTensorType(DType.f32, (129, 64), mesh, (*lead, Shard(0))),
        DTensorType(DType.bf16, (4 * n, 3), mesh, (*lead, Partial())),
        DTensorType(DType.f32, (5,), mesh, (*lead, Replicate())),
    ]


def test_uniform_shape_is_even_shape_for_every_type_and_every_asking() -> None:
    """The memo answers what the computation answers, for the same object asked again, for an
    equal but distinct object, and on meshes with uneven shares."""
    meshes = [
        Mesh((("tp", 2),), (Device(0), Device(1))),
        Mesh((("dp", 2), ("tp", 2)), tuple(Device(i) for i in range(4))),
        Mesh((("dp", axis_size(2, (3, 1))),), (Device(0), Device(1))),
    ]
    for mesh in meshes:
        for t in _types(mesh):
            twin = DTensorType(t.dtype, t.shape, t.mesh, t.placements)
            for asked in (t, t, twin):
                assert uniform_shape(asked) == even_shape(asked)
    assert even_shape(_types(meshes[0])[1]) is None  # 129 rows over 2: uneven
    assert uniform_shape(_types(meshes[2])[0]) is None  # sharded by shares 3:1
    assert uniform_shape(_types(meshes[2])[3]) == (5,)  # replicated over them


def test_met_groups_are_the_groups_of_every_type_met_so_far() -> None:
    """After ``assume``, each ``met_groups`` (which adds only what was met since the last) equals
    ``device_groups`` of all the types and devices met, as a set, whatever the order met."""
    cluster = parse_cluster("p3.8xlarge:1+g4dn.12xlarge:1")
    dmap = DeviceMap({Device(i): Slot(g) for i, g in enumerate([2, 3, 4, 5])})
    units = Units(dmap, RooflineCostModel(cluster))
    layer = sharded_layers(parse_model_string(GPT).build(2), 2, 2)[-1]  # the loss: uneven vocab
    mesh = next(t.mesh for t in layer.fwd_args if isinstance(t, DTensorType))
    module = _entry_of(layer.fwd_args)
    units.assume(module, module.entry, list(layer.fwd_args))
    later = [*_types(mesh), *layer.bwd_args, TensorType(DType.f32, (3,), Device(2))]
    for t in later:
        units.note(t)
        groups = device_groups(
            units._seen_dtensors,
            units._seen_devices,
            units._slot_of,
            units._slot_classes(),
            units._attr_meshes,
        )
        assert set(units.met_groups()) == set(groups)
    assert units.uneven


def _entry_of(args: Sequence[Type]) -> Module:
    """A module whose entry takes ``args`` and returns the first."""
    fb = FunctionBuilder("entry", REGISTRY.out_arity)
    params = [fb.param(f"a{i}", t) for i, t in enumerate(args)]
    return Module((fb.ret(params[0]),))


def test_an_uneven_gradient_sent_to_its_reduction_stream_is_assumed() -> None:
    """A pipeline with data and tensor parallelism over an uneven vocabulary sends the embedding's
    and head's gradients to their GPUs' reduction stream: ``assume`` guesses their groups there
    (``sent_groups``), so planning is confirmed the first time, and the figures are those of the
    units ``prepare`` makes and of the reference planner, traced and untraced."""
    from distir.autodiff.train import Optimizer
    from distir.frontends.zoo.registry import build_model
    from distir.interp.shapes import entry_args
    from distir.parallel.distribute import device_map, distribute
    from distir.parallel.strategy import parse_strategy
    from distir.sim.plan import REFERENCE, PlanDomain, PlanOptions
    from distir.sim.simulate import _run
    from sim.test_figures_unchanged import figures

    s = parse_strategy("d2.t2.p2.k2.1f1b")
    prog = distribute(build_model(GPT, 8), s, Optimizer("adam"), comm_streams=True)
    cluster, dmap = parse_cluster("p3.8xlarge:2"), device_map(s, True)
    got: dict[tuple[str, bool], object] = {}
    assumed = PlanOptions(entry_param_uses=False, assume_units=True)
    for name, options in (("assume", assumed), ("ref", REFERENCE)):
        for trace in (False, True):
            dom = PlanDomain(prog, dmap, RooflineCostModel(cluster), options)
            plan = dom.plan(prog.entry, entry_args(prog.entry, None))
            assert dom.units.confirm(), name
            assert dom.units.uneven or name == "ref"
            got[name, trace] = figures(_run(plan, dom, cluster, dmap, trace, None))
    for trace in (False, True):
        assert got["assume", trace] == got["ref", trace]


def test_sent_groups_are_an_uneven_types_groups_on_other_streams_of_its_gpus() -> None:
    """Only meshes of the same axes over the same GPUs in the same order take the groups; an even
    type adds none."""
    from distir.sim.grouping import sent_groups

    mesh = Mesh((("tp", 2),), (Device(0), Device(1)))
    other_stream = Mesh((("tp", 2),), (Device(10), Device(11)))  # the same GPUs, another stream
    other_gpus = Mesh((("tp", 2),), (Device(2), Device(3)))
    swapped = Mesh((("tp", 2),), (Device(11), Device(10)))
    gpu = {0: 0, 1: 1, 10: 0, 11: 1, 2: 2, 3: 3}
    even, uneven = _types(mesh)[0], _types(mesh)[1]
    meshes = [mesh, other_stream, other_gpus, swapped]
    got = sent_groups([uneven], meshes, lambda d: d.id, lambda d: gpu[d.id])
    assert set(got) == {(10,), (11,)}
    assert sent_groups([even], meshes, lambda d: d.id, lambda d: gpu[d.id]) == {}
