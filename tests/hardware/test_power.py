"""A GPU's compute rate at its power limit (specs.PowerProfile, DeviceSpec.compute_fraction):
the published points, linear between them, no extrapolation; the cluster file's ``power`` table
and its errors; the cost model scaling compute-bound work, not memory-bound work; ``distir
clusters`` stating it."""

from __future__ import annotations

import dataclasses

import pytest

from distir.hardware.cluster import Cluster, cluster_from_toml, parse_cluster
from distir.hardware.presets import clusters_json, render_clusters_table
from distir.hardware.specs import ClusterError, PowerProfile, SpecError
from distir.ir.types import Device, DType, TensorType
from distir.ir.values import Attrs
from distir.ops.elementwise import ADD
from distir.ops.linalg import MATMUL
from distir.sim.cost import RooflineCostModel

# Ujeniya et al. 2026 (arXiv:2604.11391v2), Fig. 6b: average SM clock (MHz) of an H100 HBM2e
# by power cap (W), as bench/clusters/grand-teton-h100.toml cites them
CLOCKS = ((200.0, 625.0), (300.0, 1132.0), (400.0, 1501.0), (500.0, 1731.0), (600.0, 1889.0), (700.0, 1969.0))


def _profile(limit: float = 500.0, reference: float = 700.0) -> PowerProfile:
    return PowerProfile(limit_w=limit, reference_w=reference, curve=CLOCKS, source="test")


def test_the_rate_passes_through_every_published_point() -> None:
    p = _profile()
    for watts, mhz in CLOCKS:
        assert p.rate(watts) == mhz


def test_between_points_the_rate_is_linear_in_watts() -> None:
    # halfway between 400 W (1501 MHz) and 500 W (1731 MHz); a quarter of the way from 600 to 700
    assert _profile().rate(450.0) == pytest.approx((1501 + 1731) / 2)
    assert _profile().rate(625.0) == pytest.approx(1889 + 0.25 * (1969 - 1889))


def test_the_compute_fraction_is_the_rate_at_the_limit_over_the_reference() -> None:
    assert _profile().compute_fraction == pytest.approx(1731 / 1969)
    assert _profile(700.0).compute_fraction == 1.0
    assert _profile(300.0, 600.0).compute_fraction == pytest.approx(1132 / 1889)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"limit_w": 800.0}, "limit_w must lie within the measured powers"),
        ({"reference_w": 150.0}, "reference_w must lie within the measured powers"),
        ({"limit_w": -1.0}, "limit_w must be a positive"),
        ({"curve": ((500.0, 1.0),)}, "two or more"),
        ({"curve": ((500.0, 1.0), (400.0, 2.0))}, "sorted by power"),
        ({"curve": ((400.0, 1.0), (700.0, 0.0))}, "positive numbers"),
    ],
)
def test_a_bad_power_profile_is_a_spec_error(kwargs: dict[str, object], message: str) -> None:
    fields = {"limit_w": 500.0, "reference_w": 700.0, "curve": CLOCKS, "source": ""} | kwargs
    with pytest.raises(SpecError, match=message):
        PowerProfile(**fields)  # type: ignore[arg-type]


def _file(power: str) -> str:
    return f'[types.x]\npreset = "h100"\n[types.x.power]\n{power}\n[[nodes]]\ntype = "x"\n'


def test_the_cluster_file_power_table_is_parsed() -> None:
    text = _file('limit_w = 500\nreference_w = 700\ncurve = [[400, 1501], [700, 1969]]\nsource = "paper"')
    dev = cluster_from_toml(text).nodes[0].device
    assert dev.power == PowerProfile(500.0, 700.0, ((400.0, 1501.0), (700.0, 1969.0)), "paper")
    assert dev.compute_fraction == pytest.approx((1501 + (1969 - 1501) / 3) / 1969)
    assert dev.name != parse_cluster("h100").nodes[0].device.name  # other figures, another name


@pytest.mark.parametrize(
    ("power", "key", "message"),
    [
        ("limit_w = 500\nreference_w = 700", "power.curve", "missing required key"),
        ("limit_w = 900\nreference_w = 700\ncurve = [[400, 1], [700, 2]]", "power", "within the measured"),
        ("limit_w = 500\nreference_w = 700\ncurve = [[400, 1]]", "power.curve", "two or more"),
        ("limit_w = 0\nreference_w = 700\ncurve = [[400, 1], [700, 2]]", "power.limit_w", "positive number"),
        (
            "limit_w = 500\nreference_w = 700\ncurve = [[400, 1], [700, 2]]\nwatts = 1",
            "power.watts",
            "unknown",
        ),
    ],
)
def test_a_bad_power_table_is_a_one_line_cluster_error(power: str, key: str, message: str) -> None:
    with pytest.raises(ClusterError, match=message) as e:
        cluster_from_toml(_file(power), "c.toml")
    assert f"types.x.{key}" in str(e.value)
    assert str(e.value).startswith("c.toml:") and "\n" not in str(e.value)


def _capped_h100(fraction_limit: float) -> Cluster:
    base = parse_cluster("h100")
    node = base.nodes[0]
    dev = dataclasses.replace(node.device, name="h100-capped", power=_profile(fraction_limit))
    return Cluster("capped", (dataclasses.replace(node, device=dev),), inter_node=base.inter_node)


def test_the_cost_model_slows_compute_bound_work_by_the_fraction() -> None:
    t = TensorType(DType.bf16, (8192, 8192), Device(0))
    matmul = MATMUL
    full = RooflineCostModel(parse_cluster("h100"))
    capped = RooflineCostModel(_capped_h100(500.0))
    launch = full.cluster.device_spec(0).launch_overhead_s
    t_full = full.compute_time(matmul, [t, t], [t], Attrs({}), 0) - launch
    t_capped = capped.compute_time(matmul, [t, t], [t], Attrs({}), 0) - launch
    assert t_capped == pytest.approx(t_full * 1969 / 1731, rel=1e-12)


def test_memory_bound_work_keeps_its_time() -> None:
    x = TensorType(DType.bf16, (8192, 8192), Device(0))
    add = ADD
    full = RooflineCostModel(parse_cluster("h100")).compute_time(add, [x, x], [x], Attrs({}), 0)
    capped = RooflineCostModel(_capped_h100(500.0)).compute_time(add, [x, x], [x], Attrs({}), 0)
    assert capped == full


def test_distir_clusters_states_the_limit_and_its_source() -> None:
    cl = _capped_h100(500.0)
    rec = clusters_json(cl)["clusters"][0]
    assert rec["power"] == {
        "limit_w": 500.0,
        "reference_w": 700.0,
        "curve": [list(p) for p in CLOCKS],
        "source": "test",
    }
    caption = str(render_clusters_table(cl).caption)
    assert "power: 500 W of the 700 W" in caption and f"{100 * 1731 / 1969:.1f}%" in caption
