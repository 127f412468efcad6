"""Memos and shortcuts of ``distribute`` and ``simulate`` against the same work done afresh.

Each memo below is keyed on everything its answer depends on; replaced by a memo that never
remembers (``Forgetful``), the same programs must come out byte for byte (``print_module``) and
simulate to bit-identical results (``repr`` of every field):

- ``distir.ops.dtensor_inference.infer_distributed``'s answers apart from the mesh's devices (``_DIST``; a
  ``device`` attribute puts the mesh's first device in the key);
- ``distir.ops.infer_memo.abstract_types``' result types per (op, attributes, argument types)
  (``_INFERRED``);
- ``spmd.local_record``'s mesh-free part (``Units.local_shapes``);
- ``layer_sharder``'s sharded functions, weight-gradient splits and forward result types, kept across
  sharders (``_SHARDS``, ``_SPLITS``, ``_OUT_TYPES``), and its layers alike (``_alike``);
- ``analysis.merge`` / ``time_order`` (by action numbers) against a plain implementation.

Also: a planning domain holds no reference cycle (the cyclic collector never has to find it).
"""

from __future__ import annotations

import functools
import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from distir.autodiff.train import Optimizer
from distir.frontends.zoo.model import Model
from distir.frontends.zoo.registry import build_model
from distir.hardware.cluster import parse_cluster
from distir.interp.shapes import entry_args
from distir.ir.dtensor import DTensorType, Mesh, Replicate, Shard
from distir.ir.printer import print_module
from distir.ir.types import Device, DType
from distir.ir.values import Attrs
from distir.ops import dtensor_inference, infer_memo
from distir.ops.registry import REGISTRY, OpTypeError
from distir.parallel import layer_sharder
from distir.parallel.distribute import device_map, distribute
from distir.parallel.pipeline import analysis
from distir.parallel.pipeline.schedules import Action, build_schedule
from distir.parallel.strategy import parse_strategy
from distir.sim import units
from distir.sim.cost import RooflineCostModel
from distir.sim.plan import PlanDomain, PlanOptions
from distir.sim.simulate import SimResult, simulate

FIELDS = ("step_time_s", "busy_s", "comm_s", "peak_memory", "param_memory", "flops", "n_ops", "peak_flops")
GPT = "gpt:layers=4,hidden=64,heads=4,seq=16,vocab=128"
CASES = [  # (model, strategy, cluster, batch)
    (GPT, "d2.t1.p2.k4.zb1", "g4dn.12xlarge:2", 16),
    (GPT, "d1.t2.p2.k2.1f1b", "g4dn.12xlarge:2", 8),
    (GPT, "d2.t2.sp.p2.k2.z3.1f1b", "g4dn.12xlarge:2", 8),
    ("llama:layers=3,hidden=64,heads=4,kv_heads=2,seq=16,vocab=128", "d1.t2.p3.k3.1f1b", "p3.8xlarge:2", 6),
    ("transgan-hetero:wide_layers=2,narrow_layers=2", "d1.t1.p4.k4.zb1.L0-2-1-2", "p3.8xlarge:1", 8),
]


class Forgetful(dict[Any, Any]):
    """A memo that never remembers: every lookup misses."""

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


@contextmanager
def forgetting() -> Iterator[None]:
    """Every memo under test forgets (module docstring)."""
    saved = (dtensor_inference._DIST, layer_sharder._SHARDS, layer_sharder._SPLITS, layer_sharder._OUT_TYPES)
    saved_types = infer_memo._INFERRED
    init_units, init_sharder = units.Units.__init__, layer_sharder.LayerSharder.__init__

    def units_init(self: units.Units, *a: Any) -> None:
        init_units(self, *a)
        self.local_shapes = Forgetful()

    def sharder_init(self: layer_sharder.LayerSharder, *a: Any) -> None:
        init_sharder(self, *a)
        self._alike = Forgetful()

    dtensor_inference._DIST = Forgetful()
    infer_memo._INFERRED = Forgetful()
    layer_sharder._SHARDS, layer_sharder._SPLITS, layer_sharder._OUT_TYPES = (
        Forgetful(),
        Forgetful(),
        Forgetful(),
    )
    units.Units.__init__ = units_init  # type: ignore[method-assign]
    layer_sharder.LayerSharder.__init__ = sharder_init  # type: ignore[method-assign]
    try:
        yield
    finally:
        dtensor_inference._DIST, layer_sharder._SHARDS, layer_sharder._SPLITS, layer_sharder._OUT_TYPES = (
            saved
        )
        infer_memo._INFERRED = saved_types
        units.Units.__init__ = init_units  # type: ignore[method-assign]
        layer_sharder.LayerSharder.__init__ = init_sharder  # type: ignore[method-assign]


