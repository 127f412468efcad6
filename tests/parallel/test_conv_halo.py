"""Spatial sharding of sliding-window ops with halo exchange by Send (the RFC's Example 2)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import distir
from distir.ir import Device, Mesh, parse_module

from .helpers import compare, sharded

MESH2 = Mesh((("x", 2),), (Device(0), Device(1)))

RFC_EXAMPLE_2 = """func @c(%a: Tensor[f32, (1, 3, 5, 3), d0], %w: Tensor[f32, (10, 3, 3, 3), d0]) {
  %r = Conv(%a, %w, pads=[1, 1, 1, 1])
  return %r
}
"""


def test_rfc_example2_exchanges_one_halo_row_each_way() -> None:
    # the result stays sharded like the input (results are replicated unless annotated)
    _legal, mat = sharded(parse_module(RFC_EXAMPLE_2), MESH2, {"a": "S(2)", "r": "S(2)"})
    ops = [i.name for i in mat.entry.ops()]
    assert ops.count("Send") == 2 and not {"AllGather", "AllReduce"} & set(ops)
    sends = [i for i in mat.entry.ops() if i.name == "Send"]
    # rows 0..2 on d0 and 3..4 on d1; each side needs one neighbouring row
    assert all(i.outputs[0].type.shape == (1, 3, 1, 3) for i in sends)  # type: ignore[union-attr]
    convs = [i for i in mat.entry.ops() if i.name == "Conv"]
    assert [c.attrs["pads"] for c in convs] == [(1, 1, 0, 1), (0, 1, 1, 1)]
    assert compare(parse_module(RFC_EXAMPLE_2), MESH2, {"a": "S(2)", "r": "S(2)"}) < 1e-5


@settings(max_examples=25, deadline=None)
@given(
    h=st.integers(4, 12),
    k=st.integers(1, 3),
    stride=st.integers(1, 2),
    pad=st.integers(0, 2),
    dil=st.integers(1, 2),
    n=st.integers(2, 3),
    pool=st.sampled_from(["none", "MaxPool", "AveragePool"]),
    seed=st.integers(0, 50),
)
def test_spatially_sharded_conv_matches_unsharded(
    h: int, k: int, stride: int, pad: int, dil: int, n: int, pool: str, seed: int
) -> None:
    extent = dil * (k - 1) + 1
    out_h = (h + 2 * pad - extent) // stride + 1
    if out_h < n or h + 2 * pad < extent or pad >= extent:
        return
    pool_line = ""
    result = "%y"
    if pool != "none" and out_h >= n + 1:
        pool_line = f"  %z = {pool}(%y, kernel_shape=[2, 1], strides=[1, 1])\n"
        result = "%z"
    src = f"""func @c(%x: Tensor[f32, (2, 2, {h}, 3), d0], %w: Tensor[f32, (3, 2, {k}, 1), d0]) {{
  %y = Conv(%x, %w, strides=[{stride}, 1], pads=[{pad}, 0, {pad}, 0], dilations=[{dil}, 1])
{pool_line}  return {result}
}}
"""
    mesh = Mesh((("x", n),), tuple(Device(i) for i in range(n)))
    m = distir.check(parse_module(src))
    assert compare(m, mesh, {"x": "S(2)", result[1:]: "S(2)"}, seed) < 1e-5
