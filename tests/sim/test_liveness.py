"""The planner's bulk call-site path (``distir.sim.liveness``) and its shared type memo.

A call summary whose results are each one parameter or one fresh buffer (several results may be
one buffer: ``CallSummary.repeats``) is applied at a call site in bulk (``CallSummary.own_ks``);
the result must be the plan the general per-result path builds. ``PlanDomain`` reuses the op
types ``Units.prepare`` inferred.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from distir.hardware.cluster import parse_cluster
from distir.interp.shapes import Mixed, TypeDomain, entry_args
from distir.ir import Device, DType, FunctionBuilder, Module, Op, TensorType, parse_module
from distir.ir.rewrite import inline_calls
from distir.ops import REGISTRY
from distir.sim import records
from distir.sim.cost import RooflineCostModel
from distir.sim.devices import DeviceMap
from distir.sim.plan import FnPlan, PlanDomain
from distir.sim.simulate import simulate
from parallel.helpers import sharded
from parallel.test_megatron import MLP
from sim.test_spmd import DGX, _tp

T = TensorType(DType.f32, (64, 64), Device(0))


def _module() -> Module:
    """Callees returning fresh buffers, an aliased parameter, a buffer shared by two results and
    a view, a tuple of a buffer and a parameter; an entry passing one value twice, dropping
    results, and letting arguments die."""
    fb = FunctionBuilder("own", REGISTRY.out_arity)
    w, x, y = fb.param("w"), fb.param("x"), fb.param("y")
    (a,) = fb.op("MatMul", x, w)
    (b,) = fb.op("Relu", a)
    (c,) = fb.op("Add", b, y)
    own = fb.ret(b, x, c, a)  # fresh, parameter alias, fresh, fresh
    fb = FunctionBuilder("shared", REGISTRY.out_arity)
    w, x = fb.param("w"), fb.param("x")
    (a,) = fb.op("MatMul", x, w)
    (v,) = fb.op("Identity", a)
    shared = fb.ret(a, a, v, w)  # one buffer for three results (in bulk: ``CallSummary.repeats``)
    fb = FunctionBuilder("tupled", REGISTRY.out_arity)
    w, x = fb.param("w"), fb.param("x")
    (a,) = fb.op("MatMul", x, w)
    (tp,) = fb.op("MakeTuple", a, x)
    tupled = fb.ret(tp, a)  # a result of two roots: the general path
    fb = FunctionBuilder("main", REGISTRY.out_arity)
    w = fb.param("w", T)
    x = fb.param("x", T)
    h = x
    outs = []
    for _ in range(3):  # repeated call sites: the memoized peaks must not leak between them
        r = fb.call(own, w, h, h)  # one value passed twice
        h = r[2]
        s = fb.call(shared, w, r[0])
        (h,) = fb.op("Add", h, s[1])
        t = fb.call(tupled, w, h)
        (h,) = fb.op("Add", h, t[1])
        outs.append(r[3])
    (z,) = fb.op("Send", h, dst=Device(1))
    return Module((own, shared, tupled, fb.ret(z, *outs)))


def _plan(m: Module, general: bool, monkeypatch: pytest.MonkeyPatch) -> FnPlan:
    if general:
        post = records.CallSummary.__post_init__

        def no_bulk(self: records.CallSummary) -> None:
            post(self)
            self.own_ks = None

        monkeypatch.setattr(records.CallSummary, "__post_init__", no_bulk)
    cl = parse_cluster("dgx2-v100")
    dmap = DeviceMap.default({Device(0), Device(1)}, cl.num_devices)
    plan = PlanDomain(m, dmap, RooflineCostModel(cl)).plan(m.entry, entry_args(m.entry))
    monkeypatch.undo()
    return plan


FIELDS = ["devs", "comm", "names", "flops", "mem", "slots", "out_roots", "fresh", "out_types", "param_last"]


def test_bulk_call_sites_build_the_general_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    m = _module()
    bulk, general = _plan(m, False, monkeypatch), _plan(m, True, monkeypatch)
    costs = [c for c in bulk.costs if isinstance(c, records.CallSummary)]
    assert any(c.own_ks is not None and c.aliases for c in costs)  # the bulk path ran, with an alias
    assert any(c.own_ks is not None and c.repeats for c in costs)  # and a buffer two results are
    assert any(c.own_ks is None for c in costs)  # and the general path
    for f in FIELDS:
        assert getattr(bulk, f) == getattr(general, f), f


def test_bulk_call_sites_match_the_inlined_program() -> None:
    m = _module()
    cl = parse_cluster("dgx2-v100")
    unfused = RooflineCostModel(cl, fuse=False)  # fused chains do not cross calls (distir.sim.fusion)
    a, b = simulate(m, cl, cost_model=unfused), simulate(Module((inline_calls(m),)), cl, cost_model=unfused)
    assert a.peak_memory == b.peak_memory
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-12)


def test_last_uses_take_the_largest_over_repeated_and_viewed_arguments() -> None:
    from distir.ir.values import Value
    from distir.sim.liveness import _last_uses

    # read in order of last use: parameters 1, 3, 0
    summary = dataclasses.replace(_plan_summary(), param_last=(3, 1, -1, 2))
    assert summary.read_pos == (1, 3, 0) and summary.read_last == (1, 2, 3)
    r, s, t, v = Value("r"), Value("s"), Value("t"), Value("v")
    # parameters 1 and 0 are one value r; parameter 3 is a view v of two roots s and t
    lu = _last_uses([r, v, r], summary, {v: (s, t)})
    assert (lu[r], lu[s], lu[t]) == (3, 2, 2)
    assert _last_uses([r, s, r], summary, {}) == {r: 3, s: 2}
    # a view of r read before r's own last read does not lower it; read after, it raises it
    assert _last_uses([r, v, s], dataclasses.replace(summary), {v: (r,)})[r] == 2
    assert _last_uses([v, r, s], dataclasses.replace(summary), {v: (r,)})[r] == 2
    assert _last_uses([v, s, r], summary, {v: (s,)})[s] == 2


def _plan_summary() -> records.CallSummary:
    return records.CallSummary("f", (), [], [], [], [], 0.0, {}, ((-1,), (0,)), (((), -1),), 0, {}, (0,))


def test_planning_reuses_the_types_prepare_inferred(monkeypatch: pytest.MonkeyPatch) -> None:
    m, _ = sharded(parse_module(MLP), _tp(4), {"w1": "S(1)", "w2": "S(0)"})
    dom = PlanDomain(m, DeviceMap.default(set(_tp(4).devices), DGX.num_devices), RooflineCostModel(DGX))
    args = entry_args(m.entry)
    dom.units.prepare(m, m.entry, args)
    assert dom.units.op_types
    inferred: list[str] = []
    real = TypeDomain.op

    def counting(self: TypeDomain, op: Op, a: Sequence[Mixed]) -> Sequence[Mixed]:
        inferred.append(op.name)
        return real(self, op, a)

    monkeypatch.setattr(TypeDomain, "op", counting)
    dom.plan(m.entry, args)
    assert inferred == []  # every op's types came from prepare's pass


def test_last_uses_pair_each_root_with_its_own_argument() -> None:
    """``_last_uses`` with untracked arguments (no roots: the simulated entry's parameters) beside
    a view of two buffers: each root gets its own argument's last use."""
    from types import SimpleNamespace

    from distir.ir.values import Value
    from distir.sim.liveness import _last_uses

    a, b, c = (0, 0), (0, 1), (0, 2)
    p, v, w, x = Value("p"), Value("v"), Value("w"), Value("x")
    roots = {p: (), v: (a, b), w: (a,), x: (b,)}
    summary = SimpleNamespace(read_last=(3, 7))

    def uses(read: list[Value], s: object) -> dict[object, int]:
        lu = _last_uses(read, s, roots)  # type: ignore[arg-type]
        return {r: lu[r] for r in (a, b, c) if r in lu}

    assert uses([p, v], summary) == {a: 7, b: 7}
    summary = SimpleNamespace(read_last=(3, 7, 9))
    assert uses([w, p, x], summary) == {a: 3, b: 9}
    roots[v] = (a, c)
    assert uses([v, x, w], summary) == {a: 9, c: 3, b: 7}
