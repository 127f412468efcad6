"""A program run as eager PyTorch (``RooflineCostModel(eager=True)``) moves an op's bytes at the HBM
fraction its eager kernel was measured at (``OpDef.eager_memory``: the normalization kernels);
other ops, fused programs and calibrated devices are unchanged. Oracle: the roofline's closed form
with the device's published bandwidth and the op's stated fraction."""

from __future__ import annotations

import dataclasses

import pytest

import distir
from distir.hardware.cluster import parse_cluster
from distir.hardware.specs import FamilyRates
from distir.ir.types import Device, DType, TensorType
from distir.ir.values import Attrs
from distir.ops.registry import EagerRate, RegistryError
from distir.sim.cost import RooflineCostModel

ROWS, HIDDEN = 8192, 4096  # memory-bound: bytes decide


def _norm_types(dtype: DType = DType.bf16) -> tuple[list[TensorType], list[TensorType]]:
    x = TensorType(dtype, (ROWS, HIDDEN), Device(0))
    w = TensorType(dtype, (HIDDEN,), Device(0))
    return [x, w, w], [TensorType(dtype, (ROWS, HIDDEN), Device(0))]


@pytest.mark.parametrize("name", ["LayerNormalization", "RMSNormalization"])
def test_eager_norms_move_their_bytes_at_their_measured_fraction(name: str) -> None:
    op = distir.REGISTRY[name]
    assert op.eager_memory is not None and 0 < op.eager_memory.memory < 0.8
    assert "Liger-Kernel" in op.eager_memory.source
    cl = parse_cluster("h100:1")
    ins, outs = _norm_types()
    if name == "RMSNormalization":
        ins = ins[:2]
    eager = RooflineCostModel(cl, fuse=False, eager=True).compute_time(op, ins, outs, Attrs({}), 0)
    plain = RooflineCostModel(cl, fuse=False).compute_time(op, ins, outs, Attrs({}), 0)
    spec = cl.device_spec(0)
    nbytes = op.bytes_read(ins, outs, Attrs({})) + op.bytes_written(ins, outs, Attrs({}))
    assert eager == pytest.approx(
        spec.launch_overhead_s + nbytes / (spec.memory_bandwidth * op.eager_memory.memory)
    )
    assert plain == pytest.approx(spec.launch_overhead_s + nbytes / (spec.memory_bandwidth * 0.8))
    assert eager > plain


def test_ops_without_a_measured_eager_kernel_keep_the_default() -> None:
    op = distir.REGISTRY["Add"]
    assert op.eager_memory is None
    cl = parse_cluster("h100:1")
    x = TensorType(DType.bf16, (ROWS, HIDDEN), Device(0))
    eager = RooflineCostModel(cl, fuse=False, eager=True).compute_time(op, [x, x], [x], Attrs({}), 0)
    assert eager == pytest.approx(
        RooflineCostModel(cl, fuse=False).compute_time(op, [x, x], [x], Attrs({}), 0)
    )


def test_a_calibrated_class_rate_comes_first() -> None:
    """A device calibrated by ``distir calibrate`` measured its own rates: the eager figure of a
    benchmark on another GPU does not replace them."""
    op = distir.REGISTRY["LayerNormalization"]
    cl = parse_cluster("h100:1")
    spec = cl.device_spec(0)
    rates = FamilyRates(flop=0.5, memory=0.9, launch_s=1e-5)
    spec2 = dataclasses.replace(spec, families=((op.cost_class, rates),))
    cl2 = dataclasses.replace(cl, nodes=tuple(dataclasses.replace(n, device=spec2) for n in cl.nodes))
    ins, outs = _norm_types()
    t = RooflineCostModel(cl2, fuse=False, eager=True).compute_time(op, ins, outs, Attrs({}), 0)
    nbytes = op.bytes_read(ins, outs, Attrs({})) + op.bytes_written(ins, outs, Attrs({}))
    assert t == pytest.approx(1e-5 + nbytes / (spec.memory_bandwidth * 0.9))


def test_an_eager_fraction_outside_0_1_is_refused() -> None:
    op = distir.REGISTRY["LayerNormalization"]
    with pytest.raises(RegistryError, match="eager_memory"):
        dataclasses.replace(op, name="Probe", eager_memory=EagerRate(1.5, "x"))