@functools.cache
def _model(model: str, batch: int) -> Model:
    """One model object per string, as the search's exact evaluations share it."""
    return build_model(model, batch)


def _evaluate(model: str, strategy: str, cluster: str, batch: int) -> tuple[str, SimResult]:
    s = parse_strategy(strategy)
    prog = distribute(_model(model, batch), s, Optimizer("adam"), comm_streams=True)
    return print_module(prog), simulate(prog, parse_cluster(cluster), device_map(s, True), batch=batch)


@pytest.mark.slow
def test_memos_change_no_program_and_no_result() -> None:
    # with the memos: each case after the others (warm), and each again (its own answers)
    warm = [_evaluate(*case) for case in CASES]
    again = [_evaluate(*case) for case in CASES]
    with forgetting():
        fresh = [_evaluate(*case) for case in CASES]
    for (text, r), (text2, r2), (text3, r3) in zip(warm, again, fresh, strict=True):
        assert text == text2 == text3
        for f in FIELDS:
            assert repr(getattr(r, f)) == repr(getattr(r2, f)) == repr(getattr(r3, f)), f


def test_the_memos_are_used() -> None:
    """The comparison above is not vacuous: each memo answers some question."""
    hits = {"dist": 0, "shapes": 0, "shards": 0, "types": 0}
    get_dist, get_shard = dtensor_inference._DIST.get, layer_sharder._SHARDS.get

    class Counting(dict[Any, Any]):
        def __init__(self, name: str, base: dict[Any, Any]) -> None:
            super().__init__(base)
            self.name = name

        def get(self, key: Any, default: Any = None) -> Any:
            got = super().get(key, default)
            hits[self.name] += got is not None
            return got

    init_units = units.Units.__init__

    def units_init(self: units.Units, *a: Any) -> None:
        init_units(self, *a)
        self.local_shapes = Counting("shapes", {})

    dtensor_inference._DIST, layer_sharder._SHARDS = Counting("dist", {}), Counting("shards", {})
    saved_types, infer_memo._INFERRED = infer_memo._INFERRED, Counting("types", {})
    units.Units.__init__ = units_init  # type: ignore[method-assign]
    try:
        for case in (*CASES, CASES[0]):
            _evaluate(*case)
    finally:
        dtensor_inference._DIST, layer_sharder._SHARDS = (
            dict(dtensor_inference._DIST),
            dict(layer_sharder._SHARDS),
        )
        infer_memo._INFERRED = saved_types
        units.Units.__init__ = init_units  # type: ignore[method-assign]
    assert all(hits.values()), hits
    del get_dist, get_shard


def _mesh(first: int) -> Mesh:
    return Mesh((("x", 2),), (Device(first), Device(first + 1)))


def test_a_device_attribute_keeps_the_check_against_the_meshs_first_device() -> None:
    """The memo of DTensor inference leaves the mesh's devices out of its key, but for an op
    with a ``device`` attribute, which the global view checks against the mesh's first device."""
    relu = REGISTRY["Relu"]
    attrs = Attrs({"device": Device(0)})

    def on(mesh: Mesh) -> DTensorType:
        return DTensorType(DType.f32, (4, 4), mesh, (Shard(0),))

    out = relu.infer_types([on(_mesh(0))], attrs, [None])
    assert out == (on(_mesh(0)),)
    with pytest.raises(OpTypeError, match="device=d0 but its inputs are on d2"):
        relu.infer_types([on(_mesh(2))], attrs, [None])
    # without the attribute the answer carries over to the other mesh, placements and all
    rep = DTensorType(DType.f32, (4, 4), _mesh(2), (Replicate(),))
    assert relu.infer_types([rep], Attrs(), [None]) == (rep,)


