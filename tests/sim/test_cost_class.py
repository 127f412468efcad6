"""The cost model prices an op by the cost class it declares (``OpDef.cost_class``), not by the
name of its family: the flat roofline efficiency and a calibrated device's measured rates are
looked up by class. Oracle: the roofline's closed form with the device's published figures."""

from __future__ import annotations

import dataclasses

import pytest

import distir
from distir.hardware.cluster import Cluster, parse_cluster
from distir.hardware.specs import FamilyRates
from distir.ir.types import Device, DType, TensorType
from distir.ir.values import Attrs
from distir.ops.registry import CostClass, OpDef, TypeCtx
from distir.sim.cost import DEFAULT_FLOP_EFFICIENCY, RooflineCostModel

M, N, K = 4096, 4096, 4096  # compute-bound on any GPU: FLOPs decide


def _matmul_like(family: str, cost_class: CostClass) -> OpDef:
    """MatMul's cost descriptors without its GEMM curve, under another family and class."""
    mm = distir.REGISTRY["MatMul"]
    return dataclasses.replace(mm, name="CostProbe", family=family, cost_class=cost_class, gemm=None)


def _types() -> tuple[list[TensorType], list[TensorType]]:
    a = TensorType(DType.f32, (M, K), Device(0))
    b = TensorType(DType.f32, (K, N), Device(0))
    return [a, b], [TensorType(DType.f32, (M, N), Device(0))]


@pytest.mark.parametrize(
    "family,cost_class", [("shape", CostClass.LINALG), ("linalg", CostClass.ELEMENTWISE)]
)
def test_the_flat_efficiency_is_the_cost_class_s(family: str, cost_class: CostClass) -> None:
    cl = parse_cluster("dgx-a100:1")
    spec = cl.device_spec(0)
    ins, outs = _types()
    t = RooflineCostModel(cl).compute_time(_matmul_like(family, cost_class), ins, outs, Attrs({}), 0)
    eff = DEFAULT_FLOP_EFFICIENCY[cost_class]
    assert t == pytest.approx(spec.launch_overhead_s + 2 * M * N * K / (spec.peak_flops(DType.f32) * eff))


def test_calibrated_rates_are_looked_up_by_cost_class() -> None:
    base = parse_cluster("dgx-a100:1")
    node = base.nodes[0]
    rates = FamilyRates(flop=0.2, memory=0.5, launch_s=1e-5)
    dev = dataclasses.replace(node.device, name="a100-cal", families=(("linalg", rates),))
    cl = Cluster("cal", (dataclasses.replace(node, device=dev),), inter_node=base.inter_node)
    ins, outs = _types()
    cost = RooflineCostModel(cl)
    probe = _matmul_like("shape", CostClass.LINALG)
    want = 1e-5 + 2 * M * N * K / (dev.peak_flops(DType.f32) * 0.2)
    assert cost.compute_time(probe, ins, outs, Attrs({}), 0) == pytest.approx(want)
    other = _matmul_like("linalg", CostClass.SHAPE)  # the family's name no longer picks the rates
    assert cost.compute_time(other, ins, outs, Attrs({}), 0) != pytest.approx(want)


def test_every_op_declares_a_cost_class() -> None:
    assert all(isinstance(d.cost_class, CostClass) for d in distir.REGISTRY)

    def rule(ctx: TypeCtx) -> list[TensorType]:
        return [ctx.tensor(0)]

    with pytest.raises(TypeError, match="cost_class"):
        OpDef(name="NoClass", family="test", inputs=("x",), outputs=("y",), infer=rule)  # type: ignore[call-arg]


def test_an_op_calibrated_on_its_own_takes_its_own_rates_before_its_class_s() -> None:
    base = parse_cluster("dgx-a100:1")
    node = base.nodes[0]
    mine, cls = (
        FamilyRates(flop=0.1, memory=0.5, launch_s=2e-5),
        FamilyRates(flop=0.2, memory=0.5, launch_s=1e-5),
    )
    dev = dataclasses.replace(node.device, name="a100-cal", families=(("linalg", cls), ("CostProbe", mine)))
    cl = Cluster("cal", (dataclasses.replace(node, device=dev),), inter_node=base.inter_node)
    ins, outs = _types()
    cost = RooflineCostModel(cl)
    probe = _matmul_like("linalg", CostClass.LINALG)  # named CostProbe
    flops = 2 * M * N * K / dev.peak_flops(DType.f32)
    assert cost.compute_time(probe, ins, outs, Attrs({}), 0) == pytest.approx(2e-5 + flops / 0.1)
    sibling = dataclasses.replace(probe, name="OtherProbe")  # same class, not calibrated on its own
    assert cost.compute_time(sibling, ins, outs, Attrs({}), 0) == pytest.approx(1e-5 + flops / 0.2)
