"""Every communication op: the global reference meaning, and per-rank projection run in
lock-step giving the same numbers — property tests over shapes, group sizes and attributes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import distir
from distir.interp.lockstep import check_deadlock_free, run_ranks
from distir.interp.project import project
from distir.interp.reference import run_reference
from distir.ir import Device, DType, FunctionBuilder, Module, TensorType
from distir.ops import REGISTRY
from distir.report.demo import rank_inputs

VARIADIC = ["AllReduce", "AllGather", "ReduceScatter", "MPIGather", "Reduce", "AllToAll"]
SINGLE = ["Broadcast", "Scatter"]


def _program(
    name: str, n: int, shape: tuple[int, ...], attrs: dict[str, object], uneven: list[int] | None = None
) -> Module:
    fb = FunctionBuilder("coll", REGISTRY.out_arity)
    if name in SINGLE:
        src = fb.param("x", TensorType(DType.f32, shape, Device(int(attrs.pop("src")))))  # type: ignore[arg-type]
        outs = fb.op(name, src, **attrs)
    else:
        xs = []
        for i in range(n):
            s = list(shape)
            if uneven is not None:
                s[int(attrs.get("dim", 0))] = uneven[i]  # type: ignore[call-overload]
            xs.append(fb.param(f"x{i}", TensorType(DType.f32, tuple(s), Device(i))))
        outs = fb.op(name, *xs, **attrs)
    # a local op after the collective, so ranks also compute
    outs = tuple(fb.op("Neg", o)[0] for o in outs)
    return Module((fb.ret(*outs),))


def _check(m: Module, seed: int) -> None:
    m = distir.check(m)
    rng = np.random.default_rng(seed)
    args = [rng.standard_normal(p.type.shape).astype(np.float32) for p in m.entry.params]  # type: ignore[union-attr]
    glob = run_reference(m, args)
    ranks = project(m)
    check_deadlock_free(ranks)
    per = run_ranks(ranks, rank_inputs(m, args))
    flat = [x for d in sorted(per) for x in per[d]]
    # outputs are returned per rank in device order; the global outputs are in device order too
    order = sorted(range(len(m.entry.outputs)), key=lambda i: m.entry.outputs[i].type.device)  # type: ignore[union-attr]
    for k, i in enumerate(order):
        np.testing.assert_allclose(flat[k], glob[i], rtol=1e-6)


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(VARIADIC),
    n=st.integers(2, 4),
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple),
    dim=st.integers(0, 2),
    op=st.sampled_from(["sum", "max", "min", "mean"]),
    seed=st.integers(0, 1000),
)
def test_variadic_collectives_project_exactly(
    name: str, n: int, shape: tuple[int, ...], dim: int, op: str, seed: int
) -> None:
    dim = dim % len(shape)
    attrs: dict[str, object] = {}
    if name in ("AllGather", "ReduceScatter", "MPIGather"):
        attrs["dim"] = dim
    if name in ("AllReduce", "ReduceScatter", "Reduce"):
        attrs["op"] = op
    if name in ("MPIGather", "Reduce"):
        attrs["root"] = Device(seed % n)
    if name == "AllToAll":
        attrs["split_dim"] = dim
        attrs["concat_dim"] = (dim + seed) % len(shape)
    _check(_program(name, n, shape, attrs), seed)


@settings(max_examples=20, deadline=None)
@given(
    name=st.sampled_from(SINGLE),
    n=st.integers(2, 4),
    shape=st.lists(st.integers(1, 7), min_size=1, max_size=3).map(tuple),
    seed=st.integers(0, 100),
)
def test_broadcast_and_scatter_project_exactly(name: str, n: int, shape: tuple[int, ...], seed: int) -> None:
    devices = [Device(i) for i in range(n)]
    attrs: dict[str, object] = {"devices": devices, "src": seed % n}
    if name == "Scatter":
        attrs["dim"] = seed % len(shape)
    _check(_program(name, n, shape, attrs), seed)


@settings(max_examples=20, deadline=None)
@given(sizes=st.lists(st.integers(1, 9), min_size=2, max_size=4), seed=st.integers(0, 100))
def test_allgather_uneven_shards(sizes: list[int], seed: int) -> None:
    _check(_program("AllGather", len(sizes), (3, 2), {"dim": 0}, uneven=sizes), seed)


def test_sequential_meanings() -> None:
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    b = 10 * a
    ref = {d.name: d.reference for d in REGISTRY if d.reference is not None}
    from distir.ir import Attrs

    s1, s2 = ref["AllReduce"]([a, b], Attrs({}))
    np.testing.assert_array_equal(s1, a + b)
    np.testing.assert_array_equal(s2, a + b)
    (g,) = ref["MPIGather"]([a, b], Attrs({"dim": 1, "root": Device(0)}))
    np.testing.assert_array_equal(g, np.concatenate([a, b], axis=1))
    r1, r2 = ref["ReduceScatter"]([a, b], Attrs({"dim": 0}))
    np.testing.assert_array_equal(r1, (a + b)[:2])  # 3 rows over 2: 2 and 1
    np.testing.assert_array_equal(r2, (a + b)[2:])
    x = np.arange(127, dtype=np.float32)
    c1, c2 = ref["Scatter"]([x], Attrs({"dim": 0, "devices": (Device(0), Device(1))}))
    assert (c1.shape, c2.shape) == ((64,), (63,))
    (m,) = ref["Reduce"]([a, b], Attrs({"root": Device(1), "op": "max"}))
    np.testing.assert_array_equal(m, b)