# -- schedules ---------------------------------------------------------------------------------
def _merge_plain(per_rank: list[list[Action]], p: int, v: int) -> list[tuple[int, Action]]:
    """``merge`` as first written: rounds over the ranks, dependencies as actions."""
    done: set[Action] = set()
    pcs = [0] * p
    order: list[tuple[int, Action]] = []
    remaining = sum(len(a) for a in per_rank)
    while remaining:
        ran = []
        for r in range(p):
            if pcs[r] < len(per_rank[r]):
                a = per_rank[r][pcs[r]]
                if all(d in done for d in analysis.dependencies(a, p, v)):
                    ran.append((r, a))
                    pcs[r] += 1
        assert ran
        done.update(a for _, a in ran)
        order.extend(ran)
        remaining -= len(ran)
    return order


SCHEDULES = [
    (name, p, k, v)
    for name, vs in (("gpipe", (1,)), ("1f1b", (1,)), ("zb1", (1,)), ("interleaved", (2, 3)))
    for p in (1, 2, 3, 4)
    for k in (1, 2, 5, 8)
    for v in vs
    if name != "interleaved" or k % p == 0
]


@pytest.mark.parametrize(("name", "p", "k", "v"), SCHEDULES)
def test_merge_and_time_order_as_first_written(name: str, p: int, k: int, v: int) -> None:
    per_rank = build_schedule(name, p, k, v)
    order = _merge_plain(per_rank, p, v)
    assert analysis.merge(per_rank, p, v) == order

    def duration(r: int, a: Action) -> float:
        return (1.0 + a.stage % 3) * {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}[a.kind]

    end: dict[Action, float] = {}
    free = [0.0] * p
    timed = []
    for i, (r, a) in enumerate(order):
        start = max([free[r], *(end[d] for d in analysis.dependencies(a, p, v))])
        end[a] = free[r] = start + duration(r, a)
        timed.append((start, i, analysis.TimedAction(r, a, start, end[a])))
    timed.sort(key=lambda x: (x[0], x[1]))
    assert analysis.time_order(per_rank, p, v, duration) == [t for *_, t in timed]


@pytest.mark.parametrize(
    ("per_rank", "p", "message"),
    [
        (
            [[], [Action(1, 0, "F")]],
            2,
            "depends on 0F0, which no rank runs (at rank 1, index 0, token '1F0')",
        ),
        (
            [[Action(0, 0, "F"), Action(0, 0, "F")]],
            1,
            "duplicate action, first at index 0 (at rank 0, index 1, token '0F0')",
        ),
        (
            [[Action(0, 0, "B"), Action(0, 0, "F")]],
            1,
            "deadlock: no rank can run its next action: rank 0 index 0 0B0 waits for 0F0 "
            "(at rank 0, index 0, token '0B0')",
        ),
    ],
)
def test_schedule_errors_are_unchanged(per_rank: list[list[Action]], p: int, message: str) -> None:
    with pytest.raises(analysis.ScheduleError) as got:
        analysis.merge(per_rank, p, 1)
    assert str(got.value) == message


# -- reference cycles --------------------------------------------------------------------------
def test_a_planning_domain_dies_with_its_last_reference() -> None:
    """No reference cycle: freed at once by reference counting, with all its plans and memos
    (the cyclic collector is off here, so only reference counting can free it)."""
    s = parse_strategy("d1.t1.p2.k2.1f1b")
    prog = distribute(build_model(GPT, 4), s, comm_streams=True)
    cl = parse_cluster("g4dn.12xlarge:1")
    was = gc.isenabled()
    gc.disable()
    try:
        dom = PlanDomain(prog, device_map(s, True), RooflineCostModel(cl), PlanOptions(relabel=True))
        dom.plan(prog.entry, entry_args(prog.entry))
        alive = weakref.ref(dom)
        del dom
        assert alive() is None
    finally:
        if was:
            gc.enable()
