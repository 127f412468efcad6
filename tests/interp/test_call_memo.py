"""Calls are memoized by the identity of their abstract argument types (``TypeDomain.call``,
``PlanDomain.call``); the memo is looked up before the arguments are scanned for known values,
so a call with a ``Concrete`` argument must never be served from it: each such call computes
its own known results."""

from __future__ import annotations

import numpy as np

from distir.hardware.cluster import parse_cluster
from distir.interp.loop import interpret
from distir.interp.shapes import Concrete, TypeDomain, entry_args
from distir.ir import parse_module
from distir.sim.cost import RooflineCostModel
from distir.sim.devices import DeviceMap
from distir.sim.plan import PlanDomain
from distir.sim.simulate import _program_devices

PROGRAM = """
func @f(%x: Tensor[i64, (2,), d0]) {
  %y = Add(%x, %x)
  return %y
}
func @main(%a: Tensor[i64, (2,), d0], %b: Tensor[i64, (2,), d0]) {
  %p = @f(%a)
  %q = @f(%b)
  %r = @f(%a)
  return %p, %q, %r
}
"""


def _args(m: object, known: bool) -> list[object]:
    args = entry_args(m.entry)  # type: ignore[attr-defined]
    if not known:
        return [args[0], args[0]]  # one type object for both: the second call hits the memo
    return [Concrete(args[0], np.array([1, 2])), Concrete(args[1], np.array([3, 4]))]


def _data(outs: tuple[object, ...]) -> list[list[int]]:
    return [np.asarray(o.data).tolist() for o in outs]  # type: ignore[attr-defined]


def test_type_domain_calls_with_known_arguments_are_not_memoized() -> None:
    m = parse_module(PROGRAM)
    dom = TypeDomain()
    interpret(m, m.entry, _args(m, False), dom)  # fills the memo with the abstract call
    outs, _ = interpret(m, m.entry, _args(m, True), dom)
    assert _data(outs) == [[2, 4], [6, 8], [2, 4]]


def test_plan_domain_calls_with_known_arguments_are_not_memoized() -> None:
    m = parse_module(PROGRAM)
    cl = parse_cluster("dgx2-v100")
    dom = PlanDomain(
        m, DeviceMap.default(_program_devices(m, m.entry), cl.num_devices), RooflineCostModel(cl)
    )
    dom.plan(m.entry, _args(m, False))
    plan = dom.plan(m.entry, _args(m, True))
    assert _data(plan.out_values) == [[2, 4], [6, 8], [2, 4]]
